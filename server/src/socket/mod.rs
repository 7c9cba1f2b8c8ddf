//! The socket wing: every client WebSocket, from the checks before its upgrade to its close.
//! `http` routes upgrades here and nothing here imports `http`.
//!
//! - [`admit`]: the checks made before an upgrade, for both protocols (per-address limits,
//!   where the credential is, the permission on a document).
//! - [`upgrade`]: the RFC 6455 upgrade itself, yielding tokio-tungstenite's stream.
//! - [`transport`]: what both protocols share on the wire (fragmented sends, the close
//!   handshake, last-heard time, socket settings).
//! - [`joining`]: what both protocols do to put a connection on a document (the room's
//!   join, or the relay to the node that owns it).
//! - [`ws`]: one y-websocket connection, between a socket and a room.
//! - [`hocuspocus`]: the Hocuspocus endpoint, many documents on one socket.
//! - [`relay`]: a client of a document another node owns, both ends over the bus.

pub mod admit;
pub mod hocuspocus;
pub mod joining;
pub mod relay;
pub mod transport;
pub mod upgrade;
pub mod ws;
