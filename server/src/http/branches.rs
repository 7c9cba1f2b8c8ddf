//! Branches over HTTP (docs/branches.md): create one from a document, list them, review a
//! branch's changes, merge all or some of them into the parent through the parent's room,
//! reject one, bring the parent's changes into the branch, close it.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, Transact, Update};

use super::extract::{ApiJson, ApiPath};
use super::history::{first_row, merge_lock, new_doc_name};
use super::reads::{
    check_position, content, current, heavy, latest, not_retained, stored_invalid, version_meta,
};
use super::shared::{applied, created_doc, created_response, doc_for, live, ApiResult};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::branches::{self, Change, Review, TextView};
use crate::gate::{At, Form};
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::storage::api::DocMeta;
use crate::storage::branches::{BranchRow, Decision, DecisionRow};

mod merge;
pub use merge::*;

/// A branch as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Branch {
    pub name: String,
    pub parent: String,
    /// `open`, `merged` (every change was merged or rejected) or `closed`.
    pub state: String,
    /// Who created it.
    pub author: Option<String>,
    /// The parent's log position the branch started from.
    pub base_seq: i64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
    /// The branch's open changes (neither merged nor rejected).
    pub ahead: i64,
    /// The parent's updates since the branch's base or its last update from the parent.
    pub behind: i64,
    /// Whether the caller may merge and reject the branch's changes (write on the parent).
    pub can_review: bool,
}

/// The branch as the API shows it: its open changes counted from its log's positions,
/// authors and times (no update is read).
async fn branch_view(app: &AppState, row: BranchRow, caller: &Principal) -> ApiResult<Branch> {
    let role = app.api.get_role(row.parent_id, &caller.user).await?;
    let can_review = caller.permission_on(&row.parent, role) >= Some(Permission::Write);
    let (synced, _) = app.api.synced(row.doc_id).await?;
    let parent_last = app.api.last_seq(row.parent_id).await?;
    let log = app.api.branch_log(row.doc_id, false).await?;
    let gap = app.config.room.history.version_idle.as_millis() as i64;
    let ahead = log.rows.as_deref().map_or(0, |rows| {
        branches::open_changes(rows, &log.decisions, &log.pulls, gap)
    });
    Ok(Branch {
        ahead,
        can_review,
        behind: (parent_last - synced).max(0),
        name: row.name,
        parent: row.parent,
        state: row.state,
        author: row.author,
        base_seq: row.base_seq,
        created_at: row.created_at,
    })
}

fn not_a_branch() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not-a-branch",
        "the document is not a branch",
    )
}

/// The branch row of a document the caller may read.
async fn branch_of(app: &AppState, doc: &DocMeta) -> ApiResult<BranchRow> {
    app.api.branch(doc.id).await?.ok_or_else(not_a_branch)
}

fn open(row: &BranchRow) -> ApiResult<()> {
    if row.state == "closed" {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "branch-closed",
            "the branch is closed",
        ));
    }
    Ok(())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateBranch {
    /// The branch's name: a document name (its WebSocket name too).
    pub name: String,
    #[serde(default)]
    pub title: String,
    /// Where on the parent it starts; omitted: the parent's content now.
    pub from: Option<BranchFrom>,
}

/// A version or a log position of the parent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchFrom {
    pub version: Option<i64>,
    pub position: Option<i64>,
}

