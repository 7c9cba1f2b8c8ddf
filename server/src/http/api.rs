//! The REST API under `/api/v1`: documents, content (through the room task), access, profiles,
//! tokens, revocations and the outbox. The OpenAPI document is generated from these handlers.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Extension, Json, Router};

use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
use crate::problem::responses::*;
use base64::Engine;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use utoipa::{IntoParams, OpenApi, ToSchema};
use yrs::updates::decoder::Decode;
use yrs::{StateVector, Update};

use super::history;
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::bus::Change;
use crate::gate::Form;
use crate::problem::{etag, ApiError, Problem};
use crate::room::{ApplyCmd, ApplyError, DocName, RoomCmd};
use crate::storage::api::{
    DeadEvent, DocMeta, DocPatch, DocQuery, OutboxEvent, Revocation, Role, UserPatch, UserProfile,
    Versioned,
};

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// Most documents per page of `GET /docs`.
const MAX_PAGE: u32 = 200;
/// How long a content request waits for the room (loading included).
pub(super) const ROOM_TIMEOUT: Duration = Duration::from_secs(30);

pub fn routes(app: &AppState) -> Router<AppState> {
    // Content writes go through the document's room: on the owner's node (see `owner.rs`).
    let on_owner = || axum::middleware::from_fn_with_state(app.clone(), super::owner::on_owner);
    Router::new()
        .route("/docs", post(create_doc).get(list_docs))
        .route(
            "/docs/{name}",
            get(get_doc).patch(patch_doc).delete(delete_doc),
        )
        .route("/docs/{name}/restore", post(restore_doc))
        .route(
            "/docs/{name}/update",
            get(get_update).merge(post(post_update).route_layer(on_owner())),
        )
        .route("/docs/{name}/json", get(get_json))
        .route(
            "/docs/{name}/stateless",
            post(post_stateless).route_layer(on_owner()),
        )
        .route("/docs/{name}/history", get(history::get_history))
        .route(
            "/docs/{name}/versions",
            get(history::list_versions).post(history::create_version),
        )
        .route(
            "/docs/{name}/versions/{id}",
            axum::routing::delete(history::delete_version),
        )
        .route(
            "/docs/{name}/versions/{id}/json",
            get(history::version_json),
        )
        .route(
            "/docs/{name}/versions/{id}/restore",
            post(history::restore_version).route_layer(on_owner()),
        )
        .route("/docs/{name}/diff", get(history::get_diff))
        .route("/docs/{name}/fork", post(history::fork))
        .route("/docs/{name}/access", get(list_access))
        .route(
            "/docs/{name}/access/{user}",
            put(put_access).delete(delete_access),
        )
        .route("/users/{id}", get(get_user).patch(patch_user))
        .route("/me", get(get_me))
        .route("/tokens", post(issue_token))
        .route("/tokens/revoke", post(revoke))
        .route("/admin/outbox", get(admin_outbox))
        .route("/admin/overview", get(super::admin::overview))
        .route("/admin/docs", get(super::admin::docs))
        .route("/admin/cluster", get(super::admin::cluster))
        .route("/admin/dead/{id}/retry", post(super::admin::retry_dead))
        .route("/admin/stream", get(super::admin::stream))
        .route("/openapi.json", get(openapi_json))
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Quire API", version = "1", description = "Documents, content, access, profiles, tokens and webhooks of a Quire server."),
    paths(
        create_doc, list_docs, get_doc, patch_doc, delete_doc, restore_doc, get_update,
        post_update, post_stateless, get_json, list_access, put_access, delete_access, get_user, patch_user,
        get_me, issue_token, revoke, admin_outbox, super::admin::overview, super::admin::docs,
        super::admin::cluster, super::admin::retry_dead, history::get_history, history::list_versions,
        history::create_version, history::delete_version, history::version_json,
        history::get_diff, history::restore_version, history::fork
    ),
    components(schemas(
        DocMeta, DocPatch, UserProfile, UserPatch, Role, Permission, Problem, CreateDoc, DocPage,
        UpdateApplied, StatelessMessage, StatelessSent, AccessEntry, SetRole, IssueToken, IssuedToken, RevokeRequest, Revocation,
        OutboxView, OutboxEvent, DeadEvent, super::admin::Overview, super::admin::AdminDocs,
        super::admin::AdminDoc, super::admin::ClusterView, crate::storage::api::DocStats,
        crate::storage::api::ClusterRows, crate::storage::api::NodeRow,
        crate::storage::api::LeaseRow, history::HistoryPage, crate::history::Session,
        crate::history::AuthorShare, crate::storage::history::Version,
        crate::storage::history::VersionKind, history::CreateVersion, history::DiffView,
        crate::history::TextDiff, crate::history::Run, history::Restored, history::Fork
    )),
    modifiers(&BearerAuth, &HeaderValues),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
    }
}

