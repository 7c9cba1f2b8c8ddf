//! Quire: a durable Yjs sync server speaking the y-websocket protocol.
//!
//! Map of the crate, from the bytes up:
//! - [`protocol`]: y-websocket messages as pure functions over bytes.
//! - [`storage`]: the [`storage::DocStore`] trait (append-only log, snapshots with an
//!   optimistic version check) and its SQLite and PostgreSQL implementations.
//! - [`room`]: one task per loaded document, the only writer of its `Doc` and log; the
//!   [`room::Registry`] that starts rooms on demand.
//! - [`ws`]: one WebSocket connection, between a socket and a room.
//! - [`http`]: routes (health, readiness, metrics, the document socket).
//! - [`config`], [`telemetry`], [`metrics`], [`close`]: settings, logs, counters, close codes.
//!
//! [`run`] serves on a listener until a shutdown token fires; tests start it on port 0.

/// The wire protocol (the `quire-protocol` crate, shared with the client and the benchmark).
pub use quire_protocol as protocol;
pub use quire_protocol::counts;
pub mod admin;
pub mod auth;
pub mod bus;
pub mod changes;
pub mod close;
pub mod config;
pub mod entry_points;
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod history;
pub mod hocuspocus;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod relay;
pub mod revocation;
pub mod room;
pub mod storage;
pub mod telemetry;
pub mod webhooks;
pub mod ws;

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use auth::Auth;
use config::Config;
use metrics::Metrics;
use room::Registry;
use storage::api::ApiStore;
use storage::postgres::{is_postgres_url, PgStore};
use storage::sqlite::{EventSettings, SqliteStore};
use storage::{DocStore, StorageError};

/// What request handlers share: one [`App`] behind an `Arc`, so that a copy (each request's,
/// each connection's) is one pointer, not the dozen the fields are.
#[derive(Clone)]
pub struct AppState(Arc<App>);

impl AppState {
    pub fn new(app: App) -> AppState {
        AppState(Arc::new(app))
    }
}

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

/// The server's shared parts (through [`AppState`]).
pub struct App {
    pub config: Arc<Config>,
    pub store: Arc<dyn DocStore>,
    pub api: Arc<dyn ApiStore>,
    pub auth: Arc<Auth>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    /// Tracks WebSocket connection tasks so shutdown can wait for their close frames.
    pub connections: TaskTracker,
    /// The bus to other nodes (`--bus`), when several nodes share a PostgreSQL database.
    pub bus: Option<Arc<bus::Bus>>,
    /// Per-client-address limits (new connections, failed authentications).
    pub address_limits: Arc<limits::AddressLimits>,
    /// The admission gate every whole-document computation passes (`gate`).
    pub gate: Arc<gate::Gate>,
    /// The nonces of the forwarded requests served lately (`http::owner`).
    pub forward_guard: Arc<http::owner::ReplayGuard>,
    /// The owners of the documents this node relays connections to (`relay`).
    pub relay_leases: Arc<relay::LeaseWatch>,
    /// The admin dashboard's kept figures and their stream.
    pub admin: Arc<admin::Admin>,
}

/// Checks what `quire serve` can check of its configuration before it binds its port or
/// opens the database: the auth keys, the database URL's scheme, and `--bus` with its cluster
/// key. No error names a secret.
pub fn check_config(config: &Config) -> anyhow::Result<()> {
    Auth::new(&config.auth_keys, config.admin_key.clone()).map_err(anyhow::Error::msg)?;
    let url = config.database_url.expose();
    let postgres = is_postgres_url(url);
    if !postgres && !url.starts_with("sqlite:") {
        return Err(StorageError::UnsupportedUrl(storage::redact_url(url)).into());
    }
    if config.bus_url.is_some() && postgres {
        let Some(key) = &config.cluster_key else {
            anyhow::bail!(
                "--bus needs --cluster-key (QUIRE_CLUSTER_KEY): a shared secret of at least \
                 {} bytes, the same on every node, that signs the messages between nodes",
                bus::MIN_CLUSTER_KEY
            );
        };
        bus::ClusterKey::new(key.expose())?;
    }
    Ok(())
}