/// Creates a branch: a new document holding this one's content (now, or at a version or log
/// position), linked to it for review and merge. Needs read on this document and write on the
/// new name; the branch gets this document's access entries and the caller as its owner.
#[utoipa::path(post, path = "/api/v1/docs/{name}/branches", request_body = CreateBranch,
    params(("name" = String, Path, description = "The parent's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = Branch), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, NotJson, Unprocessable, Busy, Unavailable))]
pub async fn create_branch(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<CreateBranch>,
) -> ApiResult<Response> {
    let parent = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let new_name = new_doc_name(&principal, &body.name, &body.title)?;
    let (base_seq, update) = match body.from {
        None
        | Some(BranchFrom {
            version: None,
            position: None,
        }) => latest(&app, &parent, Form::UpdateV1).await?,
        Some(BranchFrom {
            version: Some(id),
            position: None,
        }) => {
            let v = version_meta(&app, &parent, id).await?;
            (
                v.seq,
                content(&app, &parent, At::Version(id), Form::UpdateV1).await?,
            )
        }
        Some(BranchFrom {
            version: None,
            position: Some(seq),
        }) => {
            check_position(&app, &parent, seq).await?;
            (
                seq,
                content(&app, &parent, At::Position(seq), Form::UpdateV1).await?,
            )
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid-branch",
                "from names a version or a position, not both",
            ))
        }
    };
    let first = first_row(&app, &parent, update, &principal, "the branch").await?;
    let created = created_doc(
        app.api
            .create_branch(
                new_name.as_str(),
                &body.title,
                &principal.user,
                parent.id,
                base_seq,
                first,
            )
            .await?,
    )?;
    let row = branch_of(&app, &created).await?;
    let view = branch_view(&app, row, &principal).await?;
    Ok(created_response(&created, &view, None))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BranchList {
    pub branches: Vec<Branch>,
}

/// The document's branches (at most 200, oldest first) with their state and how far each
/// is ahead of and behind it.
#[utoipa::path(get, path = "/api/v1/docs/{name}/branches",
    params(("name" = String, Path, description = "The parent's name, percent-encoded")),
    responses((status = 200, body = BranchList), BadRequest, Unauthorized, Forbidden, NotFound, Gone))]
pub async fn list_branches(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<BranchList>> {
    let parent = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    // Counting each branch's open changes reads its log's positions: under an admission.
    let _admission = app.gate.admit(parent.id).await?;
    let mut branches = Vec::new();
    for row in app.api.branches_of(parent.id).await? {
        branches.push(branch_view(&app, row, &principal).await?);
    }
    Ok(Json(BranchList { branches }))
}

/// The document's branch record, if it is a branch (404 `not-a-branch` otherwise).
#[utoipa::path(get, path = "/api/v1/docs/{name}/branch",
    params(("name" = String, Path, description = "The document's name, percent-encoded")),
    responses((status = 200, body = Branch), BadRequest, Unauthorized, Forbidden, NotFound))]
