//! The version history routes under `/api/v1/docs/{name}/` (docs/history.md): sessions,
//! versions, content at a time or position, diffs, restore and fork.
//!
//! Reads come from storage on any node (the log, the versions and the snapshot are the
//! committed truth); a restore goes through the document's room, on its owner (`on_owner`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use yrs::updates::decoder::Decode;
use yrs::{Transact, Update};

use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::reads::{
    check_position, content, content_with, current, encode, heavy, latest, not_retained, position,
    send_whole, stored_invalid, version_meta,
};
use super::shared::{
    applied, ask_room, created_doc, created_response, decode_cursor, doc_for, encode_cursor,
    field_limits, live, ApiResult,
};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::gate::{At, Form};
use crate::history::{self, Session, TextDiff};
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::room::{ApplyCmd, DocName, RoomCmd};
use crate::storage::api::DocMeta;
use crate::storage::history::{NewVersion, StateAt, Version, VersionDelete, VersionKind};
use bytes::Bytes;

/// Most sessions per page of `GET /history`.
const MAX_SESSIONS: u32 = 100;
/// Longest version label, in bytes.
pub const MAX_LABEL: usize = 256;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct HistoryParams {
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Sessions per page, 1 to 100 (default 20).
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HistoryPage {
    /// Editing sessions, newest first: a session ends where no edit came for `version_idle`.
    pub items: Vec<Session>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Who changed the document and when: the retained log grouped into editing sessions.
#[utoipa::path(get, path = "/api/v1/docs/{name}/history",
    params(("name" = String, Path, description = "The document's name, percent-encoded"), HistoryParams),
    responses((status = 200, body = HistoryPage), BadRequest, Unauthorized, Forbidden, NotFound, Gone))]
pub async fn get_history(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(p): ApiQuery<HistoryParams>,
) -> ApiResult<Json<HistoryPage>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let limit = p.limit.unwrap_or(20).clamp(1, MAX_SESSIONS) as usize;
    let before = match &p.cursor {
        None => i64::MAX,
        Some(c) => decode_cursor("h", c)?,
    };
    let gap = app.config.room.history.version_idle.as_millis() as i64;
    // One more start than the page: it says whether an older page follows.
    let (starts, last) = app
        .api
        .session_starts(doc.id, before, gap, limit as u32 + 1)
        .await?;
    let mut items = Vec::with_capacity(limit);
    let mut end = last.unwrap_or(0);
    for &start in starts.iter().take(limit) {
        let totals = app.api.author_totals(doc.id, start, end).await?;
        items.push(history::session(start, end, totals));
        end = start - 1;
    }
    let next_cursor = (starts.len() > limit)
        .then(|| items.last().map(|s| encode_cursor("h", s.first_seq)))
        .flatten();
    Ok(Json(HistoryPage { items, next_cursor }))
}

/// The document's versions, oldest first.
#[utoipa::path(get, path = "/api/v1/docs/{name}/versions",
    params(("name" = String, Path, description = "The document's name, percent-encoded")),
    responses((status = 200, body = Vec<Version>), BadRequest, Unauthorized, Forbidden, NotFound, Gone))]
