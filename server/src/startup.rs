//! Start-up and the background jobs: opening the stores, building the shared state, the
//! jobs every node runs beside its requests (revocations, the admin sampler, leases, changes,
//! webhooks, idempotency keys, the history prune), the bus, and the graceful shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::app::{App, AppState, TestHooks};
use crate::auth::Auth;
use crate::config::{self, Config};
use crate::metrics::Metrics;
use crate::room::Registry;
use crate::storage::api::ApiStore;
use crate::storage::postgres::{is_postgres_url, PgStore};
use crate::storage::sqlite::{EventSettings, SqliteStore};
use crate::storage::{self, DocStore, StorageError};
use crate::{admin, bus, changes, gate, http, limits, revocation, socket, webhooks};

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
        let store = Arc::new(
            PgStore::connect_with_events(url, events, window(config.postgres_commit)).await?,
        );
        return Ok(Stores {
            events_written: store.api().events_notify(),
            api: Arc::new(store.api().clone()),
            docs: store,
        });
    }
    if !url.starts_with("sqlite:") {
        return Err(StorageError::UnsupportedUrl(storage::redact_url(url)));
    }
    let store = Arc::new(
        SqliteStore::connect_with_events(
            url,
            synchronous(config.sqlite_synchronous),
            events,
            window(config.sqlite_commit),
        )
        .await?,
    );
    Ok(Stores {
        events_written: store.api().events_notify(),
        api: Arc::new(store.api().clone()),
        docs: store,
    })
}

/// The store's group-commit window as configured.
fn window(c: crate::config::CommitWindowConfig) -> storage::CommitWindowSettings {
    storage::CommitWindowSettings {
        delay: c.delay,
        siblings: c.siblings,
    }
}

/// SQLite's `synchronous` pragma as configured.
fn synchronous(s: crate::config::SqliteSync) -> sqlx::sqlite::SqliteSynchronous {
    use crate::config::SqliteSync;
    use sqlx::sqlite::SqliteSynchronous;
    match s {
        SqliteSync::Off => SqliteSynchronous::Off,
        SqliteSync::Normal => SqliteSynchronous::Normal,
        SqliteSync::Full => SqliteSynchronous::Full,
        SqliteSync::Extra => SqliteSynchronous::Extra,
    }
}

/// Serves until `shutdown` is cancelled, then shuts down gracefully: stop accepting, commit
/// and snapshot every room, close sockets with 1001, all within `config.shutdown_grace`.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_with_hooks(listener, config, TestHooks::default(), shutdown).await
}

/// [`run`] with test hooks (faults on the bus, a barrier in restores).
#[doc(hidden)]
pub async fn run_with_hooks(
    listener: TcpListener,
    config: Config,
    hooks: TestHooks,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let stores = open_stores(&config).await?;
    serve_node(listener, config, stores, hooks, shutdown).await
}

/// [`run`] with already opened stores.
pub async fn run_with_stores(
    listener: TcpListener,
    config: Config,
    stores: Stores,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    serve_node(listener, config, stores, TestHooks::default(), shutdown).await
}

async fn serve_node(
    listener: TcpListener,
    config: Config,
    stores: Stores,
    hooks: TestHooks,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (app, inbound) = build(config, &stores, hooks, &shutdown).await?;
    let address = listener
        .local_addr()
        .map_or_else(|_| app.config.bind.to_string(), |a| a.to_string());
    let background = spawn_jobs(&app, &stores, address, &shutdown).await?;
    let router = http::router(app.clone());
    if let Some(inbound) = inbound {
        tokio::spawn(serve_bus(
            app.clone(),
            router.clone(),
            inbound,
            shutdown.clone(),
        ));
    }
    let header_timeout = app.config.limits.header_timeout;
    let server = tokio::spawn(http::serve(
        listener,
        router,
        header_timeout,
        app.config.write_timeout,
        shutdown.clone(),
    ));

    shutdown.cancelled().await;
    tracing::info!("shutting down: committing and snapshotting every room");
    let grace = app.config.shutdown_grace;
    let drained = tokio::time::timeout(grace, async {
        app.registry.wait_stopped().await;
        app.connections.close();
        app.connections.wait().await;
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

/// What the bus brings in, for [`serve_bus`].
type Inbound = tokio::sync::mpsc::UnboundedReceiver<bus::Inbound>;

/// The shared state: auth with the revocations loaded, the rooms' registry, the bus.
async fn build(
    config: Config,
    stores: &Stores,
    hooks: TestHooks,
    shutdown: &CancellationToken,
) -> anyhow::Result<(AppState, Option<Inbound>)> {
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
            // Several nodes may share a PostgreSQL database: each room then holds a lease.
            lease: is_postgres_url(config.database_url.expose()).then(|| config::LeaseConfig {
                node_id: config.node_id.as_str().into(),
                ttl: config.lease_ttl,
            }),
            ..config.room.clone()
        },
        shutdown.clone(),
    );
    let (bus, inbound) = match start_bus(&config, &hooks, &registry).await? {
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
        forward_guard: Arc::new(crate::bus::replay::ReplayGuard::new(
            crate::storage::now_ms(),
        )),
        bus,
        config: Arc::new(config),
        store: stores.docs.clone(),
        api: stores.api.clone(),
        auth,
        registry,
        metrics,
        connections: TaskTracker::new(),
        hooks,
    });
    Ok((app, inbound))
}

/// Starts the background jobs; `address` is this node's, for its heartbeat.
async fn spawn_jobs(
    app: &AppState,
    stores: &Stores,
    address: String,
    shutdown: &CancellationToken,
) -> anyhow::Result<TaskTracker> {
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
    if !app.config.webhooks.urls.is_empty() {
        background.spawn(webhooks::run(
            stores.api.clone(),
            app.config.webhooks.clone(),
            stores.events_written.clone(),
            shutdown.clone(),
        ));
    }
    background.spawn(cleanup_idempotency_keys(
        stores.api.clone(),
        app.config.idempotency_ttl,
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
    Ok(background)
}

/// Joins the bus (`--bus`) when several nodes share a PostgreSQL database; what it brings in
/// is served by [`serve_bus`].
async fn start_bus(
    config: &Config,
    hooks: &TestHooks,
    registry: &Arc<Registry>,
) -> anyhow::Result<Option<(Arc<bus::Bus>, Inbound)>> {
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
        tick: config.bus_tick,
        faults: hooks.bus_faults.clone(),
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
    mut inbound: Inbound,
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
                tokio::spawn(socket::relay::serve_remote(bus, registry, open));
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