pub async fn get_branch(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<Branch>> {
    let doc = doc_for(&app, &principal, &name, Permission::Read).await?;
    let _admission = app.gate.admit(doc.id).await?;
    let row = branch_of(&app, &doc).await?;
    Ok(Json(branch_view(&app, row, &principal).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChangeList {
    pub branch: Branch,
    /// The branch's changes since its base, oldest first.
    pub changes: Vec<Change>,
    /// The branch's texts against the parent's, every run marked by its change.
    pub view: Vec<TextView>,
}

/// The branch's log read and grouped into changes, under an admission of the gate.
async fn review_of(
    app: &AppState,
    branch: &DocMeta,
    admission: crate::gate::Admission,
) -> ApiResult<(Review, Vec<crate::storage::branches::BranchLogRow>)> {
    let log = app.api.branch_log(branch.id, true).await?;
    let Some(rows) = log.rows else {
        return Err(not_retained("the branch's log"));
    };
    // Who wrote which items: the parent's text a change deletes names its author.
    let mut authors = app.api.authors(branch.id).await?;
    if let Some(row) = app.api.branch(branch.id).await? {
        authors.extend(app.api.authors(row.parent_id).await?);
    }
    let gap = app.config.room.history.version_idle.as_millis() as i64;
    heavy(admission, move || {
        let review = branches::review_with(&rows, &log.decisions, &log.pulls, gap, &authors)
            .map_err(stored_invalid)?;
        Ok((review, rows))
    })
    .await
}

/// The branch's changes since its base, for review: each an author's editing session, with
/// its diff against the parent and the changes it depends on; and the branch's texts with
/// every run marked by its change (the suggestion view).
#[utoipa::path(get, path = "/api/v1/docs/{name}/changes",
    params(("name" = String, Path, description = "The branch's name, percent-encoded")),
    responses((status = 200, body = ChangeList, headers(("ETag" = String))), (status = 304, description = "Not modified since the ETag sent as If-None-Match"), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
pub async fn list_changes(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    // What the answer depends on, as an ETag: a client polling for changes (the suggestion
    // view) revalidates for the price of a few indexed reads, without passing the gate.
    let tag = match app.api.branch(doc.id).await? {
        Some(row) => Some(changes_tag(&app, &row, &principal).await?),
        None => None,
    };
    let matches = |tag: &str| {
        headers
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == tag))
    };
    if let Some(tag) = tag.as_deref().filter(|t| matches(t)) {
        let mut resp = StatusCode::NOT_MODIFIED.into_response();
        if let Ok(v) = HeaderValue::from_str(tag) {
            resp.headers_mut().insert(header::ETAG, v);
        }
        return Ok(resp);
    }
    // The gate first: a branch's review is whole-document work.
    let admission = app.gate.admit(doc.id).await?;
    let row = branch_of(&app, &doc).await?;
    let (review, _) = review_of(&app, &doc, admission).await?;
    let list = ChangeList {
        branch: branch_view(&app, row, &principal).await?,
        changes: review.changes,
        view: review.view,
    };
    let mut resp = Json(list).into_response();
    if let Some(v) = tag.as_deref().and_then(|t| HeaderValue::from_str(t).ok()) {
        resp.headers_mut().insert(header::ETAG, v);
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    Ok(resp)
}

/// The ETag of a branch's change list: its last log position, its decisions, its pulls and
/// state, the parent's last position (`behind`) and whether the caller may review.
async fn changes_tag(app: &AppState, row: &BranchRow, caller: &Principal) -> ApiResult<String> {
    let last = app.api.last_seq(row.doc_id).await?;
    let decided = app.api.decided_count(row.doc_id).await?;
    let (synced, pulls) = app.api.synced(row.doc_id).await?;
    let parent_last = app.api.last_seq(row.parent_id).await?;
    let role = app.api.get_role(row.parent_id, &caller.user).await?;
    let review = caller.permission_on(&row.parent, role) >= Some(Permission::Write);
    Ok(format!(
        "W/\"c{last}-{decided}-{synced}-{pulls}-{}-{parent_last}-{}\"",
        row.version,
        u8::from(review)
    ))
}

/// The body of a POST whose JSON body may be left out.
fn optional_json<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> ApiResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request("invalid-body", e.to_string()))
}

fn conflict(kind: &'static str, detail: String, ids: &BTreeSet<i64>) -> ApiError {
    let mut e = ApiError::new(StatusCode::CONFLICT, kind, detail);
    e.current = Some(serde_json::json!({ "missing": ids }));
    e
}

/// Applies `update` to `doc` through its room as `author`'s change; the log position.
async fn apply_as(
    app: &AppState,
    doc: &DocMeta,
    author: Option<Arc<str>>,
    update: Vec<u8>,
) -> ApiResult<i64> {
    let result = merge::ask_apply(app, doc, author, Bytes::from(update), Vec::new()).await?;
    applied(result, stored_invalid)
}

/// Marks an open branch `merged` once every change is merged or rejected (`decided`: the
/// ones just decided). A branch changed meanwhile keeps its state (optimistic check).
async fn settle(
    app: &AppState,
    row: &BranchRow,
    review: &Review,
    decided: &BTreeSet<i64>,
) -> ApiResult<()> {
    let still_open = review
        .changes
        .iter()
        .any(|c| c.state == "open" && !decided.contains(&c.id));
    if !still_open && row.state == "open" {
        app.api
            .set_branch_state(row.doc_id, row.version, "merged")
            .await?;
    }
    Ok(())
}

/// Rejects a change: it is never merged (nor any change that depends on it). Needs write on
/// the parent.
#[utoipa::path(post, path = "/api/v1/docs/{name}/changes/{id}/reject",
    params(("name" = String, Path, description = "The branch's name, percent-encoded"), ("id" = i64, Path),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = Change), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Unprocessable, Busy, Unavailable))]