pub async fn list_versions(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<Vec<Version>>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    Ok(Json(app.api.versions(doc.id).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVersion {
    /// 1 to 256 bytes.
    pub label: String,
}

/// Records the current content as a named version, kept until deleted.
#[utoipa::path(post, path = "/api/v1/docs/{name}/versions", request_body = CreateVersion,
    params(("name" = String, Path, description = "The document's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = Version), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, NotJson, Unprocessable, Busy, Unavailable, BudgetFull))]
pub async fn create_version(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<CreateVersion>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    if body.label.is_empty() || body.label.len() > MAX_LABEL {
        return Err(ApiError::bad_request(
            "invalid-label",
            format!("a label is 1 to {MAX_LABEL} bytes"),
        ));
    }
    let (seq, state) = latest(&app, &doc, Form::StateV2).await?;
    let version = record(
        &app,
        &doc,
        seq,
        state,
        (VersionKind::Named, Some(body.label)),
        &principal,
        app.config.max_version_bytes,
    )
    .await?;
    Ok((StatusCode::CREATED, Json(version)).into_response())
}

/// Records `state` (the document at `seq`, Yjs v2) as a version, within the document's
/// version budget (`max_version_bytes`: 507 when full).
pub(super) async fn record(
    app: &AppState,
    doc: &DocMeta,
    seq: i64,
    state: Bytes,
    (kind, label): (VersionKind, Option<String>),
    principal: &Principal,
    budget: u64,
) -> ApiResult<Version> {
    let created_at = crate::storage::now_ms();
    let new = NewVersion {
        doc: doc.id,
        seq,
        kind,
        label: label.clone(),
        author: Some(principal.user.clone()),
        state: state.to_vec(),
        created_at,
    };
    let Some(id) = app.api.add_version_within(new, budget).await? else {
        app.metrics.versions_refused.inc();
        return Err(budget_full(app.config.max_version_bytes));
    };
    app.metrics.versions_created.inc();
    Ok(Version {
        id,
        seq,
        kind,
        label,
        author: Some(principal.user.clone()),
        created_at,
    })
}

/// 507: the document's version budget is full.
pub(super) fn budget_full(budget: u64) -> ApiError {
    ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "version-budget-full",
        format!(
            "the document's named and restore versions would hold more than \
             max_version_bytes ({budget} bytes); delete versions it no longer needs"
        ),
    )
}

/// Deletes a version (named versions are kept until then).
#[utoipa::path(delete, path = "/api/v1/docs/{name}/versions/{id}",
    params(("name" = String, Path, description = "The document's name, percent-encoded"), ("id" = i64, Path),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 204), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Unprocessable))]
pub async fn delete_version(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, i64)>,
) -> ApiResult<StatusCode> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    // A version someone recorded (named, or a restore) is theirs: deleting it takes its
    // author, the document's owner, or admin permission on the document.
    let version = version_meta(&app, &doc, id).await?;
    let mine = version.kind == VersionKind::Auto
        || version.author.is_none()
        || version.author.as_deref() == Some(principal.user.as_str())
        || doc.owner.as_deref() == Some(principal.user.as_str());
    if !mine
        && doc_for(&app, &principal, &name, Permission::Admin)
            .await
            .is_err()
    {
        return Err(ApiError::forbidden(
            "only the version's author, the document's owner or an administrator may delete it",
        ));
    }
    match app.api.delete_version(doc.id, id).await? {
        VersionDelete::Deleted => Ok(StatusCode::NO_CONTENT),
        VersionDelete::NotFound => Err(ApiError::not_found("version")),
        VersionDelete::InUse => Err(ApiError::new(
            StatusCode::CONFLICT,
            "version-in-use",
            "the retained history starts at this version: it goes when the prune job moves \
             the history's start past it",
        )),
    }
}