/// Every header parameter (Idempotency-Key, If-Match) is a string of 1 to 255 visible ASCII
/// characters: what an HTTP header can carry and what the server accepts. Derived from
/// `Option<String>` they would read as nullable strings of any characters, which no client can
/// send (and a generator such as schemathesis then throws most of its inputs away).
struct HeaderValues;

impl utoipa::Modify for HeaderValues {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::schema::{ObjectBuilder, Type};
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.put,
                &mut item.post,
                &mut item.delete,
                &mut item.patch,
            ];
            let parameters = operations
                .into_iter()
                .flatten()
                .flat_map(|op| op.parameters.iter_mut().flatten());
            for parameter in parameters {
                if matches!(parameter.parameter_in, ParameterIn::Header) {
                    let schema = ObjectBuilder::new()
                        .schema_type(Type::String)
                        .pattern(Some("^[!-~]{1,255}$"))
                        .min_length(Some(1))
                        .max_length(Some(255));
                    parameter.schema = Some(schema.into());
                }
            }
        }
    }
}

/// `GET /api/v1/openapi.json`
pub async fn openapi_json() -> Response {
    match ApiDoc::openapi().to_json() {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            .into_response(),
    }
}

fn with_etag<T: Serialize>(status: StatusCode, body: &T, version: i64) -> Response {
    let mut resp = (status, Json(body)).into_response();
    if let Ok(v) = HeaderValue::from_str(&etag(version)) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// The version an `If-Match` header names. Missing: 428.
fn if_match(headers: &HeaderMap) -> ApiResult<i64> {
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
fn check_len(field: &str, value: Option<&str>, max: usize) -> ApiResult<()> {
    match value {
        Some(v) if v.len() > max => Err(ApiError::bad_request(
            "field-too-long",
            format!("{field} is longer than {max} bytes"),
        )),
        _ => Ok(()),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateDoc {
    /// 1 to 255 bytes of UTF-8, no control characters; the WebSocket path.
    pub name: String,
    #[serde(default)]
    pub title: String,
}

/// Create a document owned by the caller.
#[utoipa::path(post, path = "/api/v1/docs", request_body = CreateDoc,
    params(("Idempotency-Key" = Option<String>, Header, description = "Replays the first response for a repeated request")),
    responses((status = 201, body = DocMeta, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, Conflict, NotJson, Unprocessable))]
async fn create_doc(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<CreateDoc>,
) -> ApiResult<Response> {
    let name = DocName::parse(&body.name)
        .map_err(|e| ApiError::bad_request("invalid-document-name", e.to_string()))?;
    check_len("title", Some(&body.title), field_limits::TITLE)?;
    if principal.permission_on(name.as_str(), None) < Some(Permission::Write) {
        return Err(ApiError::forbidden(
            "write permission on this name is required",
        ));
    }
    let doc = app
        .api
        .create_doc(name.as_str(), &body.title, Some(&principal.user))
        .await?
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                "document-exists",
                "a document with this name exists",
            )
        })?;
    let mut resp = with_etag(StatusCode::CREATED, &doc, doc.version);
    if let Ok(loc) = HeaderValue::from_str(&format!("/api/v1/docs/{}", doc_path(&doc.name))) {
        resp.headers_mut().insert(header::LOCATION, loc);
    }
    Ok(resp)
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only documents with this owner.
    owner: Option<String>,
    /// Only documents whose name starts with this.
    prefix: Option<String>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
    /// Page size, 1 to 200 (default 50).
    limit: Option<u32>,
    /// Include soft-deleted documents.
    deleted: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DocPage {
    pub items: Vec<DocMeta>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// List documents the caller can read, in creation order.
#[utoipa::path(get, path = "/api/v1/docs", params(ListParams),
    responses((status = 200, body = DocPage), BadRequest, Unauthorized))]
