//! What the API's handlers share: finding a document and checking the caller's permission,
//! asking its room, versions in ETags, page cursors, field limits, and telling the sockets of
//! a change.

use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use base64::Engine;
use serde::Serialize;
use tokio::sync::oneshot;

use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::bus::Change;
use crate::problem::{etag, ApiError};
use crate::room::{ApplyError, DocName, RoomCmd};
use crate::storage::api::DocMeta;

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// Most documents per page of `GET /docs`.
pub(super) const MAX_PAGE: u32 = 200;
/// How long a content request waits for the room (loading included).
pub(super) const ROOM_TIMEOUT: Duration = Duration::from_secs(30);

pub(super) fn with_etag<T: Serialize>(status: StatusCode, body: &T, version: i64) -> Response {
    let mut resp = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&etag(version)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// What a store's create returned (`None`: the name is taken) as the new document, or 409
/// `document-exists`: one answer for a create, a fork and a branch.
pub(super) fn created_doc(created: Option<DocMeta>) -> ApiResult<DocMeta> {
    created.ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "document-exists",
            "a document with this name exists",
        )
    })
}

/// 201 with `body` and the new document's `Location` (and its ETag, when `etag` holds its
/// version).
pub(super) fn created_response<T: Serialize>(
    doc: &DocMeta,
    body: &T,
    etag: Option<i64>,
) -> Response {
    let mut resp = match etag {
        Some(version) => with_etag(StatusCode::CREATED, body, version),
        None => (StatusCode::CREATED, Json(body)).into_response(),
    };
    if let Ok(loc) = HeaderValue::from_str(&format!("/api/v1/docs/{}", doc_path(&doc.name))) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    resp
}

/// The version an `If-Match` header names. Missing: 428.
pub(super) fn if_match(headers: &HeaderMap) -> ApiResult<i64> {
    let value = headers.get(header::IF_MATCH).ok_or_else(|| {
        ApiError::new(
            StatusCode::PRECONDITION_REQUIRED,
            "if-match-required",
            "send If-Match with the ETag of the version you read",
        )
    })?;
    // If-Match compares strongly: a weak validator (W/"3") or `*` names no version.
    let text = value.to_str().unwrap_or("").trim();
    let text = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or("");
    text.parse().map_err(|_| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "version-mismatch",
            "If-Match does not name a version of this resource",
        )
    })
}

/// A document's name as it appears in a `/api/v1/docs/{name}` path: percent-encoded, so
/// any name (with `/`, spaces or `?` in it) is one path segment.
pub fn doc_path(name: &str) -> String {
    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The document, checked for existence and the caller's permission on it.
pub(super) async fn doc_for(
    app: &AppState,
    principal: &Principal,
    name: &str,
    need: Permission,
) -> ApiResult<DocMeta> {
    let doc = app
        .api
        .get_doc_by_name(name)
        .await?
        .ok_or_else(|| ApiError::not_found("document"))?;
    let role = app.api.get_role(doc.id, &principal.user).await?;
    match principal.permission_on(&doc.name, role) {
        None => Err(ApiError::not_found("document")),
        Some(p) if p < need => Err(ApiError::forbidden(&format!(
            "{need:?} permission is required on this document"
        ))),
        Some(_) => Ok(doc),
    }
}

pub(super) fn live(doc: DocMeta) -> ApiResult<DocMeta> {
    if doc.deleted_at.is_some() {
        return Err(ApiError::new(
            StatusCode::GONE,
            "document-deleted",
            "the document is deleted; restore it first",
        ));
    }
    Ok(doc)
}

/// Sends a command to the document's room (loading it if needed) and waits for the answer.
pub(super) async fn ask_room<T>(
    app: &AppState,
    name: &str,
    mut make: impl FnMut(oneshot::Sender<T>) -> RoomCmd,
) -> ApiResult<T> {
    let name = DocName::parse(name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    let unavailable = || {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "document-unavailable",
            "the document could not be loaded or committed; retry later",
        )
    };
    // A room that is unloading at this moment answers nothing: ask the next one.
    for _ in 0..4 {
        let room = app
            .registry
            .get_or_start(&name)
            .map_err(|_| unavailable())?;
        let (tx, rx) = oneshot::channel();
        if room.command(make(tx)).await.is_err() {
            continue;
        }
        match tokio::time::timeout(ROOM_TIMEOUT, rx).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(_)) => continue,
            Err(_) => return Err(unavailable()),
        }
    }
    Err(unavailable())
}

