//! The database: where it is, and how its writers commit.

use super::*;

layered! {
    /// The database: where it is, and how its writers commit.
    pub struct StoreSettings {
        /// Database URL [default: sqlite://quire.db]
        #[arg(long = "database", env = "QUIRE_DATABASE_URL")]
        pub database_url: Option<Secret>,
        /// SQLite `synchronous` pragma [default: full]
        #[arg(long, env = "QUIRE_SQLITE_SYNCHRONOUS", value_enum)]
        pub sqlite_synchronous: Option<SqliteSync>,
        /// Longest the SQLite writer holds a commit open for other documents' writes to share
        /// its fsync; 0 commits at once [default: 10ms]
        #[arg(long, env = "QUIRE_SQLITE_COMMIT_DELAY")]
        pub sqlite_commit_delay: Option<HumanDuration>,
        /// Writes of other documents the SQLite writer waits for before committing, at most
        /// the commit delay [default: 8]
        #[arg(long, env = "QUIRE_SQLITE_COMMIT_SIBLINGS")]
        pub sqlite_commit_siblings: Option<u32>,
        /// Longest a PostgreSQL writer holds a commit open for other documents' writes to share
        /// its statement and commit; 0 commits at once [default: 10ms]
        #[arg(long, env = "QUIRE_POSTGRES_COMMIT_DELAY")]
        pub postgres_commit_delay: Option<HumanDuration>,
        /// Writes of other documents the PostgreSQL writers wait for before committing, at most
        /// the commit delay [default: 8]
        #[arg(long, env = "QUIRE_POSTGRES_COMMIT_SIBLINGS")]
        pub postgres_commit_siblings: Option<u32>,
    }
}

/// A writer's group-commit window as configured: how long a commit may be held open for
/// other documents' writes, and how many of them it waits for (what the window does:
/// `storage::CommitWindowSettings`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitWindowConfig {
    pub delay: Duration,
    pub siblings: u32,
}

impl StoreSettings {
    pub(super) fn database_url(&self) -> Secret {
        self.database_url
            .clone()
            .unwrap_or_else(|| "sqlite://quire.db".into())
    }

    /// The SQLite writer's and the PostgreSQL writers' group-commit windows.
    pub(super) fn commit_windows(&self) -> (CommitWindowConfig, CommitWindowConfig) {
        let window = |delay, siblings: Option<u32>| CommitWindowConfig {
            delay: or_default(delay, Duration::from_millis(10)),
            siblings: siblings.unwrap_or(8),
        };
        (
            window(self.sqlite_commit_delay, self.sqlite_commit_siblings),
            window(self.postgres_commit_delay, self.postgres_commit_siblings),
        )
    }
}