async fn list_docs(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(p): ApiQuery<ListParams>,
) -> ApiResult<Json<DocPage>> {
    let limit = p.limit.unwrap_or(50).clamp(1, MAX_PAGE);
    let after_id = match &p.cursor {
        None => None,
        Some(c) => Some(decode_cursor("d", c)?),
    };
    let query = DocQuery {
        owner: p.owner,
        name_prefix: p.prefix,
        after_id,
        // One more than the page, to know whether there is a next page.
        limit: limit + 1,
        include_deleted: p.deleted.unwrap_or(false),
    };
    let mut page = app.api.list_docs(&query).await?;
    let next_cursor = if page.len() as u32 > limit {
        page.truncate(limit as usize);
        page.last().map(|d| encode_cursor("d", d.id))
    } else {
        None
    };
    let items = page
        .into_iter()
        .filter(|d| principal.covers(&d.name))
        .collect();
    Ok(Json(DocPage { items, next_cursor }))
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

/// A document's metadata; the `ETag` carries its version.
#[utoipa::path(get, path = "/api/v1/docs/{name}", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded")),
    responses((status = 200, body = DocMeta, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, NotFound))]
async fn get_doc(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    let doc = doc_for(&app, &principal, &name, Permission::Read).await?;
    Ok(with_etag(StatusCode::OK, &doc, doc.version))
}

/// Change a document's title (write) or owner (admin). Requires `If-Match`.
#[utoipa::path(patch, path = "/api/v1/docs/{name}", request_body = DocPatch,
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("If-Match" = String, Header, description = "ETag of the version read"),
        ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = DocMeta, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Stale, NotJson, Unprocessable, NeedsIfMatch))]
async fn patch_doc(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(patch): ApiJson<DocPatch>,
) -> ApiResult<Response> {
    check_len("title", patch.title.as_deref(), field_limits::TITLE)?;
    check_len("owner", patch.owner.as_deref(), field_limits::USER_ID)?;
    let need = if patch.owner.is_some() {
        Permission::Admin
    } else {
        Permission::Write
    };
    let doc = live(doc_for(&app, &principal, &name, need).await?)?;
    let expected = if_match(&headers)?;
    match app.api.update_doc(doc.id, expected, &patch).await? {
        Versioned::Updated(doc) => Ok(with_etag(StatusCode::OK, &doc, doc.version)),
        Versioned::Stale(doc) if doc.deleted_at.is_some() => Err(live_err()),
        Versioned::Stale(doc) => Err(ApiError::stale(&doc, doc.version)),
        Versioned::NotFound => Err(ApiError::not_found("document")),
    }
}

/// Soft-delete a document: its live sockets close with 4404 and it cannot be opened until
/// restored.
#[utoipa::path(delete, path = "/api/v1/docs/{name}",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = DocMeta), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Gone, Unprocessable))]
async fn delete_doc(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Admin).await?)?;
    match app.api.delete_doc(doc.id).await? {
        Versioned::Updated(doc) => {
            if let Ok(name) = DocName::parse(&doc.name) {
                doc_changed(&app, &name, Change::Deleted).await;
            }
            Ok(with_etag(StatusCode::OK, &doc, doc.version))
        }
        Versioned::Stale(_) => Err(live_err()),
        Versioned::NotFound => Err(ApiError::not_found("document")),
    }
}

fn live_err() -> ApiError {
    ApiError::new(
        StatusCode::GONE,
        "document-deleted",
        "the document is deleted",
    )
}