pub async fn reject_change(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, i64)>,
) -> ApiResult<Json<Change>> {
    let branch = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    // Refused at once when the gate has no room; the admission is given back at once, so
    // nothing of the gate is held while the parent's lock is awaited.
    drop(app.gate.admit(branch.id).await?);
    let row = branch_of(&app, &branch).await?;
    open(&row)?;
    // Who may decide is checked before the review is computed: a reader pays nothing.
    let parent = live(doc_for(&app, &principal, &row.parent, Permission::Write).await?)?;
    // Under the parent's merge lock: a change is never rejected while a merge applies it.
    // (Admitted once it holds the lock: no slot of the gate is held while it waits.)
    let _held = merge_lock(&app, parent.id).await?;
    let admission = app.gate.admit(branch.id).await?;
    let result = reject_locked(&app, &principal, (&row, &branch, &parent), id, admission).await;
    result.map(Json)
}

async fn reject_locked(
    app: &AppState,
    principal: &Principal,
    (row, branch, parent): (&BranchRow, &DocMeta, &DocMeta),
    id: i64,
    admission: crate::gate::Admission,
) -> ApiResult<Change> {
    let (review, rows) = review_of(app, branch, admission).await?;
    let Some(change) = review.change(id) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no-such-change",
            format!("the branch has no change {id}"),
        ));
    };
    // A merge that applied this change and stopped before recording it (a crash between the
    // append and the decision) left it in the parent: it is merged, and recorded so now.
    if change.state == "open" && in_parent(app, parent, &review, &rows, id).await? {
        app.api
            .decide(
                branch.id,
                DecisionRow {
                    change_id: id,
                    last_seq: change.last_seq,
                    decision: Decision::Merged,
                    decided_by: Some(principal.user.clone()),
                    parent_seq: None,
                    created_at: crate::storage::now_ms(),
                },
            )
            .await?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "change-merged",
            format!("change {id} is in the parent already (merged)"),
        ));
    }
    let stored = app
        .api
        .decide(
            branch.id,
            DecisionRow {
                change_id: id,
                last_seq: change.last_seq,
                decision: Decision::Rejected,
                decided_by: Some(principal.user.clone()),
                parent_seq: None,
                created_at: crate::storage::now_ms(),
            },
        )
        .await?;
    if stored.decision == Decision::Merged {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "change-merged",
            format!("change {id} is merged already"),
        ));
    }
    settle(app, row, &review, &[id].into()).await?;
    let mut change = change.clone();
    change.state = "rejected";
    change.last_seq = stored.last_seq;
    Ok(change)
}

