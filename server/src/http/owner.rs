//! Requests only the document's owner may serve, made on another node.
//!
//! With several nodes, a document's room runs on one node (the one holding its lease). Reads
//! of committed content work on every node (from storage: see `history::current`), but a
//! content write must go through the owner's room, so [`on_owner`] (a layer on those routes)
//! forwards the request over the bus to the owner and answers with the owner's response: the
//! client cannot tell which node it asked. The caller's credential is checked here first (an
//! unknown or forbidden document is refused as it would be on the owner, without a forward),
//! and **the credential never crosses the bus**: the envelope carries the principal this node
//! verified (user, token id, scope, permission, expiry), with no `Authorization` or cookie
//! header, and the owner checks that principal's permission again (and its revocation and
//! expiry). Each forwarded request is bound to a fresh nonce and the time it was sent: the owner
//! refuses one older than [`crate::bus::replay::FORWARD_MAX_AGE`] (or as far in the future) and any nonce it has
//! seen within that window ([`crate::bus::replay::ReplayGuard`], bounded), so a captured envelope replayed later
//! changes nothing. A request is forwarded at most once (the owner serves what arrives through
//! the bus, marked [`ForwardedBy`], a request extension no client can set).
//!
//! The `Idempotency-Key` travels with the request and the owner keeps its record: this node
//! gives up the claim its idempotency layer made before forwarding and stores nothing of the
//! answer ([`AnsweredByOwner`]). If the owner does not answer within `forward_timeout` the
//! answer is 503 with `Retry-After`; a retry with the same key, through any node or the owner
//! itself, meets the owner's record and gets the first request's response instead of running
//! it again.

use std::net::SocketAddr;

use axum::body::Body;
use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{ApiError, MAX_REQUEST_BODY};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::bus::{ForwardAnswer, Forwarded};
use crate::room::DocName;

/// Marks a request another node forwarded: served here, never forwarded again, as the
/// principal that node verified (the `authenticate` layer takes it instead of a credential).
#[derive(Debug, Clone)]
pub struct ForwardedBy(pub String, pub Principal);

/// Marks a response the owner gave to a forwarded request: the owner recorded it under the
/// request's `Idempotency-Key`, so this node's idempotency layer leaves the key alone.
#[derive(Debug, Clone, Copy)]
pub struct AnsweredByOwner;

/// Room for the envelope around a forwarded body (method, URI, headers) within NATS's
/// message size.
const ENVELOPE_ROOM: usize = 16 << 10;

/// Headers not carried across: hop-by-hop ones, the length (recomputed) and every
/// credential (the envelope carries the verified principal instead).
const NOT_CARRIED: [&str; 9] = [
    "authorization",
    "connection",
    "content-length",
    "cookie",
    "host",
    "keep-alive",
    "proxy-authorization",
    "transfer-encoding",
    "upgrade",
];

fn carried(headers: &axum::http::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| !NOT_CARRIED.contains(&name.as_str()))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_owned())))
        .collect()
}

/// The owner to forward a request for document `name` to, if another node holds its lease. A
/// caller without write access, or a deleted document, is refused here as the owner would.
async fn owner_elsewhere(
    app: &AppState,
    principal: Option<&Principal>,
    name: &str,
) -> Result<Option<String>, ApiError> {
    let (Some(bus), Some(_), Some(principal)) = (&app.bus, &app.registry.config.lease, principal)
    else {
        return Ok(None);
    };
    let Some(doc) = app.api.get_doc_by_name(name).await? else {
        return Ok(None); // the handler answers 404
    };
    if let Ok(name) = DocName::parse(&doc.name) {
        if app.registry.get(&name).is_some() {
            return Ok(None); // served here: the handler checks the caller
        }
    }
    let Some(owner) = app.store.lease_owner(doc.id).await? else {
        return Ok(None);
    };
    if *owner == *bus.node {
        return Ok(None);
    }
    // About to forward: the caller is checked here first, as the owner would check it.
    super::shared::live(super::shared::doc_for(app, principal, name, Permission::Write).await?)?;
    Ok(Some(owner))
}

/// A layer for the routes of `/docs/{name}/...` that must run on the document's owner.
pub async fn on_owner(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let name = path_name(&req);
    forward_to_owner_of(app, name, req, next).await
}

/// A layer for the routes of `/docs/{branch}/...` that write the branch's parent (a merge):
/// they run on the parent's owner.
pub async fn on_parent_owner(State(app): State<AppState>, req: Request, next: Next) -> Response {
    let mut name = None;
    if let Some(branch) = path_name(&req) {
        let parent = async {
            let doc = app.api.get_doc_by_name(&branch).await.ok()??;
            let row = app.api.branch(doc.id).await.ok()??;
            Some(row.parent)
        };
        // Not a branch: the handler answers (on this node).
        name = parent.await;
    }
    forward_to_owner_of(app, name, req, next).await
}

/// The `{name}` of `/docs/{name}/...` as the nested router sees it, percent-decoded as the
/// handler's `Path` decodes it.
fn path_name(req: &Request) -> Option<String> {
    req.uri()
        .path()
        .strip_prefix("/docs/")
        .and_then(|rest| rest.split('/').next())
        .and_then(|segment| {
            percent_encoding::percent_decode_str(segment)
                .decode_utf8()
                .ok()
                .map(|n| n.into_owned())
        })
}

