//! Prometheus metrics, served as text at `GET /metrics`.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// Every metric Quire exports. Shared behind an `Arc`; updating a metric is a relaxed atomic.
pub struct Metrics {
    registry: Registry,
    pub rooms_loaded: IntGauge,
    pub connections: IntGauge,
    pub updates_applied: IntCounter,
    pub updates_logged: IntCounter,
    pub updates_sent: IntCounter,
    pub updates_duplicate: IntCounter,
    pub commits: IntCounter,
    pub commit_seconds: Histogram,
    pub commit_failures: IntCounter,
    pub broadcast_overflows: IntCounter,
    pub snapshots: IntCounter,
    pub snapshots_encoded_apart: IntCounter,
    pub snapshots_read_back: IntCounter,
    pub snapshot_conflicts: IntCounter,
    pub fenced_writes: IntCounter,
    pub lease_losses: IntCounter,
    pub room_load_failures: IntCounter,
    pub malformed_messages: IntCounter,
    pub updates_held: IntCounter,
    pub held_update_bytes: IntGauge,
    pub held_update_closes: IntCounter,
    pub updates_unintegrable: IntCounter,
    pub deletes_cut: IntCounter,
    pub updates_set_aside: IntCounter,
    pub peer_queue_bytes: IntGauge,
    pub room_queue_bytes: IntGauge,
    pub sync_answers_encoded: IntCounter,
    pub sync_answers_shared: IntCounter,
    pub sync_answers_skipped: IntCounter,
    pub stalled_reads: IntCounter,
    pub rate_limited: IntCounter,
    pub addr_limited: IntCounter,
    pub tokens_expired: IntCounter,
    pub bus_gaps: IntCounter,
    pub bus_duplicates: IntCounter,
    pub bus_publish_failures: IntCounter,
    pub bus_refused: IntCounter,
    pub bus_resets: IntCounter,
    pub bus_messages: IntCounter,
    pub bus_envelopes: IntCounter,
    pub rooms_stalled: IntGauge,
    pub storage_timeouts: IntCounter,
    pub forwarded_requests: IntCounter,
    pub forward_failures: IntCounter,
    pub stored_reads: IntCounter,
    pub relay_lease_checks: IntCounter,
    pub history_prune_runs: IntCounter,
    pub history_prune_failures: IntCounter,
    pub history_rows_pruned: IntCounter,
    pub history_versions_pruned: IntCounter,
    pub history_prune_last_success: IntGauge,
    pub versions_created: IntCounter,
    pub hocuspocus_sockets: IntGauge,
    pub hocuspocus_documents: IntGauge,
    pub hocuspocus_auth_failures: IntCounter,
    pub hocuspocus_pending_overflows: IntCounter,
    pub stateless_received: IntCounter,
    pub stateless_sent: IntCounter,
    pub heavy_admitted: IntCounter,
    pub heavy_running: IntGauge,
    pub heavy_waiting: IntGauge,
    pub heavy_refused: IntCounterVec,
    pub heavy_cache_hits: IntCounter,
    pub heavy_cache_misses: IntCounter,
    pub heavy_cache_bytes: IntGauge,
    pub versions_refused: IntCounter,
    pub awareness_refused: IntCounter,
    pub awareness_relays: IntCounter,
    pub forward_refused: IntCounterVec,
    pub stateless_refused: IntCounter,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry =
            Registry::new_custom(Some("quire".into()), None).unwrap_or_else(|_| Registry::new());
        fn reg<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: M) -> M {
            // Names are static and distinct, so registration cannot collide.
            let _ = r.register(Box::new(m.clone()));
            m
        }
        let gauge = |n: &str, h: &str| {
            reg(
                &registry,
                IntGauge::new(n, h).unwrap_or_else(|_| unreachable_metric()),
            )
        };
        let counter = |n: &str, h: &str| {
            reg(
                &registry,
                IntCounter::new(n, h).unwrap_or_else(|_| unreachable_metric()),
            )
        };
        let commit_seconds = reg(
            &registry,
            Histogram::with_opts(
                HistogramOpts::new("commit_seconds", "Time to commit one batch of log appends")
                    .buckets(vec![
                        0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
                    ]),
            )
            .unwrap_or_else(|_| unreachable_metric()),
        );
        Metrics {
            rooms_loaded: gauge("rooms_loaded", "Rooms (documents) loaded in memory"),
            connections: gauge("connections", "Open WebSocket connections"),
            updates_applied: counter("updates_applied_total", "Updates that changed a document"),
            updates_logged: counter("updates_logged_total", "Updates committed to the log"),
            updates_sent: counter(
                "updates_sent_total",
                "Update deliveries queued to connections (one per update per receiving peer)",
            ),
            updates_duplicate: counter(
                "updates_duplicate_total",
                "Updates that added nothing and were neither logged nor broadcast",
            ),
            commits: counter("commits_total", "Log append transactions committed"),
            commit_seconds,
            commit_failures: counter("commit_failures_total", "Log appends that failed"),
            broadcast_overflows: counter(
                "broadcast_overflows_total",
                "Connections closed with 1013 because their outbound queue was full",
            ),
            snapshots: counter("snapshots_total", "Snapshots written"),
            snapshots_encoded_apart: counter(
                "snapshots_encoded_apart_total",
                "Snapshots of large documents encoded on a blocking thread while appends went on",
            ),
            snapshots_read_back: counter(
                "snapshots_read_back_total",
                "Snapshots read back from storage to encode the next one from: the room does \
                 not hold a snapshot larger than twice snapshot_bytes in memory",
            ),
            snapshot_conflicts: counter(
                "snapshot_conflicts_total",
                "Snapshot writes refused by the optimistic version check",
            ),
            fenced_writes: counter(
                "fenced_writes_total",
                "Appends and snapshots the storage refused because the lease epoch moved on",
            ),
            lease_losses: counter(
                "lease_losses_total",
                "Rooms given up because another node took the document's lease",
            ),
            room_load_failures: counter("room_load_failures_total", "Failed document loads"),
            malformed_messages: counter(
                "malformed_messages_total",
                "Connections closed for sending a malformed message",
            ),
            updates_held: counter(
                "updates_held_total",
                "Updates held for their connection because what they depend on was missing",
            ),
            held_update_bytes: gauge(
                "held_update_bytes",
                "Bytes of updates held for their connections, waiting for their dependencies",
            ),
            held_update_closes: counter(
                "held_update_closes_total",
                "Connections closed because what they held passed held_update_bytes or \
                 held_update_timeout",
            ),
            updates_unintegrable: counter(
                "updates_unintegrable_total",
                "HTTP updates (updates, restores, merges) refused because they depend on \
                 content the document does not hold",
            ),
            deletes_cut: counter(
                "deletes_cut_total",
                "Updates whose deletions of content no one holds were cut before they applied",
            ),
            updates_set_aside: counter(
                "updates_set_aside_total",
                "Stored log rows set aside at load because they do not integrate",
            ),
            peer_queue_bytes: gauge(
                "peer_queue_bytes",
                "Bytes queued for connections and not yet written to their sockets",
            ),
            room_queue_bytes: gauge(
                "room_queue_bytes",
                "Bytes of updates received by rooms and not yet applied",
            ),
            sync_answers_encoded: counter(
                "sync_answers_encoded_total",
                "Sync Step 2 answers encoded",
            ),
            sync_answers_shared: counter(
                "sync_answers_shared_total",
                "Sync Step 2 answers served from one already encoded for the same version",
            ),
            sync_answers_skipped: counter(
                "sync_answers_skipped_total",
                "Sync and awareness requests not answered because the previous answer was unread",
            ),
            stalled_reads: counter(
                "stalled_reads_total",
                "Sync requests and HTTP reads answered from the committed copy while the room's storage was stalled",
            ),
            rate_limited: counter(
                "rate_limited_total",
                "Connections closed with 1008 for sending requests faster than their limit",
            ),
            addr_limited: counter(
                "address_limited_total",
                "Requests refused with 429 by a per-address limit (connections, failed logins)",
            ),
            tokens_expired: counter(
                "tokens_expired_total",
                "Connections closed with 4401 because their token expired",
            ),
            bus_gaps: counter(
                "bus_gaps_total",
                "Relayed connections closed (1012) because a bus message between nodes was lost",
            ),
            bus_duplicates: counter(
                "bus_duplicates_total",
                "Bus messages received twice and ignored the second time",
            ),
            bus_publish_failures: counter(
                "bus_publish_failures_total",
                "Bus envelopes that could not be published (their relayed connection is closed)",
            ),
            bus_refused: counter(
                "bus_refused_total",
                "Bus messages refused: malformed, or not signed with the cluster key",
            ),
            bus_resets: counter(
                "bus_resets_total",
                "Times every relayed connection was closed: the link to NATS dropped, or NATS \
                 dropped messages for this node (slow consumer)",
            ),
            bus_messages: counter(
                "bus_messages_total",
                "Messages this node published on the bus: one envelope, or a batch of the \
                 envelopes waiting for the same node",
            ),
            bus_envelopes: counter(
                "bus_envelopes_total",
                "Envelopes this node published on the bus (divided by quire_bus_messages_total: \
                 the mean batch)",
            ),
            rooms_stalled: gauge(
                "rooms_storage_stalled",
                "Rooms whose last log append failed or timed out: they refuse updates (1013) and \
                 retry until storage answers",
            ),
            storage_timeouts: counter(
                "storage_timeouts_total",
                "Storage operations of rooms given up after storage_timeout",
            ),
            forwarded_requests: counter(
                "forwarded_requests_total",
                "HTTP requests forwarded over the bus to the node that owns their document",
            ),
            forward_failures: counter(
                "forward_failures_total",
                "Forwarded requests the owner did not answer within forward_timeout (503)",
            ),
            relay_lease_checks: counter(
                "relay_lease_checks_total",
                "Statements reading the owners of the documents this node relays (one per second \
                 for all of them)",
            ),
            stored_reads: counter(
                "stored_reads_total",
                "Content reads answered from storage because another node (or none) serves \
                 the document",
            ),
            history_prune_runs: counter(
                "history_prune_runs_total",
                "Runs of the history prune job (its status is also in the jobs table)",
            ),
            history_prune_failures: counter(
                "history_prune_failures_total",
                "Runs of the history prune job that failed",
            ),
            history_rows_pruned: counter(
                "history_rows_pruned_total",
                "Log rows the prune job deleted (older than history_retention)",
            ),
            history_versions_pruned: counter(
                "history_versions_pruned_total",
                "Automatic versions the prune job deleted",
            ),
            history_prune_last_success: gauge(
                "history_prune_last_success_seconds",
                "When the history prune job last finished without error (Unix seconds)",
            ),
            versions_created: counter(
                "versions_created_total",
                "Versions recorded: automatic, named and restores",
            ),
            hocuspocus_sockets: gauge(
                "hocuspocus_sockets",
                "Open sockets of the Hocuspocus endpoint (/hocuspocus)",
            ),
            hocuspocus_documents: gauge(
                "hocuspocus_documents",
                "Documents open on Hocuspocus sockets (each one peer of its room)",
            ),
            hocuspocus_auth_failures: counter(
                "hocuspocus_auth_failures_total",
                "Documents refused on a Hocuspocus socket (PermissionDenied)",
            ),
            hocuspocus_pending_overflows: counter(
                "hocuspocus_pending_overflows_total",
                "Hocuspocus sockets closed because frames waiting for a document's \
                 authentication crossed a bound (count, bytes, documents or time)",
            ),
            stateless_received: counter(
                "stateless_received_total",
                "Stateless messages received from Hocuspocus clients (each a webhook event)",
            ),
            stateless_sent: counter(
                "stateless_sent_total",
                "Stateless messages sent to Hocuspocus clients (one per client reached)",
            ),
            heavy_admitted: counter(
                "heavy_admitted_total",
                "Whole-document computations (history reads, diffs, forks, exports) admitted by \
                 the heavy-work gate",
            ),
            heavy_running: gauge(
                "heavy_running",
                "Whole-document computations running on the blocking pool now",
            ),
            heavy_waiting: gauge(
                "heavy_waiting",
                "Requests waiting for a slot of the heavy-work gate now",
            ),
            heavy_refused: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "heavy_refused_total",
                        "Requests the heavy-work gate refused: `document` (429, no share of the \
                         document came free within heavy_wait), `node` (503, the queue full or \
                         no node slot within heavy_wait), `caller` (429, the caller had \
                         heavy_per_caller requests in flight) or `merge_lock` (503, another \
                         merge, reject or restore of the document held it for merge_lock_wait)",
                    ),
                    &["why"],
                )
                .unwrap_or_else(|_| unreachable_metric()),
            ),
            heavy_cache_hits: counter(
                "heavy_cache_hits_total",
                "Heavy reads answered from the cache or from a computation already under way",
            ),
            heavy_cache_misses: counter(
                "heavy_cache_misses_total",
                "Heavy reads computed (and cached when they fit the budget)",
            ),
            heavy_cache_bytes: gauge(
                "heavy_cache_bytes",
                "Bytes of computed answers the heavy-work gate keeps (history_cache_bytes)",
            ),
            stateless_refused: counter(
                "stateless_refused_total",
                "Stateless messages dropped because their Hocuspocus session is read-only",
            ),
            forward_refused: reg(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "forward_refused_total",
                        "Forwarded requests this node refused, by `why`: `seen` (a nonce \
                         already served: a replay, dropped), `stale` (sent more than 30 s \
                         ago or ahead), `before_start` (sent before this process started), \
                         `full` (65,536 nonces within the window) or `malformed`; all but \
                         `seen` are answered 503 or 400 at once",
                    ),
                    &["why"],
                )
                .unwrap_or_else(|_| unreachable_metric()),
            ),
            awareness_refused: counter(
                "awareness_refused_total",
                "Awareness entries dropped because they spoke for a client id another user's \
                 live connection holds",
            ),
            awareness_relays: counter(
                "awareness_relays_total",
                "Awareness frames a room sent to its peers at the end of a tick, each carrying \
                 every presence change of the tick (awareness_tick)",
            ),
            versions_refused: counter(
                "versions_refused_total",
                "Versions refused because the document's version budget was full",
            ),
            registry,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Metric constructors only fail on invalid names or options, which are literals above.
#[cold]
fn unreachable_metric<T>() -> T {
    unreachable!("static metric definitions are valid")
}
