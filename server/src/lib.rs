//! Quire: a durable Yjs sync server speaking the y-websocket and Hocuspocus protocols.
//!
//! Map of the crate, from the ground up (a module imports only modules listed above it,
//! docs/architecture.md draws it):
//! - [`config`]: every setting, declared once with its default; a leaf.
//! - [`close`], [`metrics`], [`telemetry`]: close codes, counters, logs.
//! - [`protocol`]: the wire protocols as pure functions over bytes (`quire-protocol`).
//! - [`storage`]: the [`storage::DocStore`] trait (append-only log, snapshots with an
//!   optimistic version check, leases with fencing tokens), the API rows, and the SQLite and
//!   PostgreSQL implementations.
//! - [`auth`], [`limits`], [`gate`]: tokens and permissions, per-client rates, the
//!   admission gate of whole-document work.
//! - [`room`]: one task per loaded document, the only writer of its `Doc` and log; the
//!   [`room::Registry`] that starts rooms on demand.
//! - [`history`]: content at a position or version, diffs and their authors.
//! - [`bus`]: signed envelopes between nodes over NATS; document owners, replay guard.
//! - [`changes`], [`revocation`], [`webhooks`], [`admin`]: what follows a document
//!   change or a revocation to every node, the outbox's delivery, the dashboard's figures.
//! - [`app`]: the shared state every handler and connection reaches ([`app::AppState`]).
//! - [`problem`]: errors as HTTP problem+json, shared by the API and the socket checks.
//! - [`socket`]: every client WebSocket (y-websocket, Hocuspocus, relayed), from the checks
//!   before the upgrade to the close.
//! - [`http`]: the router: the REST API, the pages, health and metrics; routes upgrades to
//!   [`socket`].
//! - [`entry_points`]: the table of every entry point with its permission, cost and bound.
//! - [`startup`]: opening the stores, the background jobs, the bus, graceful shutdown;
//!   [`run`] serves on a listener until a shutdown token fires (tests start it on port 0).
//! - `fuzzing` (feature `fuzzing`): harnesses for the fuzz crate.

/// The wire protocol (the `quire-protocol` crate, shared with the client and the benchmark).
pub use quire_protocol as protocol;
pub use quire_protocol::counts;

pub mod admin;
pub mod app;
pub mod auth;
pub mod bus;
pub mod changes;
pub mod close;
pub mod config;
pub mod entry_points;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod gate;
pub mod history;
pub mod http;
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
