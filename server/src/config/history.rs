//! The version history: what is kept, and when versions are taken.

use super::*;

layered! {
    /// The version history: what is kept, and when versions are taken.
    pub struct HistorySettings {
        /// How long log rows are kept after a snapshot covers them, for the version history
        /// (docs/history.md); `0` keeps no history (snapshots delete the rows they cover)
        /// [default: 30days]
        #[arg(long, env = "QUIRE_HISTORY_RETENTION")]
        pub history_retention: Option<HumanDuration>,
        /// An editing session ends after this long without an edit: an automatic version is
        /// taken then [default: 5m]
        #[arg(long, env = "QUIRE_VERSION_IDLE")]
        pub version_idle: Option<HumanDuration>,
        /// During a long editing session, an automatic version at least this often [default: 1h]
        #[arg(long, env = "QUIRE_VERSION_EVERY")]
        pub version_every: Option<HumanDuration>,
        /// How often the history prune job runs [default: 1h]
        #[arg(long, env = "QUIRE_HISTORY_PRUNE_INTERVAL")]
        pub history_prune_interval: Option<HumanDuration>,
        /// Bytes of named and restore versions one document may hold (each a full copy of the
        /// content); past it creating one gets 507 [default: 1073741824]
        #[arg(long, env = "QUIRE_MAX_VERSION_BYTES")]
        pub max_version_bytes: Option<u64>,
    }
}

/// How much history is kept, and when automatic versions are taken (docs/history.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Log rows are kept this long after a snapshot covers them; zero keeps no history.
    pub retention: Duration,
    /// An automatic version after this long without an edit.
    pub version_idle: Duration,
    /// And at least this often during a long session.
    pub version_every: Duration,
    /// How often the prune job runs.
    pub prune_interval: Duration,
}

impl HistoryConfig {
    /// Whether history is kept at all.
    pub fn enabled(&self) -> bool {
        !self.retention.is_zero()
    }
}

impl HistorySettings {
    pub(super) fn resolve(&self) -> HistoryConfig {
        let d = or_default;
        HistoryConfig {
            retention: d(self.history_retention, Duration::from_secs(30 * 24 * 3600)),
            version_idle: d(self.version_idle, Duration::from_secs(300))
                .max(Duration::from_millis(10)),
            version_every: d(self.version_every, Duration::from_secs(3600))
                .max(Duration::from_millis(10)),
            prune_interval: d(self.history_prune_interval, Duration::from_secs(3600))
                .max(Duration::from_millis(10)),
        }
    }
}
