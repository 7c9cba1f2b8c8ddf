//! HTTP routes: health, readiness, metrics, the REST API under `/api/v1`, and the WebSocket
//! entry point for documents (every other path).

mod access;
mod admin;
pub mod api;
mod branches;
mod content;
mod docs;
mod edits;
mod extract;
mod history;
mod idempotency;
mod listen;
pub mod owner;
mod pages;
mod reads;
mod shared;
mod tokens;

use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use crate::problem::{problem, too_many, ApiError};
pub use listen::serve;
pub use shared::doc_path;

use crate::app::AppState;
use crate::auth::bearer;
use crate::auth::{AuthError, Principal};

pub fn router(app: AppState) -> Router {
    let api = api::routes(&app)
        .fallback(|| async {
            ApiError::new(StatusCode::NOT_FOUND, "not-found", "no such API route")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "this route does not take that method",
            )
        })
        .layer(middleware::from_fn_with_state(
            app.clone(),
            idempotency::idempotency,
        ))
        .layer(middleware::from_fn(reject_nul))
        .layer(middleware::from_fn_with_state(app.clone(), authenticate));
    Router::new()
        .route("/healthz", get(healthz))
        .route("/hocuspocus", get(crate::socket::hocuspocus::socket))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/admin", get(admin_page))
        .route("/admin/", get(admin_page))
        .route("/admin/{file}", get(admin_page))
        .nest("/api/v1", api)
        .fallback(web_or_document)
        .with_state(app)
}

/// Every other path: a WebSocket upgrade opens the document the path names; a plain `GET` or
/// `HEAD` gets the web editor's file at that path (`pages`; `/` is its index page), and
/// anything else is answered like a document request (a bad name gets 400).
async fn web_or_document(State(app): State<AppState>, req: Request) -> Response {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let read = matches!(*req.method(), Method::GET | Method::HEAD);
    if !upgrade && read {
        // The request's head only: a body would make this future not `Send`.
        let mut head = Request::new(());
        *head.method_mut() = req.method().clone();
        *head.uri_mut() = req.uri().clone();
        *head.headers_mut() = req.headers().clone();
        if let Some(page) = pages::serve(app.config.web_root.as_deref(), head).await {
            return page;
        }
    }
    axum::handler::Handler::call(crate::socket::ws::accept, req, app).await
}

/// `GET /admin` and its files: the dashboard's page, compiled into the binary. A WebSocket
/// upgrade, or a path that is none of the page's files, is any other path's request, so a
/// document named `admin` (or `admin/...`) opens as before.
async fn admin_page(State(app): State<AppState>, req: Request) -> Response {
    let upgrade = req.headers().contains_key(header::UPGRADE);
    match crate::admin::page::file(req.uri().path()) {
        Some(page) if !upgrade => page,
        _ => web_or_document(State(app), req).await,
    }
}

/// Largest request body the API reads, JSON or a Yjs update (axum's default limit for its
/// extractors); every layer that buffers a body stops there too.
pub(crate) const MAX_REQUEST_BODY: usize = 2 << 20;

/// Refuses text containing U+0000 anywhere in an API request (query string or JSON body)
/// with 400: PostgreSQL cannot store it in a text column, and both backends must accept and
/// refuse the same things.
async fn reject_nul(req: axum::extract::Request, next: middleware::Next) -> Response {
    let nul = || {
        ApiError::bad_request(
            "invalid-text",
            "text must not contain the NUL character (U+0000)",
        )
        .into_response()
    };
    let query_has_nul = req
        .uri()
        .query()
        .is_some_and(|q| q.to_ascii_lowercase().contains("%00"));
    if query_has_nul || req.uri().path().contains("%00") {
        return nul();
    }
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            let ct = ct.to_ascii_lowercase();
            ct.starts_with("application/json") || ct.contains("+json")
        });
    if !is_json {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_REQUEST_BODY).await {
        Ok(bytes) => bytes,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "the request body is too large or could not be read",
            )
            .into_response()
        }
    };
    if json_has_nul_escape(&bytes) {
        return nul();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

/// True if a JSON text holds the escape `\u0000` (JSON writes U+0000 only that way: a raw NUL
/// byte is not valid JSON). A backslash counts as an escape only after an even number of
/// backslashes, so an escaped backslash followed by `u0000` is not one.
fn json_has_nul_escape(bytes: &[u8]) -> bool {
    bytes.windows(6).enumerate().any(|(i, w)| {
        w[0] == b'\\'
            && w[1] == b'u'
            && &w[2..] == b"0000"
            && bytes[..i].iter().rev().take_while(|b| **b == b'\\').count() % 2 == 0
    })
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready when the database answers within `storage_timeout` and no room is stalled on a
/// failing append; otherwise 503 with the reason (the load balancer sends new clients
/// elsewhere; open connections keep what they have).
async fn readyz(State(app): State<AppState>) -> Response {
    let limit = app.registry.config.storage_timeout;
    let ping = tokio::time::timeout(limit, app.store.ping()).await;
    let unreachable = match ping {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!("no answer within {limit:?}")),
    };
    if let Some(e) = unreachable {
        tracing::warn!(error = %e, "readiness check failed");
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "database-unreachable",
            &format!("The database does not answer: {e}"),
        );
    }
    if let Some((rooms, why)) = app.registry.storage_stalled() {
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage-stalled",
            &format!("{rooms} document(s) cannot commit to storage: {why}"),
        );
    }
    (StatusCode::OK, "ready").into_response()
}

