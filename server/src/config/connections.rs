//! Client connections: message sizes, timeouts, rate limits, the Hocuspocus endpoint's bounds.

use super::*;

layered! {
    /// Client connections: message sizes, timeouts, rate limits, the Hocuspocus endpoint's bounds.
    pub struct ConnectionSettings {
        /// Largest WebSocket message accepted, in bytes [default: 16777216]
        #[arg(long, env = "QUIRE_MAX_MESSAGE_SIZE")]
        pub max_message_size: Option<usize>,
        /// Bytes a WebSocket connection reads per system call; small keeps idle connections cheap [default: 128]
        #[arg(long, env = "QUIRE_WS_READ_BUFFER")]
        pub ws_read_buffer: Option<usize>,
        /// Sync Step 1 and QueryAwareness messages a connection may send per minute (a burst of
        /// that many, refilled evenly); over it the connection is closed with 1008 [default: 120]
        #[arg(long, env = "QUIRE_SYNC_REQUESTS_PER_MINUTE")]
        pub sync_requests_per_minute: Option<u32>,
        /// Awareness updates a connection may send per second (bursts of twice that); over it the
        /// connection is closed with 1008 [default: 50]
        #[arg(long, env = "QUIRE_AWARENESS_PER_SECOND")]
        pub awareness_per_second: Option<u32>,
        /// New WebSocket connections one client address may open per minute (a burst of that
        /// many); over it the upgrade gets 429 [default: 600]
        #[arg(long, env = "QUIRE_CONNECTIONS_PER_MINUTE_PER_ADDR")]
        pub connections_per_minute_per_addr: Option<u32>,
        /// Failed authentications (bad, expired or revoked tokens) one client address may make per
        /// minute; over it every request from the address gets 429 until the minute passes
        /// [default: 30]
        #[arg(long, env = "QUIRE_AUTH_FAILURES_PER_MINUTE_PER_ADDR")]
        pub auth_failures_per_minute_per_addr: Option<u32>,
        /// Apply the per-address limits to loopback clients too (they are exempt by default, so
        /// local tools and a reverse proxy on the same host are never limited) [default: false]
        #[arg(long, env = "QUIRE_RATE_LIMIT_LOOPBACK")]
        pub rate_limit_loopback: Option<bool>,
        /// Time a client has to send its request headers (a WebSocket upgrade included) after
        /// connecting; slower ones are disconnected [default: 10s]
        #[arg(long, env = "QUIRE_HEADER_TIMEOUT")]
        pub header_timeout: Option<HumanDuration>,
        /// Most documents one socket of the Hocuspocus endpoint may have open or waiting for
        /// authentication; one more open is refused (PermissionDenied), one more waiting closes
        /// the socket with 1008 [default: 100]
        #[arg(long, env = "QUIRE_HOCUSPOCUS_MAX_DOCUMENTS")]
        pub hocuspocus_max_documents: Option<usize>,
        /// Frames a Hocuspocus socket may send for documents not yet authenticated (held until
        /// their Auth is answered); more close the socket with 1008 [default: 1000]
        #[arg(long, env = "QUIRE_HOCUSPOCUS_PENDING_FRAMES")]
        pub hocuspocus_pending_frames: Option<usize>,
        /// The same in bytes [default: 4194304]
        #[arg(long, env = "QUIRE_HOCUSPOCUS_PENDING_BYTES")]
        pub hocuspocus_pending_bytes: Option<usize>,
        /// How long a document's frames may wait for its Auth message on a Hocuspocus socket
        /// before the socket is closed with 1008 [default: 10s]
        #[arg(long, env = "QUIRE_HOCUSPOCUS_AUTH_TIMEOUT")]
        pub hocuspocus_auth_timeout: Option<HumanDuration>,
        /// Largest stateless message (Hocuspocus), in bytes; larger ones close the socket with
        /// 1009 [default: 65536]
        #[arg(long, env = "QUIRE_MAX_STATELESS_BYTES")]
        pub max_stateless_bytes: Option<usize>,
        /// Stateless messages one Hocuspocus socket may send per second (bursts of twice that),
        /// each a webhook event; over it the socket is closed with 1008 [default: 20]
        #[arg(long, env = "QUIRE_STATELESS_PER_SECOND")]
        pub stateless_per_second: Option<u32>,
        /// Close a connection silent for this long [default: 90s]
        #[arg(long, env = "QUIRE_IDLE_TIMEOUT")]
        pub idle_timeout: Option<HumanDuration>,
        /// How long the close frame of a client closed for not reading (1013) may take to leave
        /// before its socket is dropped [default: 30s]
        #[arg(long, env = "QUIRE_SLOW_CLOSE_TIMEOUT")]
        pub slow_close_timeout: Option<HumanDuration>,
        /// Longest a connection's write may make no progress (an HTTP answer the client does not
        /// read, a WebSocket whose client stopped reading); then the connection is closed
        /// [default: 30s]
        #[arg(long, env = "QUIRE_WRITE_TIMEOUT")]
        pub write_timeout: Option<HumanDuration>,
    }
}

/// Size and rate bounds on what clients may send and what is held for them.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_message_size: usize,
    pub ws_read_buffer: usize,
    pub sync_requests_per_minute: u32,
    pub awareness_per_second: u32,
    pub connections_per_minute_per_addr: u32,
    pub auth_failures_per_minute_per_addr: u32,
    pub rate_limit_loopback: bool,
    pub header_timeout: Duration,
    pub hocuspocus_max_documents: usize,
    pub hocuspocus_pending_frames: usize,
    pub hocuspocus_pending_bytes: usize,
    pub hocuspocus_auth_timeout: Duration,
    pub max_stateless_bytes: usize,
    pub stateless_per_second: u32,
}

impl ConnectionSettings {
    pub(super) fn limits(&self) -> Limits {
        let d = or_default;
        Limits {
            max_message_size: self.max_message_size.unwrap_or(16 << 20),
            ws_read_buffer: self.ws_read_buffer.unwrap_or(128).max(16),
            sync_requests_per_minute: self.sync_requests_per_minute.unwrap_or(120).max(1),
            awareness_per_second: self.awareness_per_second.unwrap_or(50).max(1),
            connections_per_minute_per_addr: self
                .connections_per_minute_per_addr
                .unwrap_or(600)
                .max(1),
            auth_failures_per_minute_per_addr: self
                .auth_failures_per_minute_per_addr
                .unwrap_or(30)
                .max(1),
            rate_limit_loopback: self.rate_limit_loopback.unwrap_or(false),
            header_timeout: d(self.header_timeout, Duration::from_secs(10)),
            hocuspocus_max_documents: self.hocuspocus_max_documents.unwrap_or(100).max(1),
            hocuspocus_pending_frames: self.hocuspocus_pending_frames.unwrap_or(1000).max(1),
            hocuspocus_pending_bytes: self.hocuspocus_pending_bytes.unwrap_or(4 << 20).max(1),
            hocuspocus_auth_timeout: d(self.hocuspocus_auth_timeout, Duration::from_secs(10)),
            max_stateless_bytes: self.max_stateless_bytes.unwrap_or(64 << 10).max(1),
            stateless_per_second: self.stateless_per_second.unwrap_or(20).max(1),
        }
    }
}
