//! JSON edits over HTTP (`POST /docs/{name}/edits`, docs/api.md): the request is parsed
//! here and made by the document's room on its live document, in its turn among the updates
//! (`room/actor/edits.rs`): its preconditions are checked in the same step, against exactly
//! the state it lands on, so there is no whole-document copy and no retry; it is committed,
//! broadcast and attributed to the caller like a client's update, under the caller's own
//! client id in the document.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use base64::Engine;
use serde::Serialize;
use utoipa::ToSchema;
use yrs::updates::decoder::Decode;
use yrs::Update;

use super::extract::{ApiJson, ApiPath};
use super::reads::stored_invalid;
use super::shared::{applied, ask_room, doc_for, live, ApiResult};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::edits::{self, Change, EditError};
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::room::{ApplyCmd, ApplyError, EditCmd, RoomCmd};

/// Where the room says what an edit did.
type Made = tokio::sync::oneshot::Receiver<Result<edits::Outcome, EditError>>;

#[derive(Debug, Serialize, ToSchema)]
pub struct EditsApplied {
    /// The log position the document has reached with the edit committed.
    pub seq: i64,
    /// The state vector (base64 Yjs v1) of the state the edit was computed on with the edit
    /// applied; with a precondition, the document's right after the edit: pass it as
    /// `state_vector` to make the next edit only onto this state.
    pub state_vector: String,
    /// What each operation changed, in order.
    pub changes: Vec<Change>,
}

/// Edit a document with JSON operations (text, map, array, XML), for tools that do not
/// speak Yjs: applied in one transaction through the document's room, broadcast to its
/// clients, attributed to the caller. A malformed operation (400 `invalid-edit`) or a failed
/// precondition (409 `precondition-failed`) applies nothing; `current` names the operation.
#[utoipa::path(post, path = "/api/v1/docs/{name}/edits",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    request_body = crate::edits::Edits,
    responses((status = 200, body = EditsApplied), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, NotJson, Unprocessable, Busy, Unavailable))]
pub(super) async fn post_edits(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> ApiResult<Json<EditsApplied>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    let request = Arc::new(edits::parse(&body).map_err(edit_error)?);
    let author: Arc<str> = principal.user.as_str().into();
    let client = edits::edit_client(doc.id, &principal.user);
    if let Some(hold) = app.hooks.edit_hold.clone().filter(|h| h.claim()) {
        hold.reached.notify_one();
        let _ = tokio::time::timeout(Duration::from_secs(5), hold.resume.notified()).await;
    }
    // Each try of `ask_room` goes to the document's room of the moment. Once an edit has been
    // made, a try after that (the room went away before answering: its commit may or may not
    // have happened) sends the edit's update instead, which a room that has it ignores: an
    // edit is never made twice.
    let mut made = None;
    let mut outcome: Option<Result<edits::Outcome, EditError>> = None;
    let committed = ask_room(&app, &doc.name, |committed| {
        if outcome.is_none() {
            outcome = made.take().and_then(|mut rx: Made| rx.try_recv().ok());
        }
        if let Some(Ok(done)) = &outcome {
            let raw = bytes::Bytes::copy_from_slice(&done.update);
            return RoomCmd::Apply(Box::new(ApplyCmd {
                update: Update::decode_v1(&raw).unwrap_or_else(|_| Update::new()),
                raw,
                reply: committed,
                author: Some(author.clone()),
                budget: None,
                then: Vec::new(),
            }));
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        made = Some(rx);
        RoomCmd::Edit(Box::new(EditCmd {
            edits: request.clone(),
            author: author.clone(),
            client,
            made: tx,
            committed,
        }))
    })
    .await?;
    // (Sent when the edit was made, before its commit or refusal was answered.)
    if outcome.is_none() {
        outcome = made.and_then(|mut rx| rx.try_recv().ok());
    }
    if let (Err(ApplyError::EditRefused), Some(Err(refused))) = (&committed, &outcome) {
        return Err(edit_error(refused.clone()));
    }
    let seq = applied(committed, |e| {
        stored_invalid(format!("an edit's update was refused: {e}"))
    })?;
    let outcome = match outcome {
        Some(Ok(outcome)) => outcome,
        _ => return Err(stored_invalid("the room did not report the edit".into())),
    };
    let state_vector = base64::engine::general_purpose::STANDARD.encode(&outcome.state_vector);
    Ok(Json(EditsApplied {
        seq,
        state_vector,
        changes: outcome.changes,
    }))
}

/// An edit's refusal as a problem: 400 `invalid-edit`, 409 `precondition-failed`, with
/// `current` naming the operation or condition.
fn edit_error(e: EditError) -> ApiError {
    let current = e.current();
    let mut error = match &e {
        EditError::Invalid { .. } => ApiError::bad_request("invalid-edit", e.to_string()),
        EditError::Failed { .. } => {
            ApiError::new(StatusCode::CONFLICT, "precondition-failed", e.to_string())
        }
        EditError::TooCostly { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "edit-too-costly",
            e.to_string(),
        ),
        EditError::Stored(why) => return stored_invalid(why.clone()),
    };
    error.current = current;
    error
}
