//! Tokens: issuing them (administrators) and revoking them.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use super::extract::ApiJson;
use crate::problem::responses::*;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::shared::{check_len, field_limits, ApiResult};
use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::problem::ApiError;
use crate::storage::api::Revocation;

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
pub(super) async fn issue_token(
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
pub(super) async fn revoke(
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
