//! Quire: a durable Yjs sync server speaking the y-websocket and Hocuspocus protocols.
//!
//! Map of the crate, from the ground up: each module imports only modules listed above it
//! (`tests/architecture.rs` holds the code to this list; docs/architecture.md draws it).
//! - [`config`]: every setting, declared once with its default; a leaf.
//! - [`close`], [`metrics`]: close codes, counters; leaves too.
//! - [`entry_points`]: the table of every entry point with its permission, cost and bound.
//! - [`protocol`]: the wire protocols as pure functions over bytes (`quire-protocol`).
//! - [`integrity`]: whether an update integrates completely into a document, as Yjs would
//!   integrate it (no I/O); every write path checks it.
//! - [`telemetry`]: the log output, its format and filter.
//! - [`storage`]: the [`storage::DocStore`] trait (append-only log, snapshots with an
//!   optimistic version check, leases with fencing tokens), the API rows, and the SQLite and
//!   PostgreSQL implementations.
//! - [`gate`]: the admission gate of whole-document work.
//! - [`auth`]: tokens, permissions, revocations.
//! - [`history`]: content at a position or version, diffs and their authors (no I/O).
//! - [`branches`]: a branch's log as changes, their dependencies, diffs and merges (no I/O).
//! - [`edits`]: JSON edit operations, parsed, checked whole and made on a document in one
//!   transaction, giving the Yjs update (no I/O).
//! - [`webhooks`]: the outbox's delivery.
//! - [`room`]: one task per loaded document, the only writer of its `Doc` and log; the
//!   [`room::Registry`] that starts rooms on demand.
//! - [`limits`]: per-client and per-address rates.
//! - [`admin`]: the dashboard's figures.
//! - [`bus`]: signed envelopes between nodes over NATS; document owners, replay guard.
//! - [`app`]: the shared state every handler and connection reaches ([`app::AppState`]).
//! - [`problem`]: errors as HTTP problem+json, shared by the API and the socket checks.
//! - [`changes`], [`revocation`]: what follows a document change or a revocation to every
//!   node's sockets.
//! - [`socket`]: every client WebSocket (y-websocket, Hocuspocus, relayed), from the checks
//!   before the upgrade to the close.
//! - [`http`]: the router: the REST API, the pages, health and metrics; routes upgrades to
//!   [`socket`].
//! - [`startup`]: opening the stores, the background jobs, the bus, graceful shutdown;
//!   [`run`] serves on a listener until a shutdown token fires (tests start it on port 0).
//! - `fuzzing` (feature `fuzzing`): harnesses for the fuzz crate.

/// The wire protocol (the `quire-protocol` crate, shared with the client and the benchmark).
pub use quire_protocol as protocol;
pub use quire_protocol::counts;

pub mod admin;
pub mod app;
pub mod auth;
pub mod branches;
pub mod bus;
pub mod changes;
pub mod close;
pub mod config;
pub mod edits;
pub mod entry_points;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod history;
pub mod http;
pub mod integrity;
pub mod limits;
pub mod metrics;
pub mod problem;
pub mod revocation;
pub mod room;
pub mod socket;
pub mod startup;
pub mod storage;
pub mod telemetry;
pub mod webhooks;

pub use app::{App, AppState};
pub use startup::{check_config, open_stores, run, run_with_hooks, run_with_stores, Stores};
