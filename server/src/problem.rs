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
    /// Sent as `Retry-After` (whole seconds, rounded up).
    pub retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, detail: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            detail: detail.into(),
            current: None,
            etag: None,
            retry_after: None,
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
            retry_after: None,
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
        if let Some(wait) = self.retry_after {
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
        }
        resp
    }
}

/// 429 with `Retry-After` (whole seconds, rounded up).
/// A refused credential's answer: 429 for an address that failed too often lately, else 401.
pub fn refused(e: crate::auth::VerifyError) -> Response {
    match e {
        crate::auth::VerifyError::Limited(wait) => too_many(
            "too-many-failed-logins",
            "too many failed authentications from this address; retry later",
            wait,
        ),
        crate::auth::VerifyError::Invalid(e) => ApiError::unauthorized(e).into_response(),
    }
}

pub fn too_many(kind: &'static str, detail: &str, wait: std::time::Duration) -> Response {
    let mut error = ApiError::new(StatusCode::TOO_MANY_REQUESTS, kind, detail);
    error.retry_after = Some(wait);
    error.into_response()
}

impl From<crate::gate::Refused> for ApiError {
    /// The heavy-work gate's refusals: 429 when the document has its share of heavy requests
    /// under way, 503 when the node has no slot; both say when to retry.
    fn from(refused: crate::gate::Refused) -> ApiError {
        let (mut error, wait) = match refused {
            crate::gate::Refused::Document(wait) => (
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "document-busy",
                    "this document had as many whole-document requests under way as it may \
                     (heavy_per_doc) for all of heavy_wait; retry after the time in Retry-After",
                ),
                wait,
            ),
            crate::gate::Refused::Node(wait) => (
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server-busy",
                    "the server is running as many whole-document requests as it may \
                     (heavy_per_node, heavy_queue); retry after the time in Retry-After",
                ),
                wait,
            ),
        };
        error.retry_after = Some(wait);
        error
    }
}

/// A problem response from parts.
pub fn problem(status: StatusCode, kind: &'static str, detail: &str) -> Response {
    ApiError::new(status, kind, detail).into_response()
}

/// The ETag of a row version: a strong validator, `"<version>"`.
pub fn etag(version: i64) -> String {
    format!("\"{version}\"")
}

/// The error responses of the OpenAPI document, each declared once: a `problem+json`
/// [`Problem`] under one status. A route's `#[utoipa::path]` lists the ones it can return by
/// name (`responses((status = 200, body = DocMeta), BadRequest, NotFound)`).
pub mod responses {
    use std::collections::BTreeMap;

    use utoipa::openapi::content::ContentBuilder;
    use utoipa::openapi::{Ref, RefOr, Response, ResponseBuilder};

    fn problem(status: u16, description: &str) -> BTreeMap<String, RefOr<Response>> {
        let content = ContentBuilder::new()
            .schema(Some(Ref::from_schema_name("Problem")))
            .build();
        let response = ResponseBuilder::new()
            .description(description)
            .content("application/problem+json", content)
            .build();
        BTreeMap::from([(status.to_string(), RefOr::T(response))])
    }

    macro_rules! problems {
        ($($(#[$doc:meta])* $name:ident = $status:literal, $description:literal;)*) => {$(
            $(#[$doc])*
            pub struct $name;

            impl utoipa::IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    problem($status, $description)
                }
            }
        )*};
    }

    problems! {
        BadRequest = 400, "a parameter or header is invalid";
        Unauthorized = 401, "no valid credentials";
        Forbidden = 403, "the credentials do not allow this";
        NotFound = 404, "no such resource (or not visible to the caller)";
        /// Create: the name is taken. Restore: the document is not deleted. Any request with
        /// an `Idempotency-Key`: the first request with that key is still running.
        Conflict = 409, "conflicts with the resource's state, or a request with this Idempotency-Key is still running";
        Gone = 410, "the document is deleted";
        Stale = 412, "stale version: `current` holds the row as it is";
        TooLarge = 413, "the body is larger than allowed";
        NotJson = 415, "the body is not JSON";
        /// A field fails validation, or an `Idempotency-Key` was reused for a different request.
        Unprocessable = 422, "a field is invalid, or the Idempotency-Key was used for a different request";
        NeedsIfMatch = 428, "If-Match is required";
        /// The document has its share of whole-document requests under way (`heavy_per_doc`);
        /// `Retry-After` says when to retry.
        Busy = 429, "too many requests: retry after the time in Retry-After";
        /// The document cannot be served now, or the server runs as much whole-document work
        /// as it may (`Retry-After` then says when to retry).
        Unavailable = 503, "the document cannot be served now, or the server is busy; retry";
        /// The document's named and restore versions would pass `max_version_bytes`.
        BudgetFull = 507, "the document's version budget is full";
    }
}
