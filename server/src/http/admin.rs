//! The admin dashboard's routes under `/api/v1/admin` (administrators only: the admin key, or
//! a token with `admin` on `*`), and the page at `/admin` (public: it holds no data, and asks
//! for the credential, which it keeps in the tab's session storage and sends as a bearer
//! header, never in a URL).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, Stream, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use utoipa::{IntoParams, ToSchema};

use super::extract::{ApiPath, ApiQuery};
use super::shared::ApiResult;
use crate::admin::{LiveRoom, Sample, Tick};
use crate::app::AppState;
use crate::auth::Principal;
use crate::problem::responses::*;
use crate::problem::ApiError;
use crate::room::stats::RoomFigures;
use crate::storage::api::DeadEvent;
use crate::storage::api::{ClusterRows, DocQuery, DocStats, OutboxEvent};

fn admin_only(principal: &Principal) -> ApiResult<()> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(ApiError::forbidden("administrators only"))
    }
}

/// This node and its store, at a glance.
#[derive(Debug, Serialize, ToSchema)]
pub struct Overview {
    pub node_id: String,
    pub version: String,
    /// `sqlite` or `postgres`.
    pub database: String,
    /// Several nodes may share the database (PostgreSQL): rooms hold leases.
    pub cluster: bool,
    /// A bus to other nodes is configured.
    pub bus: bool,
    /// No key configured: every caller is an administrator (development mode).
    pub open_mode: bool,
    /// ms since the epoch.
    pub started_at: i64,
    pub now: i64,
    /// Bytes the database takes.
    pub store_bytes: i64,
    pub rooms_loaded: usize,
    pub connections: i64,
    /// How often the figures are sampled, and how much of them the server keeps (ms).
    pub sample_every_ms: u64,
    pub history_ms: u64,
    pub samples_kept: usize,
    /// Rooms stalled on a failing storage.
    pub rooms_stalled: i64,
}

#[utoipa::path(get, path = "/api/v1/admin/overview",
    responses((status = 200, body = Overview), Unauthorized, Forbidden))]
