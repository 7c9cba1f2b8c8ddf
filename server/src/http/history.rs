//! The version history routes under `/api/v1/docs/{name}/` (docs/history.md): sessions,
//! versions, content at a time or position, diffs, restore and fork.
//!
//! Reads come from storage on any node (the log, the versions and the snapshot are the
//! committed truth); a restore goes through the document's room, on its owner (`on_owner`).

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, StateVector, Transact, Update};

use super::api::{
    applied, ask_room, decode_cursor, doc_for, doc_path, encode_cursor, field_limits, live,
    ApiResult,
};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::gate::{At, Form, Key};
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

fn not_retained(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "not-retained",
        format!("{what} is older than the retained history (history_retention)"),
    )
}

/// Checks that `seq` is one of the document's positions (0 to the last).
async fn check_position(app: &AppState, doc: &DocMeta, seq: i64) -> ApiResult<()> {
    let last = app.api.last_seq(doc.id).await?;
    if seq < 0 || seq > last {
        return Err(ApiError::bad_request(
            "position-out-of-range",
            format!("the document's positions are 0 to {last}"),
        ));
    }
    Ok(())
}

/// The content at `at` in `form`: computed once through the heavy-work gate (admitted, then
/// read and rebuilt on the blocking pool) and cached, so repeated reads cost one rebuild.
pub(super) async fn content(app: &AppState, doc: &DocMeta, at: At, form: Form) -> ApiResult<Bytes> {
    content_with(app, doc, at, form, None).await
}

/// The content now (at the document's last position) in `form`, as [`content`]. The last
/// position is read first and its content then; should a snapshot that keeps no history take
/// its rows in between (410), the new last position is read again.
pub(super) async fn latest(app: &AppState, doc: &DocMeta, form: Form) -> ApiResult<(i64, Bytes)> {
    let mut tries = 0;
    loop {
        let seq = last_position(app, doc).await?;
        match content(app, doc, At::Position(seq), form).await {
            Err(e) if e.status == StatusCode::GONE && tries < 3 => tries += 1,
            found => return found.map(|bytes| (seq, bytes)),
        }
    }
}

/// [`content`] with an admission taken beforehand (a restore takes the one its recorded
/// version needs before it changes anything, so that step cannot be refused afterwards).
async fn content_with(
    app: &AppState,
    doc: &DocMeta,
    at: At,
    form: Form,
    admitted: Option<crate::gate::Admission>,
) -> ApiResult<Bytes> {
    // A cached position the prune job has since removed is gone, as it would be rebuilt.
    if let At::Position(seq) = at {
        if !app.api.position_retained(doc.id, seq).await? {
            return Err(not_retained(&format!("position {seq}")));
        }
    }
    let key = Key {
        doc: doc.id,
        at,
        form,
    };
    app.gate
        .cached(key, async {
            // Admitted before anything is read: the rows of a large document are its cost too.
            let admission = match admitted {
                Some(admission) => admission,
                None => app.gate.admit(doc.id).await?,
            };
            match at {
                At::Position(seq) => {
                    let rows: StateAt = app
                        .api
                        .state_at(doc.id, Some(seq))
                        .await?
                        .ok_or_else(|| not_retained(&format!("position {seq}")))?;
                    heavy(admission, move || {
                        let content = history::rebuild(&rows).map_err(stored_invalid)?;
                        encode(&content, form)
                    })
                    .await
                }
                At::Version(id) => {
                    let (_, state) = version_of(app, doc, id).await?;
                    if form == Form::StateV2 {
                        return Ok(Bytes::from(state));
                    }
                    heavy(admission, move || {
                        let content = history::from_state(&state).map_err(stored_invalid)?;
                        encode(&content, form)
                    })
                    .await
                }
            }
        })
        .await
}

/// The committed content now in `form` (`Json` or `UpdateV1`), through the gate and its
/// cache like [`content`]: replayed from the committed copy of the document's room where
/// this node serves it (loading it on a single node; a stalled room's copy answers at once),
/// else from storage at its last position.
pub(super) async fn current(app: &AppState, doc: &DocMeta, form: Form) -> ApiResult<Bytes> {
    let name = DocName::parse(&doc.name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    // The room where this node serves the document (loading it on a single node); a cached
    // answer at its committed position costs the room nothing more than naming it.
    let room = if app.registry.config.lease.is_none() {
        let room = app
            .registry
            .get_or_start(&name)
            .map_err(|_| room_unavailable())?;
        Some(room)
    } else {
        app.registry.get(&name)
    };
    if let Some(room) = &room {
        let (reply, answer) = tokio::sync::oneshot::channel();
        if room.command(RoomCmd::CommittedSeq { reply }).await.is_ok() {
            let seq = tokio::time::timeout(super::api::ROOM_TIMEOUT, answer).await;
            if let Ok(Ok(Some(seq))) = seq {
                let key = Key {
                    doc: doc.id,
                    at: At::Position(seq),
                    form,
                };
                if let Some(hit) = app.gate.peek(&key) {
                    return Ok(hit);
                }
            }
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        if room.command(RoomCmd::ReadCommitted { reply }).await.is_ok() {
            let source = tokio::time::timeout(super::api::ROOM_TIMEOUT, answer).await;
            if let Ok(Ok(Some(source))) = source {
                // The room's copy, replayed off the room.
                let key = Key {
                    doc: doc.id,
                    at: At::Position(source.seq()),
                    form,
                };
                return app
                    .gate
                    .cached(key, async {
                        let admission = app.gate.admit(doc.id).await?;
                        heavy(admission, move || {
                            let content = source.replay().map_err(stored_invalid)?;
                            encode(&content, form)
                        })
                        .await
                    })
                    .await;
            }
        }
    }
    // Served by another node (or none), or the room keeps no usable copy: storage answers.
    app.metrics.stored_reads.inc();
    Ok(latest(app, doc, form).await?.1)
}

fn room_unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "document-unavailable",
        "the document could not be loaded; retry later",
    )
}

