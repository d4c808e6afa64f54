//! The web UI: a chat page at `/` with its script and stylesheet at `/ui/app.js` and `/ui/style.css`, embedded in the
//! binary (`webui/`), working offline (no CDN, nothing fetched from elsewhere: the Content-Security-Policy allows this
//! server only). The page talks to `/v1/chat/completions`, `/v1/models` and `/status` like any client, so it needs
//! the API key when the server has one (it asks on a 401). `ServerConfig::webui = false` (`--no-webui`) leaves only
//! the short text page of `admin::index` at `/`.

use axum::http::header;
use axum::response::{IntoResponse, Response};

pub const INDEX_HTML: &str = include_str!("../webui/index.html");
pub const APP_JS: &str = include_str!("../webui/app.js");
pub const STYLE_CSS: &str = include_str!("../webui/style.css");

/// Paths served without the API key (the page must load to ask for it).
pub const PUBLIC_ASSETS: [&str; 2] = ["/ui/app.js", "/ui/style.css"];

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
                   base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

pub async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

pub async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_refers_only_to_its_own_assets() {
        for asset in PUBLIC_ASSETS {
            assert!(INDEX_HTML.contains(asset), "{asset} linked from the page");
        }
        for text in [INDEX_HTML, APP_JS, STYLE_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://cdn"), "no remote resources");
            assert!(!text.contains("<script>") && !text.contains("onclick=\""), "no inline script (CSP)");
        }
        // The API paths the script uses exist in the router.
        for path in ["/v1/chat/completions", "/v1/models", "/status"] {
            assert!(APP_JS.contains(&format!("\"{path}\"")), "{path}");
        }
    }
}
