//! The server process: where it listens, its log, its pages, its shutdown.

use super::*;

layered! {
    /// The server process: where it listens, its log, its pages, its shutdown.
    pub struct ServerSettings {
        /// Address to listen on [default: 127.0.0.1:1234]
        #[arg(long, env = "QUIRE_BIND")]
        pub bind: Option<SocketAddr>,
        /// Log format [default: text]
        #[arg(long, env = "QUIRE_LOG_FORMAT", value_enum)]
        pub log_format: Option<LogFormat>,
        /// Log filter, tracing-subscriber syntax [default: info]
        #[arg(long, env = "QUIRE_LOG")]
        pub log: Option<String>,
        /// Directory of web pages served at / to browsers (requests without a WebSocket upgrade)
        /// instead of the editor compiled into the binary (web/build.sh writes web/dist, which the
        /// next build compiles in) [default: the compiled-in editor]
        #[arg(long, env = "QUIRE_WEB_ROOT")]
        pub web_root: Option<PathBuf>,
        /// Time allowed for a graceful shutdown [default: 10s]
        #[arg(long, env = "QUIRE_SHUTDOWN_GRACE")]
        pub shutdown_grace: Option<HumanDuration>,
    }
}

impl ServerSettings {
    pub(super) fn bind(&self) -> SocketAddr {
        self.bind
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 1234)))
    }
}
