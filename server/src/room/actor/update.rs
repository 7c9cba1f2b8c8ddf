//! An update on its way through the room: where it came from ([`Origin`]), received and not
//! yet applied ([`Queued`]), applied and being committed ([`Applied`], [`AppliedBatch`],
//! with what it changed: [`Changes`]), and what waits for a commit ([`Waiter`]). The
//! pipeline (`pipeline.rs`) moves updates from arrival to applied, the commit (`commit.rs`)
//! from applied to the log.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::Instant;
use yrs::{StateVector, Update};

use crate::edits::{EditError, Edits, Outcome};
use crate::room::{ApplyError, PeerId};

/// Where an update came from: a connection, or an HTTP request waiting for its commit.
pub(super) enum Origin {
    Peer(PeerId),
    Http(tokio::sync::oneshot::Sender<Result<i64, ApplyError>>),
    /// One of an HTTP request's updates applied together (`ApplyCmd::then`), other than its
    /// last, which carries the reply.
    Part,
}

impl Origin {
    pub(super) fn peer(&self) -> Option<PeerId> {
        match self {
            Origin::Peer(p) => Some(*p),
            Origin::Http(_) | Origin::Part => None,
        }
    }
}

/// An update received and not yet applied.
pub(super) struct Queued {
    pub(super) idx: u64,
    pub(super) origin: Origin,
    pub(super) raw: Bytes,
    pub(super) update: Option<Update>,
    /// Who sent it, for the history.
    pub(super) author: Option<Arc<str>>,
    /// When it was first held back for missing dependencies, if it was (`held.rs`).
    pub(super) held_since: Option<Instant>,
    /// It follows the previous update as part of the same request's updates applied together
    /// (`ApplyCmd::then`): never committed in another append than that one.
    pub(super) joined: bool,
    /// A JSON edit to make when its turn comes (`raw` is empty until then): `edits.rs`.
    pub(super) edit: Option<Box<EditWork>>,
}

/// An update applied to the `Doc` and being committed.
pub(super) struct Applied {
    pub(super) idx: u64,
    pub(super) origin: Origin,
    pub(super) raw: Bytes,
    pub(super) author: Option<Arc<str>>,
    /// What applying it changed, for the history.
    pub(super) changes: Changes,
    /// As [`Queued::joined`].
    pub(super) joined: bool,
}

/// What one update changed in the `Doc`: content units inserted and deleted, and the client
/// ids it introduced (whose first item it carries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    pub inserted: i64,
    pub deleted: i64,
    pub clients: Vec<u64>,
}

impl Changes {
    /// From a transaction that applied one update.
    pub(crate) fn of(txn: &yrs::TransactionMut) -> Changes {
        let units = |set: &yrs::IdSet| -> i64 {
            set.iter()
                .flat_map(|(_, ranges)| ranges.into_iter().map(|r| i64::from(r.end - r.start)))
                .sum()
        };
        let clients = txn
            .insert_set()
            .iter()
            .filter(|(_, ranges)| ranges.iter().any(|r| r.start == 0))
            .map(|(client, _)| client.get())
            .collect();
        Changes {
            inserted: units(txn.insert_set()),
            deleted: units(txn.delete_set()),
            clients,
        }
    }
}

/// Updates applied to the `Doc` together, to be committed in one append; held in
/// `Pipeline::staged` when applied while the previous batch commits.
pub(super) struct AppliedBatch {
    pub(super) batch: Vec<Applied>,
    pub(super) upto_idx: u64,
    /// The state vector before the batch was applied.
    pub(super) committed_sv: StateVector,
}

/// Something waiting for `committed_idx` to reach `idx`.
pub(super) enum Waiter {
    /// Echo a durable-ack request to a peer.
    Ack(PeerId, Bytes),
    /// Answer an HTTP update that changed nothing: it may duplicate an update not yet
    /// committed, so the caller hears back only once everything before it is.
    Http(tokio::sync::oneshot::Sender<Result<i64, ApplyError>>),
}

/// An edit waiting in the queue for its turn.
pub(super) struct EditWork {
    pub(super) edits: Arc<Edits>,
    pub(super) client: u64,
    pub(super) made: oneshot::Sender<Result<Outcome, EditError>>,
}