/// The storage a server runs on: document content, API rows, and the signal that outbox
/// events were written.
#[derive(Clone)]
pub struct Stores {
    pub docs: Arc<dyn DocStore>,
    pub api: Arc<dyn ApiStore>,
    pub events_written: Arc<Notify>,
}

/// Opens the configured database and applies migrations. The URL scheme picks the backend:
/// `sqlite:` or `postgres:` / `postgresql:`.
pub async fn open_stores(config: &Config) -> Result<Stores, StorageError> {
    let events = EventSettings {
        enabled: !config.webhooks.urls.is_empty(),
        debounce: config.webhooks.debounce,
    };
    let url = config.database_url.expose();
    if is_postgres_url(url) {
        let store = Arc::new(PgStore::connect_with_events(url, events).await?);
        return Ok(Stores {
            events_written: store.api().events_notify(),
            api: Arc::new(store.api().clone()),
            docs: store,
        });
    }
    if !url.starts_with("sqlite:") {
        return Err(StorageError::UnsupportedUrl(crate::storage::redact_url(
            url,
        )));
    }
    let store = Arc::new(
        SqliteStore::connect_with_events(
            url,
            config.sqlite_synchronous,
            events,
            config.sqlite_commit,
        )
        .await?,
    );
    Ok(Stores {
        events_written: store.api().events_notify(),
        api: Arc::new(store.api().clone()),
        docs: store,
    })
}

/// Serves until `shutdown` is cancelled, then shuts down gracefully: stop accepting, commit
/// and snapshot every room, close sockets with 1001, all within `config.shutdown_grace`.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stores = open_stores(&config).await?;
    run_with_stores(listener, config, stores, shutdown).await
}