/// The content at a version, in the shape of `GET /docs/{name}/json`.
#[utoipa::path(get, path = "/api/v1/docs/{name}/versions/{id}/json",
    params(("name" = String, Path, description = "The document's name, percent-encoded"), ("id" = i64, Path)),
    responses((status = 200, body = Object), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
pub async fn version_json(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, i64)>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    // The version's row first: a deleted version is 404 even while its content is cached.
    version_meta(&app, &doc, id).await?;
    let json = content(&app, &doc, At::Version(id), Form::Json).await?;
    send_whole(json, "application/json").await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffParams {
    /// The version to compare from.
    from: i64,
    /// The version to compare to (default: the current content).
    to: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DiffView {
    pub from: Version,
    /// `null`: the current content.
    pub to: Option<Version>,
    /// Per text root: kept, inserted and deleted runs, each with the author of its text.
    pub texts: Vec<TextDiff>,
}

/// What changed in each text between two versions, with authors.
#[utoipa::path(get, path = "/api/v1/docs/{name}/diff",
    params(("name" = String, Path, description = "The document's name, percent-encoded"), DiffParams),
    responses((status = 200, body = DiffView), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
pub async fn get_diff(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(p): ApiQuery<DiffParams>,
) -> ApiResult<Json<DiffView>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let from = version_meta(&app, &doc, p.from).await?;
    let from_state = content(&app, &doc, At::Version(from.id), Form::StateV2).await?;
    let (to, to_seq, to_state) = match p.to {
        Some(id) => {
            let v = version_meta(&app, &doc, id).await?;
            let state = content(&app, &doc, At::Version(id), Form::StateV2).await?;
            let seq = v.seq;
            (Some(v), seq, state)
        }
        None => {
            let (seq, state) = latest(&app, &doc, Form::StateV2).await?;
            (None, seq, state)
        }
    };
    // The older state goes first into the diff's document; from a newer version to an
    // older one, what the newer has alone is what the older "deleted".
    let reversed = from.seq > to_seq;
    let authors = app.api.authors(doc.id).await?;
    let admission = app.gate.admit(doc.id).await?;
    let texts = heavy(admission, move || {
        if reversed {
            history::diff(&to_state, &from_state, &authors).map(history::reverse)
        } else {
            history::diff(&from_state, &to_state, &authors)
        }
        .map_err(stored_invalid)
    })
    .await?;
    Ok(Json(DiffView { from, to, texts }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Restored {
    /// The log position the restore was committed at.
    pub seq: i64,
    /// The version recording the restored content.
    pub version: Version,
}

/// Makes a version's content current again, as a new change: committed, broadcast to every
/// client, attributed to the caller, recorded as a version. Concurrent edits outside the
/// restored ranges are kept.
#[utoipa::path(post, path = "/api/v1/docs/{name}/versions/{id}/restore",
    params(("name" = String, Path, description = "The document's name, percent-encoded"), ("id" = i64, Path),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = Restored), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, TooLarge, Unprocessable, Busy, Unavailable, BudgetFull))]
pub async fn restore_version(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, id)): ApiPath<(String, i64)>,
) -> ApiResult<Json<Restored>> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Write).await?)?;
    let restored = version_meta(&app, &doc, id).await?;
    let state = content(&app, &doc, At::Version(id), Form::StateV2).await?;
    // The restore records a version: refused before it changes anything if that would not
    // fit the document's version budget.
    let budget = app.config.max_version_bytes;
    if app.api.kept_version_bytes(doc.id).await? + state.len() as u64 > budget {
        app.metrics.versions_refused.inc();
        return Err(budget_full(budget));
    }
    // One restore of a document at a time (they all run on its owner): two computed from
    // the same content would each insert the text deleted since, twice over.
    let one_at_a_time = merge_lock(&app, doc.id).await?;
    // The current content, committed, from the room (this node owns it: `on_owner`).
    let current = current(&app, &doc, Form::UpdateV1).await?;
    if let Some(hold) = &app.hooks.restore_hold {
        let _ = tokio::time::timeout(std::time::Duration::from_millis(500), hold.wait()).await;
    }
    let client = history::server_client_id();
    let admission = app.gate.admit(doc.id).await?;
    let update = heavy(admission, move || {
        history::restore_update(&state, &current, client).map_err(stored_invalid)
    })
    .await?;
    // The admission the recorded version's content needs, taken before anything changes:
    // once the restore is applied, nothing may refuse it its version (a client told to retry
    // would restore again).
    let for_version = app.gate.admit(doc.id).await?;
    let seq = apply(&app, &doc, &principal, update).await?;
    // The content at the restore's position; should a snapshot without history have taken
    // that position's rows meanwhile, the content at the last position, read in one go.
    let at_seq = content_with(
        &app,
        &doc,
        At::Position(seq),
        Form::StateV2,
        Some(for_version),
    );
    let (seq_recorded, recorded) = match at_seq.await {
        Ok(found) => (seq, found),
        Err(e) if e.status == StatusCode::GONE => state_now(&app, &doc).await?,
        Err(e) => return Err(e),
    };
    drop(one_at_a_time);
    // The restore is made: its version is recorded whatever the budget says now (checked
    // above), so an applied restore always has its version.
    let version = record(
        &app,
        &doc,
        seq_recorded,
        recorded,
        (
            VersionKind::Restore,
            Some(format!("restored version {}", restored.id)),
        ),
        &principal,
        u64::MAX,
    )
    .await?;
    Ok(Json(Restored { seq, version }))
}

