//! Who may do what: a document's roles (`/docs/{name}/access`) and users' profiles
//! (`/users/{id}`, `/me`).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};

use super::extract::{ApiJson, ApiPath};
use crate::problem::responses::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::shared::{
    check_len, doc_for, field_limits, if_match, role_changed, with_etag, ApiResult,
};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::problem::ApiError;
use crate::storage::api::{Role, UserPatch, UserProfile, Versioned};

#[derive(Debug, Serialize, ToSchema)]
pub struct AccessEntry {
    pub user: String,
    pub role: Role,
}

/// Who has which role on a document.
#[utoipa::path(get, path = "/api/v1/docs/{name}/access", params(("name" = String, Path, description = "The document's name (as in its WebSocket URL), percent-encoded")),
    responses((status = 200, body = Vec<AccessEntry>), BadRequest, Unauthorized, Forbidden, NotFound))]
pub(super) async fn list_access(
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
pub(super) async fn put_access(
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
pub(super) async fn delete_access(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath((name, user)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let doc = doc_for(&app, &principal, &name, Permission::Admin).await?;
    let change = app.api.set_role(doc.id, &user, None).await?;
    role_changed(&app, &doc.name, &user, change).await;
    Ok(StatusCode::NO_CONTENT)
}

/// A user's profile.
#[utoipa::path(get, path = "/api/v1/users/{id}", params(("id" = String, Path)),
    responses((status = 200, body = UserProfile, headers(("ETag" = String))), BadRequest, Unauthorized, NotFound))]
pub(super) async fn get_user(
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
pub(super) async fn patch_user(
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
pub(super) async fn get_me(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Response> {
    let user = app.api.ensure_user(&principal.user).await?;
    Ok(with_etag(StatusCode::OK, &user, user.version))
}
