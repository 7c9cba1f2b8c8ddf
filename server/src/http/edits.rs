//! JSON edits over HTTP (`POST /docs/{name}/edits`, docs/api.md): the operations are made
//! into a Yjs update on a scratch copy of the committed state (`crate::edits`), off the
//! runtime under the heavy-work gate, then applied through the document's room like a
//! client's update (committed, broadcast, attributed to the caller), and only onto the state
//! it was computed from (the room checks the log position): should the document have moved in
//! between, the edit is computed again from the new state, a few times at most, so that its
//! preconditions and indices hold at the state it lands on.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::{Extension, Json};
use base64::Engine;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use yrs::updates::decoder::Decode;
use yrs::Update;

use super::extract::{ApiJson, ApiPath};
use super::reads::{self, stored_invalid};
use super::shared::{applied, ask_room, doc_for, live, ApiResult};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::edits::{self, Change, EditError};
use crate::gate::Form;
use crate::history;
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::room::{ApplyCmd, ApplyError, RoomCmd};

/// Computations of one edit: the first, and those after the document moved between computing
/// and applying it. Past them the edit gets 503 `document-changing` (retry later).
const TRIES: u32 = 5;

/// The request, as the OpenAPI document shows it (the handler reads it as JSON and
/// `crate::edits::parse` checks it, naming the operation a problem is in).
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct EditRequest {
    /// Operations, applied in order in one transaction, each naming its root by its kind's
    /// key: text `{"text": R, "insert": "s", "at"?: i}`, `{"text": R, "delete": n, "at": i}`,
    /// `{"text": R, "replace": "old", "with": "new", "all"?: false}`; map `{"map": R, "set":
    /// "key", "value": json}`, `{"map": R, "delete": "key"}`; array `{"array": R, "insert":
    /// [json], "at": i}`, `{"array": R, "delete": n, "at": i}`, `{"array": R, "push":
    /// [json]}`; XML `{"xml": R, "append": {"type": "paragraph", "attrs"?: {}, "text"?:
    /// "s"}}`, `{"xml": R, "insert": {...}, "at": i}`, `{"xml": R, "replace": "old", "with":
    /// "new", "all"?: false, "element"?: i}`. Indices count UTF-16 code units. At most 1000.
    #[schema(value_type = Vec<Object>)]
    pub ops: Vec<serde_json::Value>,
    /// Applied only if each names text its root contains.
    pub if_contains: Option<Vec<Condition>>,
    /// Applied only onto this state (base64 Yjs v1 state vector).
    pub state_vector: Option<String>,
}

/// A precondition: the text root `text` (or a text node of the XML root `xml`) contains
/// `value`.
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct Condition {
    pub text: Option<String>,
    pub xml: Option<String>,
    pub value: String,
}

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
    request_body = EditRequest,
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
    let guarded = !request.if_contains.is_empty() || request.state_vector.is_some();
    let mut hold = app.hooks.edit_hold.clone().filter(|h| h.claim());
    for attempt in 0..TRIES {
        if attempt > 0 {
            // The room had updates not yet committed; give them a moment to be.
            tokio::time::sleep(Duration::from_millis(10 << attempt)).await;
        }
        // The committed state (the gate's cached whole state; read through the gate).
        let (at, current) = reads::current_at(&app, &doc, Form::UpdateV1).await?;
        let admission = app.gate.admit(doc.id).await?;
        let work = request.clone();
        let client = history::server_client_id();
        let outcome = reads::heavy(admission, move || {
            edits::apply(&current, &work, client).map_err(edit_error)
        })
        .await?;
        if let Some(hold) = hold.take() {
            hold.reached.notify_one();
            let _ = tokio::time::timeout(Duration::from_secs(5), hold.resume.notified()).await;
        }
        let raw = bytes::Bytes::from(outcome.update);
        let result = ask_room(&app, &doc.name, |reply| {
            RoomCmd::Apply(Box::new(ApplyCmd {
                raw: raw.clone(),
                update: Update::decode_v1(&raw).unwrap_or_else(|_| Update::new()),
                reply,
                author: Some(author.clone()),
                budget: None,
                // Preconditions hold only on the state they were checked on: such an edit
                // applies onto exactly that state, or is computed again. Without them it
                // merges like any client's edit made on that state (its positions are
                // anchored to the items around them), so live typing never holds it back.
                expect_seq: guarded.then_some(at),
                then: Vec::new(),
            }))
        })
        .await?;
        match result {
            // Computed again from the new state, where the preconditions are checked again
            // (a `state_vector` the document has moved past is 409 then).
            Err(ApplyError::Moved) => continue,
            result => {
                let seq = applied(result, |e| {
                    stored_invalid(format!("an edit's update was refused: {e}"))
                })?;
                let state_vector =
                    base64::engine::general_purpose::STANDARD.encode(&outcome.state_vector);
                return Ok(Json(EditsApplied {
                    seq,
                    state_vector,
                    changes: outcome.changes,
                }));
            }
        }
    }
    let mut busy = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "document-changing",
        format!(
            "the document changed between computing the edit and applying it, {TRIES} times \
             over; nothing was applied: retry after the time in Retry-After"
        ),
    );
    busy.retry_after = Some(Duration::from_secs(1));
    Err(busy)
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
        EditError::Stored(why) => return stored_invalid(why.clone()),
    };
    error.current = current;
    error
}