async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

/// The client's address, as the listener accepted it.
fn client_ip(req: &Request) -> Option<std::net::IpAddr> {
    req.extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The API routes whose cost grows with the whole document (`Cost::PerDocument` in the
/// entry-point table), as (method, path).
static PER_DOCUMENT: std::sync::LazyLock<std::collections::HashSet<(&'static str, &'static str)>> =
    std::sync::LazyLock::new(|| {
        crate::entry_points::ENTRY_POINTS
            .iter()
            .filter(|e| {
                e.surface == crate::entry_points::Surface::Http
                    && e.cost == crate::entry_points::Cost::PerDocument
            })
            .filter_map(|e| e.name.split_once(' '))
            .collect()
    });

/// Bounds the whole-document requests each caller has in flight (`heavy_per_caller`): one of
/// the caller's slots is taken before the handler runs and given back only when the answer's
/// body has been sent or dropped (a client that does not read holds its own slots, and no
/// one else's, until `write_timeout` closes its connection). 429 beyond.
pub(super) async fn per_caller(State(app): State<AppState>, req: Request, next: Next) -> Response {
    // (A HEAD request is its GET's: computed alike, only not sent.)
    let method = match req.method().as_str() {
        "HEAD" => "GET",
        m => m,
    };
    let heavy = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .is_some_and(|p| PER_DOCUMENT.contains(&(method, p.as_str())));
    if !heavy {
        return next.run(req).await;
    }
    let Some(principal) = req.extensions().get::<Principal>() else {
        return next.run(req).await;
    };
    let Some(slot) = app.gate.caller_slot(&principal.user) else {
        return too_many(
            "too-many-heavy-requests",
            &format!(
                "this caller already has {} whole-document requests in flight \
                 (heavy_per_caller); retry once one has been answered",
                app.config.gate.per_caller
            ),
            std::time::Duration::from_secs(1),
        );
    };
    let (parts, body) = next.run(req).await.into_parts();
    Response::from_parts(parts, axum::body::Body::new(Holding { body, _slot: slot }))
}

/// A response body with what it holds until it is sent or dropped.
struct Holding {
    body: axum::body::Body,
    _slot: crate::gate::CallerSlot,
}

impl axum::body::HttpBody for Holding {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// Checks the bearer credential of an API request and stores the [`Principal`] in the request.
async fn authenticate(State(app): State<AppState>, mut req: Request, next: Next) -> Response {
    // A request another node forwarded: the principal it verified, checked again here for a
    // revocation or an expiry since (no credential crossed the bus).
    if let Some(owner::ForwardedBy(_, principal)) = req.extensions().get::<owner::ForwardedBy>() {
        let principal = principal.clone();
        if let (Some(token), Some(exp)) = (&principal.token_id, principal.expires_at) {
            if app
                .auth
                .is_revoked(token, &principal.user, principal.issued_at)
            {
                return ApiError::unauthorized(AuthError::Revoked).into_response();
            }
            if exp <= crate::auth::now_secs() {
                return ApiError::unauthorized(AuthError::Expired).into_response();
            }
        }
        req.extensions_mut().insert(principal);
        return next.run(req).await;
    }
    let principal = if app.auth.is_open() {
        Principal::open(client_ip(&req))
    } else {
        let token = bearer(req.headers());
        match app.verify(client_ip(&req), token.as_deref()) {
            Ok(p) => p,
            Err(refused) => return crate::problem::refused(refused),
        }
    };
    req.extensions_mut().insert(principal);
    next.run(req).await
}

#[cfg(test)]
mod nul_tests {
    use super::json_has_nul_escape;

    #[test]
    fn only_real_nul_escapes_count() {
        assert!(json_has_nul_escape(br#"{"title":"a\u0000b"}"#));
        assert!(json_has_nul_escape(br#"{"title":"\\\u0000"}"#));
        assert!(!json_has_nul_escape(br#"{"title":"\\u0000"}"#));
        assert!(!json_has_nul_escape(br#"{"title":"u0000 \u0001"}"#));
    }
}