/// The document's content at its last position (Yjs v2), read in one database snapshot and
/// rebuilt on the blocking pool without asking the gate: the rare second try of a restore
/// already applied (one per document at a time, behind the restore lock).
async fn state_now(app: &AppState, doc: &DocMeta) -> ApiResult<(i64, Bytes)> {
    let rows: StateAt = app
        .api
        .state_at(doc.id, None)
        .await?
        .ok_or_else(|| not_retained("the last position"))?;
    let seq = rows.seq;
    let state = tokio::task::spawn_blocking(move || {
        let content = history::rebuild(&rows).map_err(stored_invalid)?;
        encode(&content, Form::StateV2)
    })
    .await
    .map_err(|e| stored_invalid(e.to_string()))??;
    Ok((seq, state))
}

type RestoreLocks =
    std::sync::Mutex<std::collections::HashMap<i64, std::sync::Arc<tokio::sync::Mutex<()>>>>;

/// The restore lock of each document being restored on this node.
fn restore_locks() -> &'static RestoreLocks {
    static LOCKS: std::sync::OnceLock<RestoreLocks> = std::sync::OnceLock::new();
    LOCKS.get_or_init(Default::default)
}

fn restore_lock(doc: i64) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    let mut locks = restore_locks()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(doc).or_default().clone()
}

/// The document's merge lock held: one restore, merge or reject of it at a time (they all
/// run on its owner); given back, and forgotten once no one waits for it, when dropped.
pub(super) struct MergeLock {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    doc: i64,
}

impl Drop for MergeLock {
    fn drop(&mut self) {
        drop(self.guard.take());
        forget_restore_lock(self.doc);
    }
}

/// Takes the document's merge lock, waiting at most `merge_lock_wait` (503
/// `document-busy-merging` past it). A caller holds no slot of the gate while it waits: it
/// is admitted once it holds the lock.
pub(super) async fn merge_lock(app: &AppState, doc: i64) -> ApiResult<MergeLock> {
    let lock = restore_lock(doc);
    let waited = tokio::time::timeout(app.config.merge_lock_wait, lock.lock_owned()).await;
    match waited {
        Ok(guard) => Ok(MergeLock {
            guard: Some(guard),
            doc,
        }),
        Err(_) => {
            forget_restore_lock(doc);
            app.metrics
                .heavy_refused
                .with_label_values(&["merge_lock"])
                .inc();
            let mut busy = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "document-busy-merging",
                "another merge, reject or restore of this document is under way and did not end \
                 within merge_lock_wait; retry after the time in Retry-After",
            );
            busy.retry_after = Some(std::time::Duration::from_secs(1));
            Err(busy)
        }
    }
}

/// Drops the document's lock once no restore holds or waits for it.
fn forget_restore_lock(doc: i64) {
    let mut locks = restore_locks()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if locks
        .get(&doc)
        .is_some_and(|l| std::sync::Arc::strong_count(l) == 1)
    {
        locks.remove(&doc);
    }
}

/// Applies `update` (Yjs v1) through the document's room as `principal`'s change; the log
/// position it was committed at.
async fn apply(
    app: &AppState,
    doc: &DocMeta,
    principal: &Principal,
    update: Vec<u8>,
) -> ApiResult<i64> {
    let raw = bytes::Bytes::from(update);
    let author: std::sync::Arc<str> = principal.user.as_str().into();
    let result = ask_room(app, &doc.name, |reply| {
        RoomCmd::Apply(Box::new(ApplyCmd {
            raw: raw.clone(),
            update: Update::decode_v1(&raw).unwrap_or_else(|_| Update::new()),
            reply,
            author: Some(author.clone()),
            budget: None,
            then: Vec::new(),
        }))
    })
    .await?;
    applied(result, stored_invalid)
}