/// Serves the request here, or forwards it to the node owning document `name`.
async fn forward_to_owner_of(
    app: AppState,
    name: Option<String>,
    req: Request,
    next: Next,
) -> Response {
    if req.extensions().get::<ForwardedBy>().is_some() {
        return next.run(req).await;
    }
    let principal = req.extensions().get::<Principal>().cloned();
    let owner = match name {
        Some(name) => owner_elsewhere(&app, principal.as_ref(), &name).await,
        None => Ok(None),
    };
    let owner = match owner {
        Ok(Some(owner)) => owner,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    let Some(bus) = app.bus.clone() else {
        return next.run(req).await;
    };
    let (parts, body) = req.into_parts();
    // What NATS cannot carry is refused here rather than retried (NATS's `max_payload` is
    // 1 MiB by default: raise it to the API's 2 MiB for writes of any size through any node).
    let limit = MAX_REQUEST_BODY.min(bus.max_payload().saturating_sub(ENVELOPE_ROOM));
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(body) => body,
        Err(_) => {
            return ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                format!(
                    "the body is larger than this node can forward to the document's node \
                     ({limit} bytes)"
                ),
            )
            .into_response()
        }
    };
    // The URI the client sent (a nested router sees its path without the `/api/v1` prefix).
    let uri = parts
        .extensions
        .get::<OriginalUri>()
        .map_or(&parts.uri, |original| &original.0);
    let uri = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let Some(principal) = principal.and_then(|p| serde_json::to_string(&p).ok()) else {
        return ApiError::unauthorized(crate::auth::AuthError::Missing).into_response();
    };
    let request = Forwarded {
        nonce: uuid::Uuid::new_v4().simple().to_string(),
        sent_at_ms: crate::storage::now_ms(),
        principal,
        method: parts.method.to_string(),
        uri,
        headers: carried(&parts.headers),
        body,
        ..Forwarded::default()
    };
    // The key's record is the owner's to keep (in the shared database, under the same
    // caller): this node's claim, made by its idempotency layer a moment ago, is given up, so
    // the owner can claim the key, and a retry anywhere finds the owner's record.
    if let Some(key) = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
    {
        if let Some(principal) = parts.extensions.get::<Principal>() {
            let _ = app.api.idem_abandon(&principal.scope(), key).await;
        }
    }
    app.metrics.forwarded_requests.inc();
    let answered = match bus
        .request(&owner, request, app.config.forward_timeout)
        .await
    {
        Ok(answer) => into_response(answer),
        Err(()) => {
            app.metrics.forward_failures.inc();
            let mut response = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "owner-unavailable",
                "the node serving this document did not answer; retry",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    };
    let mut answered = answered;
    answered.extensions_mut().insert(AnsweredByOwner);
    answered
}

/// The owner's response as this node's.
fn into_response(answer: ForwardAnswer) -> Response {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = status;
    for (name, value) in answer.headers {
        if NOT_CARRIED.contains(&name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Serves a request another node forwarded (this node owns the document) through `router`,
/// and answers it over the bus.
pub async fn serve_forwarded(app: AppState, router: axum::Router, request: Forwarded) {
    let Some(bus) = app.bus.clone() else {
        return;
    };
    let mut builder = Request::builder()
        .method(request.method.as_str())
        .uri(request.uri.as_str());
    for (name, value) in &request.headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let from = request.from.clone();
    // A replayed envelope is dropped (no sender waits for it: its nonce was answered); any
    // other refusal is answered at once, so the node that forwarded it tells its caller
    // instead of waiting `forward_timeout`.
    if let Err(why) =
        app.forward_guard
            .admit(&request.nonce, request.sent_at_ms, crate::storage::now_ms())
    {
        app.metrics
            .forward_refused
            .with_label_values(&[why.why()])
            .inc();
        tracing::warn!(from = %from, reason = why.why(), "refused a forwarded request");
        if why != crate::bus::replay::Replay::Seen {
            let mut refusal = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "forward-refused",
                format!(
                    "the document's owner refused the forwarded request ({}); retry",
                    why.why()
                ),
            );
            refusal.retry_after = Some(std::time::Duration::from_secs(1));
            answer(&bus, &from, request.id, refusal.into_response()).await;
        }
        return;
    }
    let principal: Principal = match serde_json::from_str(&request.principal) {
        Ok(p) => p,
        Err(_) => {
            app.metrics
                .forward_refused
                .with_label_values(&["malformed"])
                .inc();
            let refusal = ApiError::bad_request("forward-malformed", "the principal is malformed");
            answer(&bus, &from, request.id, refusal.into_response()).await;
            return;
        }
    };
    let built = builder
        .extension(ForwardedBy(from.to_string(), principal))
        // Per-address limits: the node that forwarded it applied them to the client.
        .extension(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 0))))
        .body(Body::from(request.body));
    let response = match built {
        Ok(req) => match tower::ServiceExt::oneshot(router, req).await {
            Ok(response) => response,
            Err(never) => match never {},
        },
        Err(_) => StatusCode::BAD_REQUEST.into_response(),
    };
    answer(&bus, &from, request.id, response).await;
}

/// Sends `response` over the bus to `from`, as the answer to its request `id`.
async fn answer(bus: &crate::bus::Bus, from: &str, id: u64, response: Response) {
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(body, MAX_REQUEST_BODY * 8)
        .await
        .unwrap_or_default();
    let answer = ForwardAnswer {
        id,
        status: parts.status.as_u16(),
        headers: carried(&parts.headers),
        body,
    };
    bus.respond(from, answer).await;
}
