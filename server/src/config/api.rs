//! The HTTP API: credentials, the admin dashboard, idempotency, the heavy-work gate, merges.

use super::*;

layered! {
    /// The HTTP API: credentials, the admin dashboard, idempotency, the heavy-work gate, merges.
    pub struct ApiSettings {
        /// Token signing keys as `kid:secret` (secret of 16+ bytes); the first signs, all verify.
        /// Repeat the flag or separate with commas. None: open development mode [default: none]
        #[arg(long = "auth-key", env = "QUIRE_AUTH_KEYS", value_delimiter = ',')]
        pub auth_keys: Option<Vec<Secret>>,
        /// Admin key: a bearer credential with every permission, for issuing tokens [default: none]
        #[arg(long, env = "QUIRE_ADMIN_KEY")]
        pub admin_key: Option<Secret>,
        /// How often the admin dashboard's figures are sampled and sent to open dashboards
        /// [default: 1s]
        #[arg(long, env = "QUIRE_ADMIN_SAMPLE_EVERY")]
        pub admin_sample_every: Option<HumanDuration>,
        /// How much of the sampled figures the server keeps for the dashboard's plots [default: 1h]
        #[arg(long, env = "QUIRE_ADMIN_HISTORY")]
        pub admin_history: Option<HumanDuration>,
        /// How long an Idempotency-Key is remembered [default: 24h]
        #[arg(long, env = "QUIRE_IDEMPOTENCY_TTL")]
        pub idempotency_ttl: Option<HumanDuration>,
        /// Whole-document computations (history rebuilds, diffs, forks, exports) running at
        /// once on this node, on the blocking pool [default: the number of cores]
        #[arg(long, env = "QUIRE_HEAVY_PER_NODE")]
        pub heavy_per_node: Option<usize>,
        /// Whole-document requests running at once per document; more wait in the queue, and
        /// get 429 if no share comes free within the wait [default: 2]
        #[arg(long, env = "QUIRE_HEAVY_PER_DOC")]
        pub heavy_per_doc: Option<usize>,
        /// Whole-document requests waiting (for their document's share or a node slot) at once on
        /// this node; more get 503 [default: 32]
        #[arg(long, env = "QUIRE_HEAVY_QUEUE")]
        pub heavy_queue: Option<usize>,
        /// Longest a whole-document request waits for a free slot before 503 [default: 5s]
        #[arg(long, env = "QUIRE_HEAVY_WAIT")]
        pub heavy_wait: Option<HumanDuration>,
        /// Bytes of computed history answers (content at a position or version, encoded
        /// states) kept so repeated reads cost one computation [default: 67108864]
        #[arg(long, env = "QUIRE_HISTORY_CACHE_BYTES")]
        pub history_cache_bytes: Option<usize>,
        /// Whole-document requests one caller (a user; an address when no credentials are
        /// configured) may have in flight at once on this node, from admission until its answer
        /// is sent; more get 429 `too-many-heavy-requests` [default: 4]
        #[arg(long, env = "QUIRE_HEAVY_PER_CALLER")]
        pub heavy_per_caller: Option<usize>,
        /// Longest a merge, a reject or a restore waits for the document's merge lock (another
        /// one under way); then 503 `document-busy-merging` [default: 10s]
        #[arg(long, env = "QUIRE_MERGE_LOCK_WAIT")]
        pub merge_lock_wait: Option<HumanDuration>,
    }
}

/// The heavy-work gate (`gate.rs`): how much whole-document work (history rebuilds, diffs,
/// forks, exports) runs at once, how long callers may wait for it, and how much of its
/// results is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateConfig {
    /// Heavy computations running at once on the node.
    pub per_node: usize,
    /// Heavy requests running at once per document.
    pub per_doc: usize,
    /// Requests waiting (for a document's share or a node slot) at once.
    pub queue: usize,
    /// Longest a request waits for a node slot.
    pub wait: Duration,
    /// Bytes of computed answers kept.
    pub cache_bytes: usize,
    /// Whole-document requests in flight at once per caller (computing, waiting or sending).
    pub per_caller: usize,
}

impl ApiSettings {
    pub(super) fn gate(&self) -> GateConfig {
        GateConfig {
            per_node: self
                .heavy_per_node
                .unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
                })
                .max(1),
            per_doc: self.heavy_per_doc.unwrap_or(2).max(1),
            queue: self.heavy_queue.unwrap_or(32),
            wait: or_default(self.heavy_wait, Duration::from_secs(5)),
            cache_bytes: self.history_cache_bytes.unwrap_or(64 << 20),
            per_caller: self.heavy_per_caller.unwrap_or(4).max(1),
        }
    }
}