/// Undo a soft delete.
#[utoipa::path(post, path = "/api/v1/docs/{name}/restore",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = DocMeta), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Unprocessable))]
async fn restore_doc(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Response> {
    let doc = doc_for(&app, &principal, &name, Permission::Admin).await?;
    match app.api.restore_doc(doc.id).await? {
        Versioned::Updated(doc) => Ok(with_etag(StatusCode::OK, &doc, doc.version)),
        Versioned::Stale(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "document-not-deleted",
            "the document is not deleted",
        )),
        Versioned::NotFound => Err(ApiError::not_found("document")),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SvParams {
    /// Base64 (standard or URL-safe) Yjs v1 state vector: only what it lacks is returned.
    sv: Option<String>,
}

/// The document's committed state as a Yjs v1 update (binary).
#[utoipa::path(get, path = "/api/v1/docs/{name}/update", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), SvParams),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), BadRequest, Unauthorized, Forbidden, NotFound, Gone, Busy, Unavailable))]
async fn get_update(
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
    let whole = history::current(&app, &doc, Form::UpdateV1).await?;
    let update = match since {
        None => whole,
        Some(sv) => {
            let admission = app.gate.admit(doc.id).await?;
            let diff = history::heavy(admission, move || {
                yrs::diff_updates_v1(&whole, &sv).map_err(|e| {
                    ApiError::bad_request("invalid-state-vector", format!("sv does not apply: {e}"))
                })
            })
            .await?;
            bytes::Bytes::from(diff)
        }
    };
    history::send_whole(&app, &doc, update, "application/octet-stream").await
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
async fn post_update(
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
async fn post_stateless(
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
    }
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
async fn get_json(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(p): ApiQuery<AtParams>,
) -> ApiResult<Response> {
    let doc = live(doc_for(&app, &principal, &name, Permission::Read).await?)?;
    if p.at.is_some() || p.at_position.is_some() {
        return history::json_at(&app, &doc, p.at.as_deref(), p.at_position).await;
    }
    let json = history::current(&app, &doc, Form::Json).await?;
    history::send_whole(&app, &doc, json, "application/json").await
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AccessEntry {
    pub user: String,
    pub role: Role,
}

/// Who has which role on a document.
#[utoipa::path(get, path = "/api/v1/docs/{name}/access", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded")),
    responses((status = 200, body = Vec<AccessEntry>), BadRequest, Unauthorized, Forbidden, NotFound))]
async fn list_access(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(name): ApiPath<String>,
) -> ApiResult<Json<Vec<AccessEntry>>> {
    let doc = doc_for(&app, &principal, &name, Permission::Read).await?;
    let rows = app.api.list_access(doc.id).await?;
    Ok(Json(
        rows.into_iter()
            .map(|(user, role)| AccessEntry { user, role })
            .collect(),
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetRole {
    pub role: Role,
}

/// Give a user a role on a document. Their open sockets on it close with 4403 and reconnect
/// with the new permissions.
#[utoipa::path(put, path = "/api/v1/docs/{name}/access/{user}", request_body = SetRole,
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("user" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = AccessEntry), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, NotJson, Unprocessable))]
async fn put_access(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, user)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<SetRole>,
) -> ApiResult<Json<AccessEntry>> {
    check_len("user", Some(&user), field_limits::USER_ID)?;
    let doc = doc_for(&app, &principal, &name, Permission::Admin).await?;
    let change = app.api.set_role(doc.id, &user, Some(body.role)).await?;
    role_changed(&app, &doc.name, &user, change).await;
    Ok(Json(AccessEntry {
        user,
        role: body.role,
    }))
}

/// Remove a user's role on a document (their token alone then decides).
#[utoipa::path(delete, path = "/api/v1/docs/{name}/access/{user}",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("user" = String, Path), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 204), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Unprocessable))]
async fn delete_access(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, user)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let doc = doc_for(&app, &principal, &name, Permission::Admin).await?;
    let change = app.api.set_role(doc.id, &user, None).await?;
    role_changed(&app, &doc.name, &user, change).await;
    Ok(StatusCode::NO_CONTENT)
}

async fn role_changed(app: &AppState, name: &str, user: &str, id: i64) {
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
async fn doc_changed(app: &AppState, name: &DocName, change: Change) {
    crate::changes::apply_once(app.bus.as_deref(), &app.registry, name, change.clone()).await;
    if let Some(bus) = &app.bus {
        bus.announce(name, change).await;
    }
}

/// A user's profile.
#[utoipa::path(get, path = "/api/v1/users/{id}", params(("id" = String, Path)),
    responses((status = 200, body = UserProfile, headers(("ETag" = String))), BadRequest, Unauthorized, NotFound))]
async fn get_user(
    State(app): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<Response> {
    let user = app
        .api
        .get_user(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("user"))?;
    Ok(with_etag(StatusCode::OK, &user, user.version))
}

/// Change a profile (your own, or anyone's as an administrator). Requires `If-Match`.
#[utoipa::path(patch, path = "/api/v1/users/{id}", request_body = UserPatch,
    params(("id" = String, Path), ("If-Match" = String, Header), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = UserProfile, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Stale, NotJson, Unprocessable, NeedsIfMatch))]
async fn patch_user(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(patch): ApiJson<UserPatch>,
) -> ApiResult<Response> {
    check_len(
        "display_name",
        patch.display_name.as_deref(),
        field_limits::DISPLAY_NAME,
    )?;
    check_len("color", patch.color.as_deref(), field_limits::COLOR)?;
    check_len(
        "avatar_url",
        patch.avatar_url.as_deref(),
        field_limits::AVATAR_URL,
    )?;
    if principal.user != id && !principal.is_admin() {
        return Err(ApiError::forbidden(
            "only the user or an administrator may change a profile",
        ));
    }
    let expected = if_match(&headers)?;
    match app.api.update_user(&id, expected, &patch).await? {
        Versioned::Updated(u) => Ok(with_etag(StatusCode::OK, &u, u.version)),
        Versioned::Stale(u) => Err(ApiError::stale(&u, u.version)),
        Versioned::NotFound => Err(ApiError::not_found("user")),
    }
}