/// Runs `work` on the blocking pool under `admission`.
pub(super) async fn heavy<T: Send + 'static>(
    admission: crate::gate::Admission,
    work: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    admission
        .run(work)
        .await
        .ok_or_else(|| stored_invalid("the computation panicked".into()))?
}

/// `content` in `form`.
fn encode(content: &yrs::Doc, form: Form) -> ApiResult<Bytes> {
    Ok(Bytes::from(match form {
        Form::Json => json_bytes(&crate::room::doc_json(content)),
        Form::StateV2 => state_of(content)?,
        // Without the deleted content a history document keeps (rebuilt content skips
        // garbage collection): the update a live room would send.
        Form::UpdateV1 => {
            let state = state_of(content)?;
            let collected = yrs::Doc::new();
            let decoded = Update::decode_v2(&state).map_err(|e| stored_invalid(e.to_string()))?;
            collected
                .transact_mut()
                .apply_update(decoded)
                .map_err(|e| stored_invalid(e.to_string()))?;
            let v1 = collected
                .transact()
                .encode_state_as_update_v1(&StateVector::default());
            v1
        }
    }))
}

/// A JSON value as the bytes of a response body.
pub(super) fn json_bytes(value: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec())
}

/// A whole-document answer as a response. Sending it costs as much as the document too (a
/// cached answer of a 20 MB document is 20 MB to write), so its body is sent under an
/// admission of the gate, held until the body is written or the client goes.
pub(super) async fn send_whole(
    app: &AppState,
    doc: &DocMeta,
    body: Bytes,
    content_type: &'static str,
) -> ApiResult<Response> {
    let admission = app.gate.admit(doc.id).await?;
    let len = body.len();
    let stream = Sending {
        body,
        sent: 0,
        _admission: admission,
    };
    let mut resp = Response::new(axum::body::Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok(resp)
}

/// [`send_whole`]'s body: slices of the answer (no copy), with the admission.
struct Sending {
    body: Bytes,
    sent: usize,
    _admission: crate::gate::Admission,
}

/// Bytes handed to the connection at a time.
const SEND_CHUNK: usize = 256 << 10;

impl futures_util::Stream for Sending {
    type Item = Result<Bytes, std::convert::Infallible>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let (start, len) = (self.sent, self.body.len());
        if start >= len {
            return std::task::Poll::Ready(None);
        }
        let end = (start + SEND_CHUNK).min(len);
        self.sent = end;
        std::task::Poll::Ready(Some(Ok(self.body.slice(start..end))))
    }
}

/// The document's last position.
async fn last_position(app: &AppState, doc: &DocMeta) -> ApiResult<i64> {
    Ok(app.api.last_seq(doc.id).await?)
}

/// The full state of `content` (Yjs v2), or 409 while it holds an update waiting for
/// missing dependencies (yrs cannot encode that reliably; the room waits too).
fn state_of(content: &yrs::Doc) -> ApiResult<Vec<u8>> {
    history::encode_state(content).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "pending-update",
            "the document holds an update whose dependencies have not arrived; retry once it \
             is complete",
        )
    })
}

fn stored_invalid(e: String) -> ApiError {
    tracing::error!(error = %e, "stored history does not decode");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "the stored history could not be read",
    )
}

/// Milliseconds since the epoch of an RFC 3339 time (`2026-12-01T09:30:00Z`, with a
/// fraction or an offset such as `+02:00`).
pub fn parse_time(text: &str) -> Option<i64> {
    let text = text.trim();
    // humantime reads UTC (`Z`) times; an offset is applied here.
    // (Any input comes here: slices are taken with `get`, never across a character.)
    let split = text
        .len()
        .checked_sub(6)
        .and_then(|i| Some((text.get(..i)?, text.get(i..)?)));
    let (base, offset_secs) = match split {
        Some((base, off))
            if (off.starts_with('+') || off.starts_with('-')) && off.get(3..4) == Some(":") =>
        {
            let hours: i64 = off.get(1..3)?.parse().ok()?;
            let minutes: i64 = off.get(4..6)?.parse().ok()?;
            let sign = if off.starts_with('-') { -1 } else { 1 };
            (format!("{base}Z"), sign * (hours * 3600 + minutes * 60))
        }
        _ => (text.to_owned(), 0),
    };
    let time = humantime::parse_rfc3339_weak(&base).ok()?;
    let ms = time.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis();
    Some(i64::try_from(ms).ok()? - offset_secs * 1000)
}

