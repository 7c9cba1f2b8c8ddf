//! HTTP routes: health, readiness, metrics, and the WebSocket entry point for documents.

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::room::DocName;
use crate::AppState;

pub fn router(app: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(document_socket)
        .with_state(app)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(app): State<AppState>) -> Response {
    match app.store.ping().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "readiness check failed");
            problem(
                StatusCode::SERVICE_UNAVAILABLE,
                "database-unreachable",
                "The database does not answer",
            )
        }
    }
}

async fn metrics(State(app): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
        .into_response()
}

/// `GET /<document-name>` with a WebSocket upgrade. The name is checked before the upgrade so
/// a bad one gets a plain HTTP 400.
async fn document_socket(
    State(app): State<AppState>,
    uri: Uri,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let name = match DocName::from_url_path(uri.path()) {
        Ok(name) => name,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "invalid-document-name",
                &e.to_string(),
            )
        }
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    let limits = &app.config.limits;
    let tracker = app.connections.clone();
    ws.max_message_size(limits.max_message_size)
        .max_frame_size(limits.max_message_size)
        .write_buffer_size(0)
        .on_upgrade(move |socket| tracker.track_future(crate::ws::serve(socket, name, app)))
}

/// An RFC 9457 problem+json response.
pub fn problem(status: StatusCode, kind: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": format!("https://quire.dev/problems/{kind}"),
        "title": status.canonical_reason().unwrap_or("error"),
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, "application/problem+json")],
        Json(body),
    )
        .into_response()
}