/// This node and its store, at a glance (administrators).
pub(super) async fn overview(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Json<Overview>> {
    admin_only(&principal)?;
    let store_bytes = app.api.store_size().await?;
    let postgres = crate::storage::postgres::is_postgres_url(app.config.database_url.expose());
    Ok(Json(Overview {
        node_id: app.config.node_id.clone(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        database: if postgres { "postgres" } else { "sqlite" }.to_owned(),
        cluster: postgres,
        bus: app.bus.is_some(),
        open_mode: app.auth.is_open(),
        started_at: app.admin.started_at,
        now: crate::storage::now_ms(),
        store_bytes,
        rooms_loaded: app.registry.len(),
        connections: app.metrics.connections.get() + app.metrics.hocuspocus_sockets.get(),
        sample_every_ms: app.admin.every.as_millis() as u64,
        history_ms: app.admin.keep.as_millis() as u64,
        samples_kept: app.admin.kept(),
        rooms_stalled: app.metrics.rooms_stalled.get(),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AdminDocsParams {
    /// Documents whose name starts with this.
    prefix: Option<String>,
    /// The page after this document id (`next_after` of the previous page).
    after: Option<i64>,
    /// At most this many (default 50, at most 200).
    limit: Option<u32>,
}

/// A document's storage figures, and its room's if it is loaded on this node.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdminDoc {
    #[serde(flatten)]
    pub stored: DocStats,
    /// The room on this node (`None`: not loaded here).
    #[schema(value_type = Option<Object>)]
    pub live: Option<LiveRoom>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AdminDocs {
    pub docs: Vec<AdminDoc>,
    /// Pass as `after` for the next page; `None`: this is the last.
    pub next_after: Option<i64>,
}

#[utoipa::path(get, path = "/api/v1/admin/docs", params(AdminDocsParams),
    responses((status = 200, body = AdminDocs), BadRequest, Unauthorized, Forbidden))]
/// Documents with their sizes, last commit and snapshot, leases, and live rooms
/// (administrators).
pub(super) async fn docs(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(p): ApiQuery<AdminDocsParams>,
) -> ApiResult<Json<AdminDocs>> {
    admin_only(&principal)?;
    let limit = p.limit.unwrap_or(50).clamp(1, 200);
    let stats = app
        .api
        .doc_stats(&DocQuery {
            name_prefix: p.prefix.filter(|p| !p.is_empty()),
            after_id: p.after,
            limit,
            ..DocQuery::default()
        })
        .await?;
    let newest = app.admin.newest();
    let next_after = (stats.len() == limit as usize)
        .then(|| stats.last().map(|d| d.id))
        .flatten();
    // The figures are read now (a tick may be up to `admin_sample_every` old); only the rates
    // come from the newest tick, which lists the busiest rooms (others show 0).
    let loaded: HashMap<String, RoomFigures> = app
        .registry
        .live_stats()
        .into_iter()
        .map(|(name, stats)| (name.as_str().to_owned(), stats.read()))
        .filter(|(_, f)| f.loaded_at > 0)
        .collect();
    let rates: HashMap<&str, (f64, f64)> = newest
        .rooms
        .iter()
        .map(|r| (r.name.as_str(), (r.updates_in, r.updates_out)))
        .collect();
    let docs = stats
        .into_iter()
        .map(|stored| {
            let live = loaded.get(&stored.name).map(|f| {
                let (updates_in, updates_out) =
                    rates.get(stored.name.as_str()).copied().unwrap_or_default();
                LiveRoom::new(&stored.name, f, updates_in, updates_out)
            });
            AdminDoc { live, stored }
        })
        .collect();
    Ok(Json(AdminDocs { docs, next_after }))
}

/// The nodes on this database and who serves which document.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterView {
    /// The node answering.
    pub this_node: String,
    /// A node whose heartbeat is older than this (ms) is shown as gone.
    pub gone_after_ms: u64,
    #[serde(flatten)]
    pub rows: ClusterRows,
}

#[utoipa::path(get, path = "/api/v1/admin/cluster",
    responses((status = 200, body = ClusterView), Unauthorized, Forbidden))]
/// The nodes (their heartbeats) and the live room leases with their epochs (administrators).
pub(super) async fn cluster(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> ApiResult<Json<ClusterView>> {
    admin_only(&principal)?;
    let rows = app.api.cluster_rows(500).await?;
    Ok(Json(ClusterView {
        this_node: app.config.node_id.clone(),
        gone_after_ms: crate::admin::NODE_GONE_AFTER.as_millis() as u64,
        rows,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct DeadId {
    /// The dead event's id (`id` in the outbox view's `dead` list).
    id: i64,
}

#[utoipa::path(post, path = "/api/v1/admin/dead/{id}/retry", params(DeadId),
    responses((status = 200, body = OutboxEvent), BadRequest, Unauthorized, Forbidden, NotFound))]
/// Puts a dead webhook event back in the outbox, due now, with its attempts counted afresh
/// and its event id kept (receivers deduplicate by it). Retrying one already back in the
/// outbox returns it as it is (administrators).
pub(super) async fn retry_dead(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiPath(DeadId { id }): ApiPath<DeadId>,
) -> ApiResult<Json<OutboxEvent>> {
    admin_only(&principal)?;
    match app.api.retry_dead(id, crate::storage::now_ms()).await? {
        Some(event) => {
            tracing::info!(id, event = %event.event_id, "dead webhook event retried");
            Ok(Json(event))
        }
        None => Err(ApiError::not_found("dead event")),
    }
}

/// The first message of the stream: what the server kept, and the newest rooms.
#[derive(Debug, Serialize)]
struct Hello<'a> {
    every_ms: u64,
    history_ms: u64,
    samples: &'a [Sample],
    tick: &'a Tick,
}

/// `GET /api/v1/admin/stream`: server-sent events. First `history` (every kept sample and the
/// newest tick), then a `tick` per sample. A dashboard that falls behind skips to the newest;
/// the stream ends when the server shuts down or the caller's token expires or is revoked.
pub(super) async fn stream(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Response {
    if let Err(e) = admin_only(&principal) {
        return e.into_response();
    }
    let (samples, newest, rx) = app.admin.subscribe();
    let hello = Event::default().event("history").json_data(Hello {
        every_ms: app.admin.every.as_millis() as u64,
        history_ms: app.admin.keep.as_millis() as u64,
        samples: &samples,
        tick: &newest,
    });
    let hello = match hello {
        Ok(event) => event,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the dashboard's history");
            return ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the history could not be encoded",
            )
            .into_response();
        }
    };
    let ticks = ticks(app.clone(), principal, rx);
    let events = stream::once(async move { Ok::<_, Infallible>(hello) }).chain(ticks);
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    // Proxies must not buffer the stream.
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// Each tick as an event, until the server stops or the caller's credential ends.
fn ticks(
    app: AppState,
    principal: Principal,
    rx: tokio::sync::broadcast::Receiver<Arc<Tick>>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let shutdown = app.registry.shutdown.clone();
    stream::unfold((app, principal, rx), move |(app, principal, mut rx)| {
        let shutdown = shutdown.clone();
        async move {
            loop {
                let tick = tokio::select! {
                    tick = rx.recv() => tick,
                    _ = shutdown.cancelled() => return None,
                    _ = until_expiry(&principal) => return None,
                };
                let tick = match tick {
                    Ok(tick) => tick,
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return None,
                };
                if !still_valid(&app, &principal) {
                    return None;
                }
                let Ok(event) = Event::default().event("tick").json_data(&*tick) else {
                    continue;
                };
                return Some((Ok(event), (app, principal, rx)));
            }
        }
    })
}

/// Resolves when the caller's credential expires (never for the admin key and open mode).
async fn until_expiry(principal: &Principal) {
    match principal.expires_at {
        Some(exp) => {
            let left = exp
                .saturating_mul(1000)
                .saturating_sub(crate::storage::now_ms())
                .max(0);
            tokio::time::sleep(Duration::from_millis(left as u64)).await;
        }
        None => std::future::pending().await,
    }
}

/// The stream's credential has neither expired nor been revoked since it opened.
fn still_valid(app: &AppState, principal: &Principal) -> bool {
    let now = crate::auth::now_secs();
    if principal.expires_at.is_some_and(|exp| exp <= now) {
        return false;
    }
    match &principal.token_id {
        Some(id) => !app
            .auth
            .is_revoked(id, &principal.user, principal.issued_at),
        None => true,
    }
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
pub(super) async fn admin_outbox(
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

#[derive(Debug, Serialize, ToSchema)]
pub struct SetAsideView {
    /// Newest first.
    pub rows: Vec<crate::storage::set_aside::SetAsideListed>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SetAsideParams {
    /// One document's rows only.
    document: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<u32>,
}

/// What stored log rows held that does not integrate into their document, set aside when the
/// document loaded (docs/durability.md): its document, position, size and why (administrators).
#[utoipa::path(get, path = "/api/v1/admin/set-aside", params(SetAsideParams),
    responses((status = 200, body = SetAsideView), BadRequest, Unauthorized, Forbidden))]
pub(super) async fn set_aside(
    State(app): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiQuery(p): ApiQuery<SetAsideParams>,
) -> ApiResult<Json<SetAsideView>> {
    if !principal.is_admin() {
        return Err(ApiError::forbidden("administrators only"));
    }
    let limit = i64::from(p.limit.unwrap_or(100).clamp(1, 1000));
    let rows = app
        .store
        .shared()
        .set_aside_rows(p.document.as_deref(), limit)
        .await?;
    Ok(Json(SetAsideView { rows }))
}