/// Where `at` (RFC 3339) or `at_position` points in the log (`None`: the last position).
async fn position(
    app: &AppState,
    doc: &DocMeta,
    at: Option<&str>,
    at_position: Option<i64>,
) -> ApiResult<Option<i64>> {
    match (at, at_position) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "invalid-query",
            "give at or at_position, not both",
        )),
        (None, Some(seq)) => Ok(Some(seq)),
        (Some(t), None) => {
            let ms = parse_time(t).ok_or_else(|| {
                ApiError::bad_request("invalid-time", "at is not an RFC 3339 time")
            })?;
            if ms >= crate::storage::now_ms() {
                return Ok(None);
            }
            app.api
                .position_at(doc.id, ms)
                .await?
                .map(Some)
                .ok_or_else(|| not_retained(&format!("the time {t}")))
        }
        (None, None) => Ok(None),
    }
}

/// The content of `GET /json?at=...` or `?at_position=...`.
pub(super) async fn json_at(
    app: &AppState,
    doc: &DocMeta,
    at: Option<&str>,
    at_position: Option<i64>,
) -> ApiResult<Response> {
    let json = match position(app, doc, at, at_position).await? {
        Some(seq) => {
            check_position(app, doc, seq).await?;
            content(app, doc, At::Position(seq), Form::Json).await?
        }
        None => latest(app, doc, Form::Json).await?.1,
    };
    send_whole(app, doc, json, "application/json").await
}

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
async fn record(
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
fn budget_full(budget: u64) -> ApiError {
    ApiError::new(
        StatusCode::INSUFFICIENT_STORAGE,
        "version-budget-full",
        format!(
            "the document's named and restore versions would hold more than \
             max_version_bytes ({budget} bytes); delete versions it no longer needs"
        ),
    )
}

/// The version's row (without its state), or 404.
async fn version_meta(app: &AppState, doc: &DocMeta, id: i64) -> ApiResult<Version> {
    app.api
        .version(doc.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("version"))
}

/// The version, or 404.
async fn version_of(app: &AppState, doc: &DocMeta, id: i64) -> ApiResult<(Version, Vec<u8>)> {
    app.api
        .version_state(doc.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("version"))
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
    send_whole(&app, &doc, json, "application/json").await
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
    let lock = restore_lock(doc.id);
    let _one_at_a_time = lock.lock().await;
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
    drop(_one_at_a_time);
    drop(lock);
    forget_restore_lock(doc.id);
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
        }))
    })
    .await?;
    applied(result, stored_invalid)
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
    let new_name = DocName::parse(&body.name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    if body.title.len() > field_limits::TITLE {
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
    if update.len() as u64 > app.registry.config.max_doc_size {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "document-too-large",
            "the fork would exceed max_doc_size",
        ));
    }
    // What the content's row records for the history (counted off the runtime).
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
    // The document and its content in one transaction: a fork exists whole or not at all,
    // so a failed one leaves no empty document behind and its retry can take the name.
    let first = crate::storage::LogEntry {
        data: update,
        author: Some(principal.user.as_str().into()),
        inserted: changes.inserted,
        deleted: changes.deleted,
        clients: changes.clients,
    };
    let created = app
        .api
        .create_doc_with(
            new_name.as_str(),
            &body.title,
            Some(&principal.user),
            Some(first),
        )
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "document-exists",
                "a document with this name exists",
            )
        })?;
    let mut resp = (StatusCode::CREATED, Json(&created)).into_response();
    if let Ok(v) = HeaderValue::from_str(&crate::problem::etag(created.version)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    if let Ok(loc) = HeaderValue::from_str(&format!("/api/v1/docs/{}", doc_path(&created.name))) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::parse_time;

    #[test]
    fn times_are_rfc_3339_with_any_offset() {
        assert_eq!(parse_time("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(parse_time("1970-01-01T00:00:01.250Z"), Some(1250));
        assert_eq!(parse_time("1970-01-01T02:00:01+02:00"), Some(1000));
        assert_eq!(parse_time("1970-01-01T00:00:01-01:00"), Some(3_601_000));
        assert_eq!(parse_time("yesterday"), None);
        assert_eq!(parse_time("2026-13-01T00:00:00Z"), None);
        // Multi-byte characters where an offset would be: no panic, just no time.
        assert_eq!(parse_time("2026-01-01T00:00:00é:00"), None);
        assert_eq!(parse_time("ééééé"), None);
    }
}
