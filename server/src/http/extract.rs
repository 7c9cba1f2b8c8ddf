//! Extractors whose rejections are problem+json like every other API error.

use axum::extract::rejection::{BytesRejection, JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts};
use axum::http::StatusCode;

use crate::problem::ApiError;

/// `Json<T>`: malformed or mistyped bodies are 400, a missing JSON content type 415.
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

/// `Query<T>`: a bad query string is 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `Path<T>`: a bad path parameter is 400.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

/// `Bytes`: a body over the limit is 413.
pub struct ApiBytes(pub bytes::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        bytes::Bytes::from_request(req, state)
            .await
            .map(ApiBytes)
            .map_err(ApiError::from)
    }
}

impl From<BytesRejection> for ApiError {
    fn from(_: BytesRejection) -> ApiError {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "the request body is too large or could not be read",
        )
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        match r {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "send the body as application/json",
            ),
            JsonRejection::BytesRejection(_) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body-too-large",
                "the request body is too large or could not be read",
            ),
            other => ApiError::bad_request("invalid-body", other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> ApiError {
        ApiError::bad_request("invalid-query", r.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> ApiError {
        ApiError::bad_request("invalid-path", r.body_text())
    }
}