/// The name (and title) of a document a fork or a branch creates, checked: a valid name,
/// a title within its limit, and write permission on the name.
pub(super) fn new_doc_name(principal: &Principal, name: &str, title: &str) -> ApiResult<DocName> {
    let new_name = DocName::parse(name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    if title.len() > field_limits::TITLE {
        return Err(ApiError::bad_request(
            "field-too-long",
            format!("title is longer than {} bytes", field_limits::TITLE),
        ));
    }
    if principal.permission_on(new_name.as_str(), None) < Some(Permission::Write) {
        return Err(ApiError::forbidden(
            "write permission on the new name is required",
        ));
    }
    Ok(new_name)
}

/// The first log row of a new document holding `update` (a fork's or a branch's content,
/// read from `source`): refused over `max_doc_size`; what it inserts and deletes, and its
/// client ids, counted off the runtime under an admission; attributed to the caller.
pub(super) async fn first_row(
    app: &AppState,
    source: &DocMeta,
    update: Bytes,
    principal: &Principal,
    what: &str,
) -> ApiResult<crate::storage::LogEntry> {
    if update.len() as u64 > app.registry.config.max_doc_size {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "document-too-large",
            format!("{what} would exceed max_doc_size"),
        ));
    }
    let admission = app.gate.admit(source.id).await?;
    let data = update.clone();
    let changes = heavy(admission, move || {
        let doc = yrs::Doc::new();
        let decoded = Update::decode_v1(&data).map_err(|e| stored_invalid(e.to_string()))?;
        let mut txn = doc.transact_mut();
        txn.apply_update(decoded)
            .map_err(|e| stored_invalid(e.to_string()))?;
        Ok(crate::room::Changes::of(&txn))
    })
    .await?;
    Ok(crate::storage::LogEntry {
        data: update,
        author: Some(principal.user.as_str().into()),
        inserted: changes.inserted,
        deleted: changes.deleted,
        clients: changes.clients,
    })
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Fork {
    /// The new document's name.
    pub name: String,
    #[serde(default)]
    pub title: String,
    /// A version of the document to start from.
    pub version: Option<i64>,
    /// Or a time (RFC 3339) within the retained history.
    pub at: Option<String>,
    /// Or a log position. None of the three: the current content.
    pub at_position: Option<i64>,
}

/// A new document with this one's content at a version, a time or now.
#[utoipa::path(post, path = "/api/v1/docs/{name}/fork", request_body = Fork,
    params(("name" = String, Path, description = "The document's name, percent-encoded"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = DocMeta, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, NotJson, Unprocessable, Busy, Unavailable))]
pub async fn fork(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<Fork>,
) -> ApiResult<Response> {
    let source = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    let new_name = new_doc_name(&principal, &body.name, &body.title)?;
    // Without the deleted content the history document keeps (`Form::UpdateV1`).
    let update = match (body.version, &body.at, body.at_position) {
        (Some(id), None, None) => {
            version_meta(&app, &source, id).await?;
            content(&app, &source, At::Version(id), Form::UpdateV1).await?
        }
        (None, at, at_position) => {
            match position(&app, &source, at.as_deref(), at_position).await? {
                Some(seq) => {
                    check_position(&app, &source, seq).await?;
                    content(&app, &source, At::Position(seq), Form::UpdateV1).await?
                }
                None => latest(&app, &source, Form::UpdateV1).await?.1,
            }
        }
        _ => {
            return Err(ApiError::bad_request(
                "invalid-fork",
                "give at most one of version, at and at_position",
            ))
        }
    };
    // The document and its content in one transaction: a fork exists whole or not at all,
    // so a failed one leaves no empty document behind and its retry can take the name.
    let first = first_row(&app, &source, update, &principal, "the fork").await?;
    let created = created_doc(
        app.api
            .create_doc_with(
                new_name.as_str(),
                &body.title,
                Some(&principal.user),
                Some(first),
            )
            .await?,
    )?;
    Ok(created_response(&created, &created, Some(created.version)))
}
