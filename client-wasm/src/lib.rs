//! Quire's Yjs client. One sync engine ([`session::Session`]) drives a `yrs` document over the
//! y-websocket protocol and tracks Quire's durable acknowledgements; two transports carry it:
//!
//! - native ([`Client`]): tokio + tokio-tungstenite, for tests, command-line tools and bots;
//! - `wasm32-unknown-unknown`: the browser's WebSocket, with a JavaScript API made with
//!   wasm-bindgen (`web.rs` and `web/`, one file per class; see README.md and
//!   `quire-client.d.ts`).
//!
//! Both reconnect with exponential backoff and jitter, keep edits made offline and merge them
//! on reconnect (the sync handshake sends whatever the server lacks), and report whether every
//! local change is committed on the server.

pub mod session;

#[cfg(not(target_arch = "wasm32"))]
mod native;
#[cfg(not(target_arch = "wasm32"))]
pub use native::{Client, ClientConfig, ClientState, Closed, TokenFuture, TokenProvider};
pub use session::Shared;

#[cfg(target_arch = "wasm32")]
mod web;

pub use session::{Event, Session, SessionError, REMOTE};
use std::time::Duration;

/// Connection status, as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Opening a connection (first time or after a drop).
    Connecting,
    /// Connected; see `synced` for whether the handshake finished.
    Connected,
    /// Not connected; edits are kept and sent on reconnect.
    Offline,
    /// Stopped for good: destroyed, or the server closed with a permanent code (4400-4499).
    Closed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Connecting => "connecting",
            Status::Connected => "connected",
            Status::Offline => "offline",
            Status::Closed => "closed",
        }
    }
}

/// The close code of a connection whose token expired: the client reconnects, asking its
/// token provider for a fresh token first (without one it reconnects with the same token and
/// the server refuses the upgrade with 401, which stops it).
pub const TOKEN_EXPIRED: u16 = 4401;

/// Close codes after which reconnecting unchanged would fail the same way (docs/protocol.md):
/// 4400-4499, except [`TOKEN_EXPIRED`].
pub fn is_permanent_close(code: u16) -> bool {
    (4400..4500).contains(&code) && code != TOKEN_EXPIRED
}

/// Delay before reconnect attempt `attempt` (0-based): exponential from `min` up to `max`, with
/// "equal jitter" (half fixed, half random) so clients dropped together do not return together.
/// `random` is a number in [0, 1).
pub fn backoff_delay(attempt: u32, min: Duration, max: Duration, random: f64) -> Duration {
    let exp = min
        .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .min(max);
    let half = exp / 2;
    half + half.mul_f64(random.clamp(0.0, 1.0))
}

/// The WebSocket address of `document` on the server at `server` (`ws://host:port`, with or
/// without a trailing slash), with the token in the query string if there is one.
pub fn document_url(server: &str, document: &str, token: Option<&str>) -> String {
    use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
    let mut url = format!(
        "{}/{}",
        server.trim_end_matches('/'),
        utf8_percent_encode(document, NON_ALPHANUMERIC)
    );
    if let Some(token) = token {
        url.push_str("?token=");
        url.extend(utf8_percent_encode(token, NON_ALPHANUMERIC));
    }
    url
}

/// Default reconnect delays: first retry within 100-200 ms, then doubling up to 5 s.
pub const MIN_BACKOFF: Duration = Duration::from_millis(200);
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How often the local awareness state is re-sent (peers drop states older than 30 s).
pub const AWARENESS_REFRESH: Duration = Duration::from_secs(15);
/// A connection from which nothing arrived for this long is reopened (a keep-alive whose echo
/// proves the connection goes out with every awareness refresh).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(45);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_the_cap_with_jitter_inside_bounds() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        assert_eq!(backoff_delay(0, min, max, 0.0), Duration::from_millis(50));
        assert_eq!(backoff_delay(0, min, max, 1.0), Duration::from_millis(100));
        assert_eq!(backoff_delay(3, min, max, 0.0), Duration::from_millis(400));
        assert_eq!(
            backoff_delay(10, min, max, 0.5),
            Duration::from_millis(1500)
        );
        assert_eq!(backoff_delay(u32::MAX, min, max, 1.0), max);
    }

    #[test]
    fn document_urls_are_percent_encoded() {
        assert_eq!(
            document_url("ws://h:1/", "notes/a b", Some("x.y+z")),
            "ws://h:1/notes%2Fa%20b?token=x%2Ey%2Bz"
        );
        assert_eq!(document_url("ws://h:1", "d", None), "ws://h:1/d");
    }

    #[test]
    fn only_4400_to_4499_are_permanent_except_an_expired_token() {
        assert!(is_permanent_close(4404));
        assert!(is_permanent_close(4403));
        assert!(!is_permanent_close(TOKEN_EXPIRED));
        assert!(!is_permanent_close(1012));
        assert!(!is_permanent_close(4500));
    }
}
