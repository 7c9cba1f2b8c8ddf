//! `/api/v1/docs` and `/docs/{name}`: creating, listing, reading, changing, deleting and
//! restoring documents (metadata, with optimistic version checks).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};

use super::extract::{ApiJson, ApiPath, ApiQuery};
use crate::problem::responses::*;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::shared::{
    check_len, created_doc, created_response, decode_cursor, doc_changed, doc_for, encode_cursor,
    field_limits, if_match, live, live_err, with_etag, ApiResult, MAX_PAGE,
};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::bus::Change;
use crate::problem::ApiError;
use crate::room::DocName;
use crate::storage::api::{DocMeta, DocPatch, DocQuery, Versioned};

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
pub(super) async fn create_doc(
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
    let doc = created_doc(
        app.api
            .create_doc(name.as_str(), &body.title, Some(&principal.user))
            .await?,
    )?;
    Ok(created_response(&doc, &doc, Some(doc.version)))
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
pub(super) async fn list_docs(
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

/// A document's metadata; the `ETag` carries its version.
#[utoipa::path(get, path = "/api/v1/docs/{name}", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded")),
    responses((status = 200, body = DocMeta, headers(("ETag" = String))), BadRequest, Unauthorized, Forbidden, NotFound))]
pub(super) async fn get_doc(
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
pub(super) async fn patch_doc(
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
pub(super) async fn delete_doc(
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

/// Undo a soft delete.
#[utoipa::path(post, path = "/api/v1/docs/{name}/restore",
    params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded"), ("Idempotency-Key" = Option<String>, Header)),
    responses((status = 200, body = DocMeta), BadRequest, Unauthorized, Forbidden, NotFound, Conflict, Unprocessable))]
pub(super) async fn restore_doc(
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
