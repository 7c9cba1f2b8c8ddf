//! The dashboard's page, compiled into the binary (`page/`): plain HTML, CSS and one script,
//! no build step and nothing fetched from elsewhere, so `/admin` works wherever the binary
//! runs. The headers forbid framing, inline scripts and any connection but to this server.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/admin.js");
const STYLE: &str = include_str!("page/admin.css");

/// Content Security Policy of the page: its own script and style only, data URLs for the
/// screenshot-free icons, connections to this origin only, never in a frame.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn serve(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The page's file at a URL path (`/admin`, `/admin/`, `/admin/admin.js`,
/// `/admin/admin.css`), if it is one.
pub fn file(path: &str) -> Option<Response> {
    Some(match path {
        "/admin" | "/admin/" => serve("text/html; charset=utf-8", INDEX),
        "/admin/admin.js" => serve("text/javascript; charset=utf-8", SCRIPT),
        "/admin/admin.css" => serve("text/css; charset=utf-8", STYLE),
        _ => return None,
    })
}
