//! `Idempotency-Key` on POST, PATCH and DELETE: the first request with a key runs and its
//! response is stored; a repeat with the same request gets the stored response; a repeat with a
//! different request gets 422; a repeat while the first still runs waits for it (then replays)
//! or, past [`WAIT_FOR_FIRST`], gets 409. Keys are scoped to the caller and expire after
//! `idempotency_ttl`.

use std::time::Duration;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use sha2::{Digest, Sha256};

use crate::app::AppState;
use crate::auth::Principal;
use crate::problem::ApiError;
use crate::storage::api::{IdemClaim, StoredResponse};
use crate::storage::now_ms;

/// Largest response body kept for replay. (Requests are read up to the API's own body limit,
/// `MAX_REQUEST_BODY`, so a key does not let a client make the server buffer more.)
const MAX_BODY: usize = 16 << 20;
/// Longest accepted key.
const MAX_KEY_LEN: usize = 255;
/// How long a repeat waits for the first request with its key to finish.
const WAIT_FOR_FIRST: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(25);
/// Response headers stored with the body and replayed.
const REPLAYED_HEADERS: [header::HeaderName; 3] =
    [header::CONTENT_TYPE, header::ETAG, header::LOCATION];

pub async fn idempotency(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    req: Request,
    next: Next,
) -> Response {
    if !matches!(*req.method(), Method::POST | Method::PATCH | Method::DELETE) {
        return next.run(req).await;
    }
    let Some(key) = req
        .headers()
        .get("idempotency-key")
        .map(|v| v.to_str().map(str::to_owned))
    else {
        return next.run(req).await;
    };
    let key = match key {
        Ok(k) if !k.is_empty() && k.len() <= MAX_KEY_LEN => k,
        _ => {
            return ApiError::bad_request(
                "invalid-idempotency-key",
                "Idempotency-Key must be 1 to 255 visible ASCII characters",
            )
            .into_response()
        }
    };
    let (parts, body) = req.into_parts();
    let body = match to_bytes(body, super::MAX_REQUEST_BODY).await {
        Ok(b) => b,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "the request body is too large",
            )
            .into_response()
        }
    };
    // The request as the server sees it: method, target, precondition, body.
    let mut h = Sha256::new();
    h.update(parts.method.as_str());
    h.update([0]);
    h.update(parts.uri.to_string());
    h.update([0]);
    if let Some(v) = parts.headers.get(header::IF_MATCH) {
        h.update(v.as_bytes());
    }
    h.update([0]);
    h.update(&body);
    let hash = hex(&h.finalize());

    let scope = principal.scope();
    let ttl_ms = app.config.idempotency_ttl.as_millis() as i64;
    let waited_until = tokio::time::Instant::now() + WAIT_FOR_FIRST;
    loop {
        let now = now_ms();
        let claim = match app
            .api
            .idem_claim(&scope, &key, &hash, now, now - ttl_ms)
            .await
        {
            Ok(c) => c,
            Err(e) => return ApiError::from(e).into_response(),
        };
        match claim {
            IdemClaim::Started => {
                // On its own task: if the client goes away, the request still finishes and its
                // response is stored, instead of leaving the key "in progress" until it expires.
                let req = Request::from_parts(parts, Body::from(body));
                let app = app.clone();
                let task =
                    tokio::spawn(async move { run_and_store(&app, &scope, &key, next, req).await });
                return task
                    .await
                    .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
            }
            IdemClaim::Replay(stored) => return replay(stored),
            IdemClaim::Mismatch => {
                return ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency-key-reused",
                    "this Idempotency-Key was used for a different request",
                )
                .into_response()
            }
            IdemClaim::InProgress => {
                if tokio::time::Instant::now() >= waited_until {
                    return ApiError::new(
                        StatusCode::CONFLICT,
                        "idempotency-key-in-progress",
                        "a request with this Idempotency-Key is still running; retry later",
                    )
                    .into_response();
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

async fn run_and_store(
    app: &AppState,
    principal: &str,
    key: &str,
    next: Next,
    req: Request,
) -> Response {
    let resp = next.run(req).await;
    // Forwarded to the document's owner, which recorded the answer under this key itself
    // (this node gave its claim up before forwarding: `owner::on_owner`): nothing to store,
    // and nothing to give up, even on a 503 (the owner may still be running it).
    if resp
        .extensions()
        .get::<super::owner::AnsweredByOwner>()
        .is_some()
    {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let body = match to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => {
            let _ = app.api.idem_abandon(principal, key).await;
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    if parts.status.is_server_error() || parts.status == StatusCode::TOO_MANY_REQUESTS {
        // Not an answer to remember: a retry should run again (a 429 asks for one).
        let _ = app.api.idem_abandon(principal, key).await;
    } else {
        let headers = REPLAYED_HEADERS
            .iter()
            .filter_map(|name| {
                let v = parts.headers.get(name)?.to_str().ok()?;
                Some((name.as_str().to_owned(), v.to_owned()))
            })
            .collect();
        let stored = StoredResponse {
            status: parts.status.as_u16(),
            headers,
            body: body.to_vec(),
        };
        if let Err(e) = app.api.idem_finish(principal, key, &stored).await {
            tracing::warn!(error = %e, "could not store an idempotent response");
        }
    }
    Response::from_parts(parts, Body::from(body))
}

fn replay(stored: StoredResponse) -> Response {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut resp = (status, stored.body).into_response();
    let headers = resp.headers_mut();
    for (name, value) in stored.headers {
        if let (Ok(n), Ok(v)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(n, v);
        }
    }
    headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    resp
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
