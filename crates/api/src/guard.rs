//! Checks at the door, before any handler: the DNS-rebinding guard (the `Host` header must name a loopback address,
//! the bound address or an `--allowed-host`; a browser's `Origin` must name the same host and port), the body's type
//! (a POST must declare `Content-Type: application/json`, or send no type and no `Origin`, as SDKs and curl without
//! `-d` do) and the API key (`Authorization: Bearer KEY` or `x-api-key: KEY`; `/`, the web UI's assets, `/health`
//! and `/ready` stay open). Refusals are rendered in the shape of the protocol the path belongs to.
//!
//! The port and type checks close a hole a key-less server would otherwise have: a page on another localhost port
//! may POST `text/plain` (or a form) to us without a CORS preflight; it is now refused before it reaches a handler.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
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
    if request.method() == Method::POST
        && let Err(e) = check_json_body(request.headers())
    {
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

/// The explicit port of a `Host` header or an origin's authority: `localhost:8000` → 8000, `[::1]` → none.
fn port_of(authority: &str) -> Option<u16> {
    let rest = authority.strip_prefix(host_name(authority))?;
    rest.strip_prefix(':').and_then(|p| p.parse().ok())
}

/// Whether the origin `scheme://authority` is the server the `Host` header names: same host and port. An origin
/// without a port has its scheme's (80, 443); a `Host` without one (a proxy in front) accepts only such an origin.
fn same_origin(scheme: &str, origin_authority: &str, host_header: &str) -> bool {
    if !host_name(origin_authority).eq_ignore_ascii_case(host_name(host_header)) {
        return false;
    }
    let origin_port = port_of(origin_authority);
    match port_of(host_header) {
        None => origin_port.is_none(),
        Some(port) => {
            let default = match scheme.to_ascii_lowercase().as_str() {
                "http" => Some(80),
                "https" => Some(443),
                _ => None,
            };
            origin_port.or(default) == Some(port)
        }
    }
}

/// A POST body must be declared JSON; a request with no `Content-Type` passes only without an `Origin` (no browser
/// sends a body that way across origins without a preflight, and SDKs and scripts send no `Origin`).
fn check_json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        if headers.contains_key(header::ORIGIN) {
            return Err(ApiError::new(
                ErrorKind::UnsupportedMediaType,
                "The request body must be sent with 'Content-Type: application/json'.",
            )
            .with_code("unsupported_media_type"));
        }
        return Ok(());
    };
    let text = value.to_str().unwrap_or("");
    let media = text.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if media == "application/json" || (media.starts_with("application/") && media.ends_with("+json")) {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::UnsupportedMediaType,
        format!("The request body must be JSON, sent with 'Content-Type: application/json'; got '{text}'."),
    )
    .with_code("unsupported_media_type"))
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
    let host_header = match headers.get(header::HOST).map(|v| v.to_str()) {
        // HTTP/1.0 clients and in-process callers send none; browsers always do.
        None => None,
        Some(Ok(h)) => Some(h),
        Some(Err(_)) => return Err(forbidden("The Host header is not valid text.".into())),
    };
    let host = host_header.map(host_name);
    if let Some(host) = host
        && !host_allowed(state, host)
    {
        return Err(forbidden(format!(
            "Host '{host}' is not allowed. Connect through localhost, or start the server with --allowed-host {host}."
        )));
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let parts = origin.split_once("://").map(|(scheme, rest)| (scheme, rest.trim_end_matches('/')));
        let ok = match (parts, host_header) {
            (Some((scheme, authority)), Some(h)) => same_origin(scheme, authority, h),
            (Some((_, authority)), None) => host_allowed(state, host_name(authority)),
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
        assert_eq!(
            (port_of("localhost:8000"), port_of("[::1]:80"), port_of("[::1]"), port_of("h")),
            (Some(8000), Some(80), None, None)
        );
    }

    #[test]
    fn an_origin_must_name_the_same_host_and_port() {
        assert!(same_origin("http", "localhost:8000", "localhost:8000"));
        assert!(same_origin("http", "LOCALHOST:8000", "localhost:8000"));
        assert!(same_origin("http", "[::1]:8000", "[::1]:8000"));
        assert!(same_origin("http", "localhost", "localhost:80"));
        assert!(same_origin("https", "splash.example", "splash.example"));
        assert!(!same_origin("http", "localhost:3000", "localhost:8000"));
        assert!(!same_origin("http", "localhost", "localhost:8000"));
        assert!(!same_origin("https", "localhost", "localhost:80"));
        assert!(!same_origin("http", "localhost:8000", "localhost"));
        assert!(!same_origin("http", "127.0.0.1:8000", "localhost:8000"));
    }

    #[test]
    fn a_post_body_must_be_declared_json() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        for ok in [
            &[("content-type", "application/json")][..],
            &[("content-type", "application/json; charset=utf-8"), ("origin", "http://localhost:8000")],
            &[("content-type", "Application/JSON")],
            &[("content-type", "application/vnd.api+json")],
            &[],
        ] {
            assert!(check_json_body(&headers(ok)).is_ok(), "{ok:?}");
        }
        for bad in [
            &[("content-type", "text/plain;charset=UTF-8")][..],
            &[("content-type", "application/x-www-form-urlencoded")],
            &[("content-type", "multipart/form-data; boundary=x")],
            &[("origin", "http://localhost:3000")],
        ] {
            let e = check_json_body(&headers(bad)).unwrap_err();
            assert_eq!(e.status().as_u16(), 415, "{bad:?}");
        }
    }
}
