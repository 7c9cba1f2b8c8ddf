//! The web editor's pages, served to plain `GET`s and `HEAD`s: compiled into the binary when
//! `web/dist` was built before it (`web/build.sh`), so `quire serve` serves them from any
//! directory; or read from `--web-root` when that is set, which then replaces them.

use axum::http::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rust_embed::Embed;
use tower::ServiceExt;
use tower_http::services::ServeDir;

/// The built pages, compiled in (empty when `web/dist` was not built).
#[derive(Embed)]
#[folder = "../web/dist/"]
#[allow_missing = true]
struct Built;

/// The page at the request's path, if there is one: from `root` when set, else compiled in.
/// `/` without an index page says how to build one. `None`: not a page (a document request).
pub(super) async fn serve(root: Option<&std::path::Path>, req: Request<()>) -> Option<Response> {
    let path = req.uri().path();
    match root {
        Some(root) => from_root(root, req).await,
        None => match embedded::<Built>(path, req.headers()) {
            Some(page) => Some(page),
            None if path == "/" => Some(not_built("this binary was built without them")),
            None => None,
        },
    }
}

/// A page from `root` (the `--web-root` directory).
async fn from_root(root: &std::path::Path, req: Request<()>) -> Option<Response> {
    let path = req.uri().path();
    if path == "/" && !root.join("index.html").is_file() {
        return Some(not_built(&format!("no {}/index.html", root.display())));
    }
    if path != "/" && plain(path).is_none_or(|file| !root.join(file).is_file()) {
        return None;
    }
    // ServeDir answers GET and HEAD, with the content type, Last-Modified and ranges.
    let req = req.map(|()| axum::body::Body::empty());
    match ServeDir::new(root).oneshot(req).await {
        Ok(response) => Some(response.into_response()),
        Err(never) => match never {},
    }
}

/// A compiled-in page of `E` at a URL path, with its content type and an ETag of its hash;
/// 304 without a body when the request's `If-None-Match` names that ETag.
fn embedded<E: Embed>(url_path: &str, request: &HeaderMap) -> Option<Response> {
    let file = if url_path == "/" {
        "index.html".to_owned()
    } else {
        plain(url_path)?
    };
    let page = E::get(&file)?;
    let etag = page
        .metadata
        .sha256_hash()
        .iter()
        .take(16)
        .fold(String::from("\""), |s, b| s + &format!("{b:02x}"))
        + "\"";
    let fresh = request
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|tag| matches!(tag.trim(), "*") || tag.trim().trim_start_matches("W/") == etag);
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        // Compiled in, the bytes are static: sent without a copy.
        let body = match page.data {
            std::borrow::Cow::Borrowed(bytes) => bytes::Bytes::from_static(bytes),
            std::borrow::Cow::Owned(bytes) => bytes::Bytes::from(bytes),
        };
        (StatusCode::OK, body).into_response()
    };
    let headers = response.headers_mut();
    if let Ok(mime) = HeaderValue::from_str(page.metadata.mimetype()) {
        headers.insert(header::CONTENT_TYPE, mime);
    }
    if let Ok(etag) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, etag);
    }
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(response)
}

/// The relative file a URL path names, if it is made of plain segments only (no `..`, no
/// empty or hidden ones, no backslash or NUL, each at most 255 bytes): nothing outside the
/// pages is ever looked at.
fn plain(url_path: &str) -> Option<String> {
    let decoded = percent_encoding::percent_decode_str(url_path)
        .decode_utf8()
        .ok()?;
    let relative = decoded.trim_start_matches('/');
    let ok = relative.split('/').all(|segment| {
        !segment.is_empty()
            && !segment.starts_with('.')
            && segment.len() <= 255
            && !segment.contains(['\\', '\0'])
    });
    ok.then(|| relative.to_owned())
}

/// `/` when there is no editor to serve: what to do about it.
fn not_built(why: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        format!(
            "Quire is running. The web editor is not built ({why}): run web/build.sh and \
             rebuild, or point --web-root at its output.\n"
        ),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages compiled in from a fixture folder, as `web/dist` is.
    #[derive(Embed)]
    #[folder = "tests/fixtures/pages/"]
    struct Fixture;

    async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        String::from_utf8(bytes.to_vec()).expect("utf-8")
    }

    #[tokio::test]
    async fn compiled_in_pages_are_served_with_their_types_and_nothing_else() {
        let index = embedded::<Fixture>("/", &HeaderMap::new()).expect("index");
        assert_eq!(index.headers()[header::CONTENT_TYPE], "text/html");
        let etag = index.headers()[header::ETAG].clone();
        assert_eq!(body(index).await, "<title>fixture</title>\n");
        // Revalidation: the same ETag gets 304 and no body; another gets the page.
        let mut asking = HeaderMap::new();
        asking.insert(header::IF_NONE_MATCH, etag);
        let again = embedded::<Fixture>("/", &asking).expect("index");
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        assert_eq!(body(again).await, "");
        asking.insert(header::IF_NONE_MATCH, HeaderValue::from_static("\"other\""));
        let changed = embedded::<Fixture>("/", &asking).expect("index");
        assert_eq!(changed.status(), StatusCode::OK);
        let script = embedded::<Fixture>("/assets/app.js", &HeaderMap::new()).expect("script");
        assert_eq!(script.headers()[header::CONTENT_TYPE], "text/javascript");
        assert_eq!(body(script).await, "console.log(1)\n");
        for path in [
            "/nothing.js",
            "/assets/../index.html",
            "/%2E%2E/Cargo.toml",
            "/assets/",
            "/.hidden",
        ] {
            assert!(
                embedded::<Fixture>(path, &HeaderMap::new()).is_none(),
                "{path}"
            );
        }
    }
}
