//! Quire: a durable Yjs sync server speaking the y-websocket protocol.
//!
//! Map of the crate, from the bytes up:
//! - [`protocol`]: y-websocket messages as pure functions over bytes.
//! - [`storage`]: the [`storage::DocStore`] trait (append-only log, snapshots with an
//!   optimistic version check) and its SQLite implementation.
//! - [`room`]: one task per loaded document, the only writer of its `Doc` and log; the
//!   [`room::Registry`] that starts rooms on demand.
//! - [`ws`]: one WebSocket connection, between a socket and a room.
//! - [`http`]: routes (health, readiness, metrics, the document socket).
//! - [`config`], [`telemetry`], [`metrics`], [`close`]: settings, logs, counters, close codes.
//!
//! [`run`] serves on a listener until a shutdown token fires; tests start it on port 0.

pub mod close;
pub mod config;
pub mod http;
pub mod metrics;
pub mod protocol;
pub mod room;
pub mod storage;
pub mod telemetry;
pub mod ws;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use config::Config;
use metrics::Metrics;
use room::Registry;
use storage::sqlite::SqliteStore;
use storage::{DocStore, StorageError};

/// What request handlers share.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn DocStore>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Tracks WebSocket connection tasks so shutdown can wait for their close frames.
    pub connections: TaskTracker,
}

/// Opens the configured database and applies migrations.
pub async fn open_store(config: &Config) -> Result<Arc<dyn DocStore>, StorageError> {
    let store = SqliteStore::connect(&config.database_url, config.sqlite_synchronous).await?;
    Ok(Arc::new(store))
}

/// Serves until `shutdown` is cancelled, then shuts down gracefully: stop accepting, commit
/// and snapshot every room, close sockets with 1001, all within `config.shutdown_grace`.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let store = open_store(&config).await?;
    run_with_store(listener, config, store, shutdown).await
}

/// [`run`] with an already opened store.
pub async fn run_with_store(
    listener: TcpListener,
    config: Config,
    store: Arc<dyn DocStore>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let metrics = Arc::new(Metrics::new());
    let registry = Registry::new(
        store.clone(),
        metrics.clone(),
        config.room.clone(),
        config.limits.room_queue,
        shutdown.clone(),
    );
    let grace = config.shutdown_grace;
    let app = AppState {
        config: Arc::new(config),
        store,
        registry: registry.clone(),
        metrics,
        connections: TaskTracker::new(),
    };
    let connections = app.connections.clone();
    let router = http::router(app);
    let serve =
        axum::serve(listener, router).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let server = tokio::spawn(async move { serve.await });

    shutdown.cancelled().await;
    tracing::info!("shutting down: committing and snapshotting every room");
    let drained = tokio::time::timeout(grace, async {
        registry.wait_stopped().await;
        connections.close();
        connections.wait().await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?grace,
            "shutdown grace period expired; exiting with work outstanding"
        );
    }
    server.abort();
    tracing::info!("stopped");
    Ok(())
}
