//! Typed configuration, layered: built-in defaults, then an optional TOML file, then `QUIRE_*`
//! environment variables, then command-line flags (the last one set wins).
//!
//! [`Settings`] is both the clap argument group and the TOML schema, every field optional,
//! made of one group per concern, each in its file with the resolved settings it gives:
//! `server.rs`, `store.rs` (the database), `connections.rs` (client connections' bounds and
//! rates), `room.rs`, `history.rs`, `api.rs` (the HTTP API and its heavy-work gate),
//! `cluster.rs` and `webhooks.rs`. The TOML keys and flags are the settings' names, flat.
//! [`Settings::or`] layers them and [`Settings::resolve`] gives a [`Config`] with no options
//! left.

/// A group of settings, each optional: the struct, [`or`](Self::or) to layer it over
/// another, and the names of its settings (its TOML keys).
macro_rules! layered {
    ($(#[$meta:meta])* pub struct $name:ident {
        $($(#[$fmeta:meta])* pub $field:ident: Option<$ty:ty>,)*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Default, Clone, clap::Args, serde::Deserialize)]
        #[serde(default)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: Option<$ty>,)*
        }

        impl $name {
            /// The names of its settings.
            pub const NAMES: &'static [&'static str] = &[$(stringify!($field)),*];

            /// Fills every field this layer leaves unset from `lower`.
            pub fn or(self, lower: $name) -> $name {
                $name { $($field: self.$field.or(lower.$field)),* }
            }
        }
    };
}

mod api;
mod cluster;
mod connections;
mod history;
mod room;
mod server;
mod store;
mod unquoted;
mod webhooks;

pub use api::{ApiSettings, GateConfig};
pub use cluster::{ClusterSettings, LeaseConfig};
pub use connections::{ConnectionSettings, Limits};
pub use history::{HistoryConfig, HistorySettings};
pub use room::{RoomConfig, RoomSettings};
pub use server::ServerSettings;
pub use store::{CommitWindowConfig, StoreSettings};
use unquoted::unquoted;
pub use webhooks::{WebhookConfig, WebhookSettings};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// A duration written the human way (`30s`, `500ms`, `2m`) in flags, env vars and TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A setting that must not appear in logs: `Debug` prints `[redacted]`. Read it with
/// [`Secret::expose`] where it is used.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_owned())
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_owned()))
    }
}

/// `v`, or `default` when unset.
fn or_default(v: Option<HumanDuration>, default: Duration) -> Duration {
    v.map_or(default, |h| h.0)
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// SQLite's `synchronous` pragma. `full` (the default) fsyncs the WAL on every commit, so an
/// acknowledged update survives power loss; `normal` survives a process crash only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SqliteSync {
    Off,
    Normal,
    Full,
    Extra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Every setting, optional, as read from one layer: one group per concern.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct Settings {
    #[command(flatten)]
    pub server: ServerSettings,
    #[command(flatten)]
    pub store: StoreSettings,
    #[command(flatten)]
    pub connections: ConnectionSettings,
    #[command(flatten)]
    pub room: RoomSettings,
    #[command(flatten)]
    pub history: HistorySettings,
    #[command(flatten)]
    pub api: ApiSettings,
    #[command(flatten)]
    pub cluster: ClusterSettings,
    #[command(flatten)]
    pub webhooks: WebhookSettings,
}

/// The resolved configuration handed to `crate::run`.
#[derive(Debug, Clone)]
pub struct Config {
    pub bind: SocketAddr,
    /// May hold a password: `Debug` redacts it; logs use `storage::redact_url`.
    pub database_url: Secret,
    pub sqlite_synchronous: SqliteSync,
    pub sqlite_commit: CommitWindowConfig,
    pub postgres_commit: CommitWindowConfig,
    pub log_format: LogFormat,
    pub log: String,
    pub limits: Limits,
    pub idle_timeout: Duration,
    /// How long a 1013 close (a client that stopped reading) may take before the socket is
    /// dropped: the client may be slow rather than gone, and should learn why it was closed
    /// once it reads again; the bound frees the connection of one that never does.
    pub slow_close_timeout: Duration,
    pub shutdown_grace: Duration,
    pub room: RoomConfig,
    pub auth_keys: Vec<Secret>,
    pub admin_key: Option<Secret>,
    pub idempotency_ttl: Duration,
    /// The admin dashboard: how often its figures are sampled, and how long they are kept.
    pub admin_sample_every: Duration,
    pub admin_history: Duration,
    pub forward_timeout: Duration,
    /// The heavy-work gate.
    pub gate: GateConfig,
    /// Longest a connection's write may make no progress before it is closed.
    pub write_timeout: Duration,
    /// Longest a merge, reject or restore waits for the document's merge lock.
    pub merge_lock_wait: Duration,
    /// Bytes of named and restore versions one document may hold.
    pub max_version_bytes: u64,
    pub webhooks: WebhookConfig,
    /// The bus between nodes (NATS), if any.
    pub bus_url: Option<Secret>,
    pub bus_credentials: Option<PathBuf>,
    /// Signs bus messages (required with `bus_url`).
    pub cluster_key: Option<Secret>,
    /// At most one bus message per destination node per tick.
    pub bus_tick: Duration,
    /// This node's name in room leases.
    pub node_id: String,
    pub lease_ttl: Duration,
    /// A directory of web pages served instead of those compiled in (may not exist: then /
    /// explains how to build them). `None`: the pages compiled into the binary.
    pub web_root: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Settings::default().resolve()
    }
}

