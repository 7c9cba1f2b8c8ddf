//! A document's content over HTTP, through its room: the state as a Yjs update or JSON, an
//! update applied like a client's, a stateless message to its Hocuspocus clients.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};

use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
use super::reads;
use crate::problem::responses::*;
use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use utoipa::{IntoParams, ToSchema};
use yrs::updates::decoder::Decode;
use yrs::{StateVector, Update};

use super::shared::{applied, ask_room, doc_for, live, ApiResult};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::gate::Form;
use crate::problem::ApiError;
use crate::room::{ApplyCmd, DocName, RoomCmd};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SvParams {
    /// Base64 (standard or URL-safe) Yjs v1 state vector: only what it lacks is returned.
    sv: Option<String>,
}

/// The document's committed state as a Yjs v1 update (binary).
#[utoipa::path(get, path = "/api/v1/docs/{name}/update", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), SvParams),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
pub(super) async fn get_update(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(p): ApiQuery<SvParams>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let since = match p.sv {
        None => None,
        Some(b64) => {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(&b64)
                .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(&b64))
                .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(&b64))
                .map_err(|_| ApiError::bad_request("invalid-state-vector", "sv is not base64"))?;
            let sv = crate::counts::check_state_vector(&raw)
                .ok()
                .and_then(|()| StateVector::decode_v1(&raw).ok())
                .ok_or_else(|| {
                    ApiError::bad_request("invalid-state-vector", "sv is not a Yjs state vector")
                })?;
            (sv != StateVector::default()).then_some(raw)
        }
    };
    // The whole state, computed once per position (the gate's cache); a diff against a state
    // vector is cut from it off the runtime.
    let whole = reads::current(&app, &doc, Form::UpdateV1).await?;
    let update = match since {
        None => whole,
        Some(sv) => {
            let admission = app.gate.admit(doc.id).await?;
            let diff = reads::heavy(admission, move || {
                yrs::diff_updates_v1(&whole, &sv).map_err(|e| {
                    ApiError::bad_request("invalid-state-vector", format!("sv does not apply: {e}"))
                })
            })
            .await?;
            bytes::Bytes::from(diff)
        }
    };
    reads::send_whole(update, "application/octet-stream").await
}

#[derive(Debug, Serialize, ToSchema)]
pub struct UpdateApplied {
    /// The log sequence number the document has reached with this update committed.
    pub seq: i64,
}

/// Apply a binary Yjs v1 update, like a client's: committed, then broadcast. Answers after
/// the commit.
#[utoipa::path(post, path = "/api/v1/docs/{name}/update",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 200, body = UpdateApplied), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, Unprocessable, Unavailable))]
pub(super) async fn post_update(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiBytes(body): ApiBytes,
) -> ApiResult<Json<UpdateApplied>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    crate::counts::check_update(&body).map_err(|e| {
        ApiError::bad_request("invalid-update", format!("not a Yjs v1 update: {e}"))
    })?;
    let update = Update::decode_v1(&body).map_err(|e| {
        ApiError::bad_request("invalid-update", format!("not a Yjs v1 update: {e}"))
    })?;
    // An Update is consumed by the room; decode a fresh one if a retry is needed.
    let mut first = Some(update);
    let result = ask_room(&app, &doc.name, |reply| {
        RoomCmd::Apply(Box::new(ApplyCmd {
            raw: body.clone(),
            update: first
                .take()
                .or_else(|| Update::decode_v1(&body).ok())
                .unwrap_or_else(Update::new),
            reply,
            author: Some(principal.user.as_str().into()),
            budget: None,
            then: Vec::new(),
        }))
    })
    .await?;
    let seq = applied(result, |e| ApiError::bad_request("invalid-update", e))?;
    Ok(Json(UpdateApplied { seq }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct StatelessMessage {
    /// Delivered as is, as Hocuspocus' `Stateless` message (a string; JSON by convention).
    pub payload: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StatelessSent {
    /// Hocuspocus connections of the document the message was sent to.
    pub delivered: usize,
}

/// Send a stateless message to every Hocuspocus client of the document (the provider's
/// `stateless` event), as a Hocuspocus server's `broadcastStateless` does. y-websocket clients
/// have no such message and get nothing. Not stored: clients connected later do not get it.
#[utoipa::path(post, path = "/api/v1/docs/{name}/stateless",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    request_body = StatelessMessage,
    responses((status = 200, body = StatelessSent), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, NotJson, Unprocessable))]
pub(super) async fn post_stateless(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<StatelessMessage>,
) -> ApiResult<Json<StatelessSent>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    if body.payload.len() > app.config.limits.max_stateless_bytes {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "stateless-too-large",
            format!(
                "the payload is longer than max_stateless_bytes ({})",
                app.config.limits.max_stateless_bytes
            ),
        ));
    }
    let name = DocName::parse(&doc.name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    // No room here, no connection to send to (and no reason to load the document).
    let Some(room) = app.registry.get(&name) else {
        return Ok(Json(StatelessSent { delivered: 0 }));
    };
    let (reply, answer) = oneshot::channel();
    let payload: Arc<str> = body.payload.into();
    let delivered = match room.command(RoomCmd::Stateless { payload, reply }).await {
        Ok(()) => answer.await.unwrap_or(0),
        Err(_) => 0,
    };
    Ok(Json(StatelessSent { delivered }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AtParams {
    /// The content at this time (RFC 3339), within the retained history.
    at: Option<String>,
    /// The content at this log position, within the retained history.
    at_position: Option<i64>,
}

/// The document's root types as JSON (text as strings, maps as objects, arrays as arrays):
/// now, or at a time or log position of its history.
#[utoipa::path(get, path = "/api/v1/docs/{name}/json", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), AtParams),
    responses((status = 200, body = Object), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
pub(super) async fn get_json(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(p): ApiQuery<AtParams>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    if p.at.is_some() || p.at_position.is_some() {
        return reads::json_at(&app, &doc, p.at.as_deref(), p.at_position).await;
    }
    let json = reads::current(&app, &doc, Form::Json).await?;
    reads::send_whole(json, "application/json").await
}
