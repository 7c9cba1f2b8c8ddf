//! WebSocket close codes Quire sends, and what a client should do about each.
//!
//! Transient codes (reconnect with backoff, the document resyncs): [`GOING_AWAY`],
//! [`INTERNAL`], [`RESTART`], [`TRY_AGAIN_LATER`], [`POLICY`] (after a longer backoff).
//! [`TOKEN_EXPIRED`]: reconnect with a fresh token. Permanent codes, in the 4400-4499 band
//! (reconnecting unchanged will fail the same way): [`DOC_TOO_LARGE`], [`FORBIDDEN`],
//! [`DELETED`]. Protocol violations by the client: [`UNSUPPORTED_DATA`], [`MALFORMED`],
//! [`MESSAGE_TOO_BIG`].

/// Server shutting down, or the connection was idle longer than the idle timeout.
pub const GOING_AWAY: u16 = 1001;
/// A text frame: the protocol is binary only.
pub const UNSUPPORTED_DATA: u16 = 1003;
/// The connection sent requests (Sync Step 1, QueryAwareness, awareness updates) faster than
/// its rate limit allows. Reconnect after a backoff.
pub const POLICY: u16 = 1008;
/// A frame that does not decode as y-websocket messages, or an update yrs rejects.
pub const MALFORMED: u16 = 1007;
/// A frame larger than `max_message_size`.
pub const MESSAGE_TOO_BIG: u16 = 1009;
/// The document could not be loaded or committed; retry later.
pub const INTERNAL: u16 = 1011;
/// The server is restarting.
pub const RESTART: u16 = 1012;
/// Backpressure: this connection's outbound queue overflowed, or the document has too many
/// connections, or updates it sent waited too long (or too much) for content that never
/// arrived (`held_update_timeout`, `held_update_bytes`). Reconnect (with backoff) and resync.
pub const TRY_AGAIN_LATER: u16 = 1013;
/// The update would make the document larger than `max_doc_size`.
pub const DOC_TOO_LARGE: u16 = 4413;
/// The token was revoked, or the user's access to the document changed: reconnect with a
/// valid token (the new permissions apply).
pub const FORBIDDEN: u16 = 4403;
/// The connection's token expired: reconnect with a fresh token (the only code in the
/// 4400-4499 band a client retries).
pub const TOKEN_EXPIRED: u16 = 4401;
/// The document was deleted; it cannot be opened until it is restored.
pub const DELETED: u16 = 4404;