/// Longest accepted text fields, in bytes of UTF-8 (a longer one gets 400 `field-too-long`).
pub mod field_limits {
    /// A document's title.
    pub const TITLE: usize = 1024;
    /// A user id: a token subject, a document owner, a user in an access entry.
    pub const USER_ID: usize = 255;
    /// A profile's display name.
    pub const DISPLAY_NAME: usize = 256;
    /// A profile's colour (`#rrggbb`, or any CSS colour).
    pub const COLOR: usize = 64;
    /// A profile's avatar URL.
    pub const AVATAR_URL: usize = 2048;
    /// A token id in a revocation.
    pub const TOKEN_ID: usize = 255;
}

/// 400 if `value` is longer than `max` bytes.
pub(super) fn check_len(field: &str, value: Option<&str>, max: usize) -> ApiResult<()> {
    match value {
        Some(v) if v.len() > max => Err(ApiError::bad_request(
            "field-too-long",
            format!("{field} is longer than {max} bytes"),
        )),
        _ => Ok(()),
    }
}

/// A page cursor: `n` behind `kind` (each listing its own, so one listing's cursor is not
/// another's), opaque to clients.
pub(super) fn encode_cursor(kind: &str, n: i64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{kind}:{n}"))
}

/// The number in a cursor of `kind`, or 400 `invalid-cursor`.
pub(super) fn decode_cursor(kind: &str, c: &str) -> ApiResult<i64> {
    let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .ok()
        .and_then(|raw| String::from_utf8(raw).ok())
        .and_then(|s| s.strip_prefix(kind)?.strip_prefix(':')?.parse().ok());
    decoded.ok_or_else(|| {
        ApiError::bad_request("invalid-cursor", "the cursor is not one this server issued")
    })
}

pub(super) fn live_err() -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "document-deleted",
        "the document is deleted",
    )
}

/// The log position an update applied through the room was committed at, or the error for
/// why it was not (`invalid`: how to answer an update yrs refused).
pub(super) fn applied(
    result: Result<i64, ApplyError>,
    invalid: impl FnOnce(String) -> ApiError,
) -> ApiResult<i64> {
    match result {
        Ok(seq) => Ok(seq),
        Err(ApplyError::Invalid(e)) => Err(invalid(e)),
        Err(ApplyError::Unavailable) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "document-unavailable",
            "the document's storage is not answering; retry later",
        )),
        Err(ApplyError::TooLarge) => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "document-too-large",
            "the document would exceed max_doc_size",
        )),
        Err(ApplyError::Missing(e)) => Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "update-missing-dependencies",
            e,
        )),
        Err(ApplyError::EditRefused) => Err(invalid("the edit was refused".into())),
    }
}

pub(super) async fn role_changed(app: &AppState, name: &str, user: &str, id: i64) {
    if let Ok(name) = DocName::parse(name) {
        let change = Change::Access {
            user: user.to_owned(),
            id,
        };
        doc_changed(app, &name, change).await;
    }
}

/// Closes the sockets a change affects: this node's at once, every other node's through the
/// bus (the owner closes its room's, each node its relayed connections), and, should the bus
/// lose the announcement, through the `doc_changes` row storage wrote (`crate::changes`).
pub(super) async fn doc_changed(app: &AppState, name: &DocName, change: Change) {
    crate::changes::apply_once(app.bus.as_deref(), &app.registry, name, change.clone()).await;
    if let Some(bus) = &app.bus {
        bus.announce(name, change).await;
    }
}