/// [`run`] with already opened stores.
pub async fn run_with_stores(
    listener: TcpListener,
    config: Config,
    stores: Stores,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let auth = Arc::new(
        Auth::new(&config.auth_keys, config.admin_key.clone()).map_err(anyhow::Error::msg)?,
    );
    if auth.is_open() {
        tracing::warn!(
            "NO AUTH KEY CONFIGURED: open development mode, every client may read, write and \
             administer every document. Set --auth-key (and --admin-key) before exposing Quire."
        );
    }
    // Revocations are loaded before the first request, so no revoked token slips through.
    // Snapshots keep the log rows they cover for the history (or delete them: retention 0).
    stores
        .api
        .set_history_retention(config.room.history.retention);
    for r in stores.api.revocations_after(0).await? {
        auth.apply_revocation(&r);
    }
    let metrics = Arc::new(Metrics::new());
    let registry = Registry::new(
        stores.docs.clone(),
        metrics.clone(),
        config::RoomConfig {
            ping_interval: config.ping_interval,
            // Several nodes may share a PostgreSQL database: each room then holds a lease.
            lease: storage::postgres::is_postgres_url(config.database_url.expose()).then(|| {
                config::LeaseConfig {
                    node_id: config.node_id.as_str().into(),
                    ttl: config.lease_ttl,
                }
            }),
            ..config.room.clone()
        },
        config.limits.room_queue,
        shutdown.clone(),
    );
    let grace = config.shutdown_grace;
    let webhooks = config.webhooks.clone();
    let idempotency_ttl = config.idempotency_ttl;
    let (bus, inbound) = match start_bus(&config, &registry).await? {
        Some((bus, inbound)) => (Some(bus), Some(inbound)),
        None => (None, None),
    };
    let app = AppState::new(App {
        admin: Arc::new(admin::Admin::new(
            config.admin_sample_every,
            config.admin_history,
        )),
        relay_leases: Arc::default(),
        address_limits: Arc::new(limits::AddressLimits::new(&config.limits)),
        gate: gate::Gate::new(config.gate, metrics.clone()),
        forward_guard: Arc::default(),
        bus,
        config: Arc::new(config),
        store: stores.docs.clone(),
        api: stores.api.clone(),
        auth,
        registry: registry.clone(),
        metrics,
        connections: TaskTracker::new(),
    });
    let background = TaskTracker::new();
    background.spawn(revocation::watch(app.clone(), shutdown.clone()));
    background.spawn(admin::sample(
        app.admin.clone(),
        app.metrics.clone(),
        app.registry.clone(),
        shutdown.clone(),
    ));
    if app.registry.config.lease.is_some() {
        // Several nodes may share the database: each tells the others it is alive.
        let address = listener
            .local_addr()
            .map_or_else(|_| app.config.bind.to_string(), |a| a.to_string());
        background.spawn(admin::heartbeat(
            stores.api.clone(),
            app.config.node_id.clone(),
            address,
            app.admin.started_at,
            shutdown.clone(),
        ));
    }
    if app.bus.is_some() {
        background.spawn(app.relay_leases.clone().run(
            app.store.clone(),
            app.metrics.clone(),
            shutdown.clone(),
        ));
    }
    // Where the changes watcher starts: the newest change before this node serves anything.
    let changes_start = stores.api.last_doc_change().await?;
    background.spawn(changes::watch(app.clone(), changes_start, shutdown.clone()));
    if !webhooks.urls.is_empty() {
        background.spawn(webhooks::run(
            stores.api.clone(),
            webhooks,
            stores.events_written.clone(),
            shutdown.clone(),
        ));
    }
    background.spawn(cleanup_idempotency_keys(
        stores.api.clone(),
        idempotency_ttl,
        shutdown.clone(),
    ));
    if app.config.room.history.enabled() {
        background.spawn(prune_history(
            stores.api.clone(),
            app.config.room.history,
            app.metrics.clone(),
            shutdown.clone(),
        ));
    }
    background.close();
    let connections = app.connections.clone();
    let header_timeout = app.config.limits.header_timeout;
    let router = http::router(app.clone());
    if let Some(inbound) = inbound {
        tokio::spawn(serve_bus(app, router.clone(), inbound, shutdown.clone()));
    }
    let server = tokio::spawn(serve(listener, router, header_timeout, shutdown.clone()));

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
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), background.wait()).await;
    tracing::info!("stopped");
    Ok(())
}

/// The history prune job: every `prune_interval`, deletes log rows and automatic versions
/// older than `retention` (`HistoryStore::prune_history`, which records each run in `jobs`).
/// Every node runs it; the deletes are idempotent.
async fn prune_history(
    api: Arc<dyn ApiStore>,
    history: config::HistoryConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(history.prune_interval) => {}
            _ = shutdown.cancelled() => return,
        }
        let now = storage::now_ms();
        let cutoff =
            now.saturating_sub(i64::try_from(history.retention.as_millis()).unwrap_or(i64::MAX));
        metrics.history_prune_runs.inc();
        match api.prune_history(cutoff, now).await {
            Ok(report) => {
                metrics.history_rows_pruned.inc_by(report.rows);
                metrics.history_versions_pruned.inc_by(report.versions);
                metrics
                    .history_prune_last_success
                    .set(storage::now_ms() / 1000);
                if report.rows + report.versions > 0 {
                    tracing::info!(
                        docs = report.docs,
                        rows = report.rows,
                        versions = report.versions,
                        "history pruned"
                    );
                }
            }
            Err(e) => {
                metrics.history_prune_failures.inc();
                tracing::warn!(error = %e, "history prune failed");
            }
        }
    }
}