/// Whether the parent holds everything change `id` would merge (its blocks and deletions).
async fn in_parent(
    app: &AppState,
    parent: &DocMeta,
    review: &Review,
    rows: &[crate::storage::branches::BranchLogRow],
    id: i64,
) -> ApiResult<bool> {
    let plan = review
        .merge_plan(rows, &[id].into())
        .map_err(stored_invalid)?;
    if plan.is_empty() {
        return Ok(false);
    }
    let (_, state) = latest(app, parent, Form::UpdateV1).await?;
    heavy(app.gate.admit(parent.id).await?, move || {
        let doc = yrs::Doc::new();
        let current = Update::decode_v1(&state).map_err(|e| stored_invalid(e.to_string()))?;
        doc.transact_mut()
            .apply_update(current)
            .map_err(|e| stored_invalid(e.to_string()))?;
        Ok(plan.iter().all(|(_, u)| {
            Update::decode_v1(u).is_ok_and(|u| crate::integrity::contained(&doc, &u))
        }))
    })
    .await
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Pulled {
    /// The branch's log position holding the parent's changes (`null`: nothing was new).
    pub seq: Option<i64>,
    /// The parent's log position the branch is now up to date with.
    pub parent_seq: i64,
}

/// Brings the parent's changes since the branch's base (or its last update) into the branch,
/// as one update through the branch's room. Its own changes stay as they are.
#[utoipa::path(post, path = "/api/v1/docs/{name}/update-from-parent",
    params(("name" = String, Path, description = "The branch's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = Pulled), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, Unprocessable, Busy, Unavailable))]
pub async fn update_from_parent(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<Pulled>> {
    let branch = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    // The gate first (whole-document work follows), but not held while the two contents are
    // read: each read takes its own admission, and one held here besides would need a
    // second slot of the node and of the branch (with `heavy_per_doc = 1`, never granted).
    drop(app.gate.admit(branch.id).await?);
    let row = branch_of(&app, &branch).await?;
    open(&row)?;
    let parent = live(doc_for(&app, &principal, &row.parent, Permission::Read).await?)?;
    let (parent_seq, parent_state) = latest(&app, &parent, Form::UpdateV1).await?;
    let mine = current(&app, &branch, Form::UpdateV1).await?;
    let admission = app.gate.admit(branch.id).await?;
    let update = heavy(admission, move || {
        let doc = yrs::Doc::new();
        let apply = |data: &[u8]| -> ApiResult<crate::room::Changes> {
            let decoded = Update::decode_v1(data).map_err(|e| stored_invalid(e.to_string()))?;
            let mut txn = doc.transact_mut();
            txn.apply_update(decoded)
                .map_err(|e| stored_invalid(e.to_string()))?;
            Ok(crate::room::Changes::of(&txn))
        };
        apply(&mine)?;
        let sv = doc.transact().state_vector();
        let diff = yrs::diff_updates_v1(
            &parent_state,
            &yrs::updates::encoder::Encode::encode_v1(&sv),
        )
        .map_err(|e| stored_invalid(e.to_string()))?;
        let changed = apply(&diff)?;
        Ok((changed.inserted > 0 || changed.deleted > 0).then_some(diff))
    })
    .await?;
    let seq = match update {
        Some(update) => {
            Some(apply_as(&app, &branch, Some(principal.user.as_str().into()), update).await?)
        }
        None => None,
    };
    // Up to date with the parent at `parent_seq` either way: with nothing new (the parent's
    // rows since were this branch's own merged changes, say) the branch is behind by nothing.
    app.api
        .record_pull(branch.id, seq, parent_seq, &principal.user)
        .await?;
    Ok(Json(Pulled { seq, parent_seq }))
}

/// Ends the branch: nothing more is merged from it; its content and history stay. Needs write
/// on the parent, or to be the branch's author with write on it.
#[utoipa::path(post, path = "/api/v1/docs/{name}/close",
    params(("name" = String, Path, description = "The branch's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = Branch), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Unprocessable))]
pub async fn close_branch(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<Branch>> {
    let branch = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let _admission = app.gate.admit(branch.id).await?;
    for _ in 0..3 {
        let row = branch_of(&app, &branch).await?;
        let author = row.author.as_deref() == Some(principal.user.as_str())
            && doc_for(&app, &principal, &name, Permission::Write)
                .await
                .is_ok();
        if !author {
            doc_for(&app, &principal, &row.parent, Permission::Write).await?;
        }
        if row.state == "closed" {
            return Ok(Json(branch_view(&app, row, &principal).await?));
        }
        if let Some(closed) = app
            .api
            .set_branch_state(row.doc_id, row.version, "closed")
            .await?
        {
            return Ok(Json(branch_view(&app, closed, &principal).await?));
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "branch-busy",
        "the branch changed while closing it; retry",
    ))
}