impl Settings {
    /// Reads a TOML file of settings.
    pub fn from_file(path: &PathBuf) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config file {}: {e}", path.display()))?;
        Settings::from_toml(&text)
            .map_err(|e| anyhow::anyhow!("invalid config file {}{e}", path.display()))
    }

    /// Reads settings from TOML text: every key must name a setting. An error's message is
    /// `, line N: what` (or `: what`), without the values it would quote (one may be a secret).
    pub fn from_toml(text: &str) -> Result<Settings, String> {
        let at = |e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            let message = unquoted(e.message());
            match line {
                Some(line) => format!(", line {line}: {message}"),
                None => format!(": {message}"),
            }
        };
        let table: toml::Table = toml::from_str(text).map_err(at)?;
        let known = Settings::names();
        if let Some(key) = table.keys().find(|k| !known.contains(&k.as_str())) {
            let line = text
                .lines()
                .position(|l| {
                    let l = l.trim_start();
                    l.starts_with(key.as_str()) || l.starts_with(&format!("\"{key}\""))
                })
                .map_or(String::new(), |n| format!(", line {}", n + 1));
            return Err(format!("{line}: unknown setting `{key}`"));
        }
        // Each group from the text itself, so a wrong type is reported at its line.
        Ok(Settings {
            server: toml::from_str(text).map_err(at)?,
            store: toml::from_str(text).map_err(at)?,
            connections: toml::from_str(text).map_err(at)?,
            room: toml::from_str(text).map_err(at)?,
            history: toml::from_str(text).map_err(at)?,
            api: toml::from_str(text).map_err(at)?,
            cluster: toml::from_str(text).map_err(at)?,
            webhooks: toml::from_str(text).map_err(at)?,
        })
    }

    /// The names of every setting (the TOML keys; clap's ids of the flags).
    pub fn names() -> Vec<&'static str> {
        [
            ServerSettings::NAMES,
            StoreSettings::NAMES,
            ConnectionSettings::NAMES,
            RoomSettings::NAMES,
            HistorySettings::NAMES,
            ApiSettings::NAMES,
            ClusterSettings::NAMES,
            WebhookSettings::NAMES,
        ]
        .concat()
    }

    /// Fills every field this layer leaves unset from `lower`.
    pub fn or(self, lower: Settings) -> Settings {
        Settings {
            server: self.server.or(lower.server),
            store: self.store.or(lower.store),
            connections: self.connections.or(lower.connections),
            room: self.room.or(lower.room),
            history: self.history.or(lower.history),
            api: self.api.or(lower.api),
            cluster: self.cluster.or(lower.cluster),
            webhooks: self.webhooks.or(lower.webhooks),
        }
    }

    /// Applies the built-in defaults to whatever is still unset.
    pub fn resolve(self) -> Config {
        let d = or_default;
        let Settings {
            server,
            store,
            connections,
            room,
            history,
            api,
            cluster,
            webhooks,
        } = self;
        let (sqlite_commit, postgres_commit) = store.commit_windows();
        Config {
            bind: server.bind(),
            database_url: store.database_url(),
            sqlite_synchronous: store.sqlite_synchronous.unwrap_or(SqliteSync::Full),
            sqlite_commit,
            postgres_commit,
            log_format: server.log_format.unwrap_or(LogFormat::Text),
            log: server.log.unwrap_or_else(|| "info".to_owned()),
            web_root: server.web_root,
            shutdown_grace: d(server.shutdown_grace, Duration::from_secs(10)),
            limits: connections.limits(),
            idle_timeout: d(connections.idle_timeout, Duration::from_secs(90)),
            slow_close_timeout: d(connections.slow_close_timeout, Duration::from_secs(30)),
            write_timeout: d(connections.write_timeout, Duration::from_secs(30))
                .max(Duration::from_millis(10)),
            room: room.resolve(history.resolve()),
            max_version_bytes: history.max_version_bytes.unwrap_or(1 << 30),
            gate: api.gate(),
            auth_keys: api.auth_keys.unwrap_or_default(),
            admin_key: api.admin_key,
            idempotency_ttl: d(api.idempotency_ttl, Duration::from_secs(24 * 3600)),
            admin_sample_every: d(api.admin_sample_every, Duration::from_secs(1))
                .max(Duration::from_millis(50)),
            admin_history: d(api.admin_history, Duration::from_secs(3600)),
            merge_lock_wait: d(api.merge_lock_wait, Duration::from_secs(10)),
            node_id: cluster.node_id(),
            bus_url: cluster.bus_url,
            bus_credentials: cluster.bus_credentials,
            cluster_key: cluster.cluster_key,
            bus_tick: d(cluster.bus_tick, Duration::ZERO).min(Duration::from_millis(100)),
            lease_ttl: d(cluster.lease_ttl, Duration::from_secs(5)).max(Duration::from_millis(100)),
            forward_timeout: d(cluster.forward_timeout, Duration::from_secs(10)),
            webhooks: webhooks.resolve(),
        }
    }
}

#[cfg(test)]
mod tests;