/// Deletes expired idempotency keys every few minutes.
async fn cleanup_idempotency_keys(
    api: Arc<dyn ApiStore>,
    ttl: std::time::Duration,
    shutdown: CancellationToken,
) {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(300);
    loop {
        let before = storage::now_ms() - ttl.as_millis() as i64;
        match api.idem_cleanup(before).await {
            Ok(n) if n > 0 => tracing::debug!(removed = n, "expired idempotency keys removed"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "idempotency key cleanup failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(EVERY) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Accepts connections and serves HTTP/1 on each until `shutdown`, then lets requests in
/// flight finish (upgraded WebSocket connections live on in their own tasks).
///
/// Hand-written rather than `axum::serve`, which sets no timer and so no timeout at all: a
/// client that opens a connection and sends its request headers slowly (or never) would hold
/// it forever. Here a client has `header_timeout` to send its request line and headers, on
/// each request of a keep-alive connection too; a WebSocket, once upgraded, is not limited.
/// Every accepted socket gets `TCP_NODELAY`: small frames (a one-character update is about
/// 20 bytes) leave at once, where Nagle's algorithm made a frame sent while the previous one
/// was unacknowledged wait for the client's delayed ACK (measured: about 13 ms on loopback
/// for one delivery in three when four clients type in one document). The client's address
/// reaches handlers as [`axum::extract::ConnectInfo`], for the per-address limits.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    header_timeout: std::time::Duration,
    shutdown: CancellationToken,
) {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        set_nodelay(&tcp);
        let (router, builder, shutdown) = (router.clone(), builder.clone(), shutdown.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                router.clone().oneshot(req.map(axum::body::Body::new))
            });
            let conn = builder
                .serve_connection(TokioIo::new(tcp), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    return;
                }
                _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
}

fn set_nodelay(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}

/// Joins the bus (`--bus`) when several nodes share a PostgreSQL database; what it brings in
/// is served by [`serve_bus`].
async fn start_bus(
    config: &Config,
    registry: &Arc<room::Registry>,
) -> anyhow::Result<
    Option<(
        Arc<bus::Bus>,
        tokio::sync::mpsc::UnboundedReceiver<bus::Inbound>,
    )>,
> {
    let (url, lease) = match (&config.bus_url, &registry.config.lease) {
        (Some(url), Some(lease)) => (url, lease),
        (Some(_), None) => {
            tracing::warn!("--bus is ignored: several nodes need a PostgreSQL database");
            return Ok(None);
        }
        _ => return Ok(None),
    };
    let Some(key) = &config.cluster_key else {
        anyhow::bail!(
            "--bus needs --cluster-key (QUIRE_CLUSTER_KEY): a shared secret of at least \
             {} bytes, the same on every node, that signs the messages between nodes",
            bus::MIN_CLUSTER_KEY
        );
    };
    let bus_config = bus::BusConfig {
        url: url.clone(),
        credentials: config.bus_credentials.clone(),
        key: bus::ClusterKey::new(key.expose())?,
        faults: config.bus_faults.clone(),
    };
    let (bus, inbound) = bus::Bus::start(
        bus_config,
        lease.node_id.clone(),
        registry.clone(),
        config.limits.clone(),
    )
    .await?;
    Ok(Some((bus, inbound)))
}

/// Serves what the bus brings in: relayed clients (`relay`), changes other nodes announce
/// (`changes`) and requests forwarded to this node as a document's owner (`http::owner`,
/// through `router`). Each in a task of its own: a room slow to answer holds up nothing else.
async fn serve_bus(
    app: AppState,
    router: axum::Router,
    mut inbound: tokio::sync::mpsc::UnboundedReceiver<bus::Inbound>,
    shutdown: CancellationToken,
) {
    // Ends at shutdown: it holds the bus, whose own tasks end when the last handle goes.
    while let Some(event) = tokio::select! {
        event = inbound.recv() => event,
        _ = shutdown.cancelled() => None,
    } {
        let Some(bus) = app.bus.clone() else { return };
        let registry = app.registry.clone();
        match event {
            bus::Inbound::Open(open) => {
                tokio::spawn(relay::serve_remote(bus, registry, open));
            }
            bus::Inbound::Changed { name, change } => {
                tokio::spawn(changes::on_announced(bus, registry, name, change));
            }
            bus::Inbound::Request(request) => {
                tokio::spawn(http::owner::serve_forwarded(
                    app.clone(),
                    router.clone(),
                    request,
                ));
            }
        }
    }
}
