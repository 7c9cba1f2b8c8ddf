//! Several nodes: the bus, the cluster key, node names and leases, forwarding.

use super::*;

layered! {
    /// Several nodes: the bus, the cluster key, node names and leases, forwarding.
    pub struct ClusterSettings {
        /// NATS URL of the bus between nodes sharing a PostgreSQL database (nats://HOST:PORT, with
        /// NATS credentials as nats://USER:PASSWORD@HOST:PORT or nats://TOKEN@HOST:PORT; tls://
        /// for TLS); none: clients of a document another node owns are refused with 1013
        #[arg(long = "bus", env = "QUIRE_BUS_URL")]
        pub bus_url: Option<Secret>,
        /// A NATS credentials file (.creds: user JWT and NKey seed) for the bus [default: none]
        #[arg(long, env = "QUIRE_BUS_CREDENTIALS")]
        pub bus_credentials: Option<PathBuf>,
        /// Shared secret every node signs its bus messages with and checks others' against (at
        /// least 16 bytes, the same on every node); required with --bus
        #[arg(long, env = "QUIRE_CLUSTER_KEY")]
        pub cluster_key: Option<Secret>,
        /// A node publishes at most one bus message per other node per tick (at most 100ms),
        /// carrying every frame that waited for that node: a frame after a quiet tick leaves at
        /// once, frames that come sooner wait for the tick's end (a full message leaves at once).
        /// Fewer NATS messages and less NATS CPU under load, a higher delivery p99 for relayed
        /// clients; 0 publishes whatever waits as soon as it can [default: 0]
        #[arg(long, env = "QUIRE_BUS_TICK")]
        pub bus_tick: Option<HumanDuration>,
        /// This node's name in room leases (PostgreSQL) [default: node-<random>]
        #[arg(long, env = "QUIRE_NODE_ID")]
        pub node_id: Option<String>,
        /// How long a node's lease on a document's room lasts without renewal (PostgreSQL) [default: 5s]
        #[arg(long, env = "QUIRE_LEASE_TTL")]
        pub lease_ttl: Option<HumanDuration>,
        /// With several nodes: how long a request forwarded to the document's owner (a content
        /// write made on another node) may wait for its answer before 503 [default: 10s]
        #[arg(long, env = "QUIRE_FORWARD_TIMEOUT")]
        pub forward_timeout: Option<HumanDuration>,
    }
}

/// A node's identity and lease time in room leases.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub node_id: std::sync::Arc<str>,
    pub ttl: Duration,
}

impl ClusterSettings {
    pub(super) fn node_id(&self) -> String {
        self.node_id
            .clone()
            .unwrap_or_else(|| format!("node-{:08x}", rand::random::<u32>()))
    }
}
