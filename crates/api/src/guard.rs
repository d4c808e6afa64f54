//! Checks at the door, before any handler: the DNS-rebinding guard (the `Host` header must name a loopback address,
//! the bound address or an `--allowed-host`; a browser's `Origin` must name the same host) and the API key
//! (`Authorization: Bearer KEY` or `x-api-key: KEY`; `/`, the web UI's assets, `/health` and `/ready` stay open). Refusals are rendered in
//! the shape of the protocol the path belongs to.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;

use crate::error::{ApiError, ErrorKind};
use crate::{AppState, error_response};

/// Routes that stay open when a key is set.
const PUBLIC_PATHS: [&str; 3] = ["/", "/health", "/ready"];
/// Host names that are always accepted.
const LOOPBACK_HOSTS: [&str; 4] = ["localhost", "127.0.0.1", "::1", "[::1]"];

pub async fn check(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if let Err(e) = check_host(&state, request.headers()) {
        return error_response(&path, e);
    }
    if let Some(key) = state.config.api_key.as_deref()
        && !PUBLIC_PATHS.contains(&path.as_str())
        && !(state.config.webui && crate::webui::PUBLIC_ASSETS.contains(&path.as_str()))
        && !presented_key(request.headers()).is_some_and(|k| same(k, key))
    {
        let e = ApiError::new(
            ErrorKind::Authentication,
            "Missing or incorrect API key. Send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'.",
        )
        .with_code("invalid_api_key");
        return error_response(&path, e);
    }
    next.run(request).await
}

/// The host part of a `Host` header or an origin's authority: `[::1]:8000` → `[::1]`, `localhost:80` → `localhost`.
fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |i| &authority[..=i]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.contains(':') => host,
        _ => authority,
    }
}

fn host_allowed(state: &AppState, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    LOOPBACK_HOSTS.contains(&host.as_str())
        || state
            .config
            .allowed_hosts
            .iter()
            .any(|h| *h == "*" || h.trim_matches(['[', ']']) == host.trim_matches(['[', ']']))
}

fn check_host(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let forbidden = |message: String| ApiError::new(ErrorKind::Forbidden, message).with_code("host_not_allowed");
    let host = match headers.get(header::HOST).map(|v| v.to_str()) {
        // HTTP/1.0 clients and in-process callers send none; browsers always do.
        None => None,
        Some(Ok(h)) => Some(host_name(h)),
        Some(Err(_)) => return Err(forbidden("The Host header is not valid text.".into())),
    };
    if let Some(host) = host
        && !host_allowed(state, host)
    {
        return Err(forbidden(format!(
            "Host '{host}' is not allowed. Connect through localhost, or start the server with --allowed-host {host}."
        )));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let origin_host = origin.split_once("://").map(|(_, rest)| host_name(rest.trim_end_matches('/')));
        let ok = match (origin_host, host) {
            (Some(o), Some(h)) => o.eq_ignore_ascii_case(h),
            (Some(o), None) => host_allowed(state, o),
            (None, _) => false,
        };
        if !ok {
            return Err(forbidden(format!("Requests from the web page at '{origin}' are not allowed.")));
        }
    }
    Ok(())
}

fn presented_key(headers: &HeaderMap) -> Option<&str> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim))
}

/// Compares without an early exit, so timing tells nothing about the key.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert_eq!(host_name("localhost:8000"), "localhost");
        assert_eq!(host_name("[::1]:8000"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("example.com"), "example.com");
        assert_eq!(host_name("::1"), "::1");
        assert!(same("abc", "abc") && !same("abc", "abd") && !same("abc", "ab"));
    }
}
