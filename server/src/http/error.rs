//! The one mapping from errors to HTTP: `application/problem+json` (RFC 9457) with a stable
//! `type` per kind of error. Internal details are logged, not sent.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use crate::auth::AuthError;
use crate::storage::StorageError;

/// Base of every problem `type` URI.
pub const PROBLEM_BASE: &str = "https://quire.dev/problems/";

/// The problem+json body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// `https://quire.dev/problems/<kind>`, stable per kind of error.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// On 412: the current representation of the resource.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub current: Option<serde_json::Value>,
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub detail: String,
    pub current: Option<serde_json::Value>,
    pub etag: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            detail: detail.into(),
            current: None,
            etag: None,
        }
    }

    pub fn unauthorized(e: AuthError) -> ApiError {
        let kind = match e {
            AuthError::Missing => "token-missing",
            AuthError::Expired => "token-expired",
            AuthError::Revoked => "token-revoked",
            _ => "token-invalid",
        };
        ApiError::new(StatusCode::UNAUTHORIZED, kind, e.to_string())
    }

    pub fn forbidden(detail: &str) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", detail)
    }

    pub fn not_found(what: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("{what} not found"),
        )
    }

    pub fn bad_request(kind: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, kind, detail)
    }

    /// 412 with the current representation and its ETag.
    pub fn stale<T: Serialize>(current: &T, version: i64) -> ApiError {
        ApiError {
            status: StatusCode::PRECONDITION_FAILED,
            kind: "version-mismatch",
            detail: "the resource changed since the version in If-Match".into(),
            current: serde_json::to_value(current).ok(),
            etag: Some(etag(version)),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> ApiError {
        tracing::error!(error = %e, "storage error");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage-unavailable",
            "the database could not complete the request; retry",
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Problem {
            kind: format!("{PROBLEM_BASE}{}", self.kind),
            title: self.status.canonical_reason().unwrap_or("error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail,
            current: self.current,
        };
        let mut resp = (self.status, Json(body)).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if let Some(tag) = self.etag.and_then(|t| HeaderValue::from_str(&t).ok()) {
            resp.headers_mut().insert(header::ETAG, tag);
        }
        resp
    }
}

/// 429 with `Retry-After` (whole seconds, rounded up).
pub fn too_many(kind: &'static str, detail: &str, wait: std::time::Duration) -> Response {
    let mut resp = ApiError::new(StatusCode::TOO_MANY_REQUESTS, kind, detail).into_response();
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    resp
}

/// A problem response from parts.
pub fn problem(status: StatusCode, kind: &'static str, detail: &str) -> Response {
    ApiError::new(status, kind, detail).into_response()
}

/// The ETag of a row version: a strong validator, `"<version>"`.
pub fn etag(version: i64) -> String {
    format!("\"{version}\"")
}
