//! Whole-document reads under the admission gate (`crate::gate`): the content at a log
//! position, at a version, or now (replayed from the room's committed copy, off the room),
//! encoded in the form asked for, and sent in chunks under an admission.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, StateVector, Transact, Update};

use super::shared::ApiResult;
use crate::app::AppState;
use crate::gate::{At, Form, Key};
use crate::history::{self};
use crate::problem::ApiError;
use crate::room::{DocName, RoomCmd};
use crate::storage::api::DocMeta;
use crate::storage::history::{StateAt, Version};
use bytes::Bytes;

pub(super) fn not_retained(what: &str) -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "not-retained",
        format!("{what} is older than the retained history (history_retention)"),
    )
}

/// Checks that `seq` is one of the document's positions (0 to the last).
pub(super) async fn check_position(app: &AppState, doc: &DocMeta, seq: i64) -> ApiResult<()> {
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
pub(super) async fn content_with(
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
    Ok(current_at(app, doc, form).await?.1)
}

/// [`current`] and the log position it is the content at.
pub(super) async fn current_at(
    app: &AppState,
    doc: &DocMeta,
    form: Form,
) -> ApiResult<(i64, Bytes)> {
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
            let seq = tokio::time::timeout(super::shared::ROOM_TIMEOUT, answer).await;
            if let Ok(Ok(Some(seq))) = seq {
                let key = Key {
                    doc: doc.id,
                    at: At::Position(seq),
                    form,
                };
                if let Some(hit) = app.gate.peek(&key) {
                    return Ok((seq, hit));
                }
            }
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        if room.command(RoomCmd::ReadCommitted { reply }).await.is_ok() {
            let source = tokio::time::timeout(super::shared::ROOM_TIMEOUT, answer).await;
            if let Ok(Ok(Some(source))) = source {
                // The room's copy, replayed off the room.
                let seq = source.seq();
                let key = Key {
                    doc: doc.id,
                    at: At::Position(seq),
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
                    .await
                    .map(|content| (seq, content));
            }
        }
    }
    // Served by another node (or none), or the room keeps no usable copy: storage answers.
    app.metrics.stored_reads.inc();
    latest(app, doc, form).await
}

pub(super) fn room_unavailable() -> ApiError {
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
pub(super) fn encode(content: &yrs::Doc, form: Form) -> ApiResult<Bytes> {
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

/// A whole-document answer as a response. The admission paid for computing it; sending it
/// takes no slot of the gate: the bytes are the cache's (shared, never copied), the caller's
/// own `heavy_per_caller` slot is held until they are sent, and a client that stops reading
/// is disconnected after `write_timeout` (`listen.rs`).
pub(super) async fn send_whole(body: Bytes, content_type: &'static str) -> ApiResult<Response> {
    let len = body.len();
    let stream = Sending { body, sent: 0 };
    let mut resp = Response::new(axum::body::Body::from_stream(stream));
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    Ok(resp)
}

/// [`send_whole`]'s body: slices of the answer (no copy).
pub(super) struct Sending {
    body: Bytes,
    sent: usize,
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
pub(super) async fn last_position(app: &AppState, doc: &DocMeta) -> ApiResult<i64> {
    Ok(app.api.last_seq(doc.id).await?)
}

/// The full state of `content` (Yjs v2), or 409 while it holds an update waiting for
/// missing dependencies (yrs cannot encode that reliably; the room waits too).
pub(super) fn state_of(content: &yrs::Doc) -> ApiResult<Vec<u8>> {
    history::encode_state(content).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "pending-update",
            "the document holds an update whose dependencies have not arrived; retry once it \
             is complete",
        )
    })
}

pub(super) fn stored_invalid(e: String) -> ApiError {
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
pub(super) async fn position(
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
    send_whole(json, "application/json").await
}

/// The version's row (without its state), or 404.
pub(super) async fn version_meta(app: &AppState, doc: &DocMeta, id: i64) -> ApiResult<Version> {
    app.api
        .version(doc.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("version"))
}

/// The version, or 404.
pub(super) async fn version_of(
    app: &AppState,
    doc: &DocMeta,
    id: i64,
) -> ApiResult<(Version, Vec<u8>)> {
    app.api
        .version_state(doc.id, id)
        .await?
        .ok_or_else(|| ApiError::not_found("version"))
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