/// The caller's own profile (created empty on first use).
#[utoipa::path(get, path = "/api/v1/me",
    responses((status = 200, body = UserProfile, headers(("ETag" = String))), Unauthorized))]
async fn get_me(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Response> {
    let user = app.api.ensure_user(&principal.user).await?;
    Ok(with_etag(StatusCode::OK, &user, user.version))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueToken {
    pub user: String,
    /// Document name, or a pattern ending in `*`.
    pub doc: String,
    pub permission: Permission,
    /// Lifetime in seconds (default 3600, at most 30 days).
    pub ttl_secs: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct IssuedToken {
    pub token: String,
    pub token_id: String,
    pub expires_at: i64,
}

/// Issue a token (administrators: the admin key or an admin token for `*`).
#[utoipa::path(post, path = "/api/v1/tokens", request_body = IssueToken,
    params(("Idempotency-Key" = Option<String>, Header)),
    responses((status = 201, body = IssuedToken), BadRequest, Unauthorized, Forbidden, Conflict, NotJson, Unprocessable))]
async fn issue_token(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<IssueToken>,
) -> ApiResult<Response> {
    check_len("user", Some(&body.user), field_limits::USER_ID)?;
    check_len("doc", Some(&body.doc), crate::room::MAX_DOC_NAME_BYTES + 1)?;
    if !principal.is_admin() {
        return Err(ApiError::forbidden("issuing tokens requires the admin key"));
    }
    let ttl = body.ttl_secs.unwrap_or(3600).clamp(1, 30 * 24 * 3600);
    let (token, claims) = app
        .auth
        .issue(
            &body.user,
            &body.doc,
            body.permission,
            ttl,
            crate::auth::now_secs(),
        )
        .map_err(|e| ApiError::bad_request("no-signing-key", e.to_string()))?;
    Ok((
        StatusCode::CREATED,
        Json(IssuedToken {
            token,
            token_id: claims.jti,
            expires_at: claims.exp,
        }),
    )
        .into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    pub token_id: Option<String>,
    pub user: Option<String>,
}

/// Revoke a token id, or every token of a user issued until now. Their live sockets close with
/// 4403 within a second.
#[utoipa::path(post, path = "/api/v1/tokens/revoke", request_body = RevokeRequest,
    params(("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = Revocation), BadRequest, Unauthorized, Forbidden, Conflict, NotJson, Unprocessable))]
async fn revoke(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<RevokeRequest>,
) -> ApiResult<Json<Revocation>> {
    if !principal.is_admin() {
        return Err(ApiError::forbidden("revoking requires the admin key"));
    }
    check_len("user", body.user.as_deref(), field_limits::USER_ID)?;
    check_len("token_id", body.token_id.as_deref(), field_limits::TOKEN_ID)?;
    if body.token_id.is_none() && body.user.is_none() {
        return Err(ApiError::bad_request(
            "nothing-to-revoke",
            "give token_id or user",
        ));
    }
    let r = app
        .api
        .revoke(
            body.token_id.as_deref(),
            body.user.as_deref(),
            crate::storage::now_ms(),
        )
        .await?;
    crate::revocation::apply(&app, &r).await;
    Ok(Json(r))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OutboxView {
    /// Newest first: pending and delivered events.
    pub events: Vec<OutboxEvent>,
    /// Events whose attempts ran out, newest first.
    pub dead: Vec<DeadEvent>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OutboxParams {
    /// At most this many of each (default 100, at most 1000).
    limit: Option<u32>,
}

/// The webhook outbox and dead-letter table (administrators).
#[utoipa::path(get, path = "/api/v1/admin/outbox", params(OutboxParams),
    responses((status = 200, body = OutboxView), BadRequest, Unauthorized, Forbidden))]
async fn admin_outbox(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(p): ApiQuery<OutboxParams>,
) -> ApiResult<Json<OutboxView>> {
    if !principal.is_admin() {
        return Err(ApiError::forbidden("administrators only"));
    }
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    let (events, dead) = app.api.outbox_view(limit).await?;
    Ok(Json(OutboxView { events, dead }))
}
