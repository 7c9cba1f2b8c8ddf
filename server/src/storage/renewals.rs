//! The lease renewals of one node, batched. Every room renews its lease every third of the
//! lease time, on a tick shared by the node's rooms (`room::actor::lease`); the renewals
//! that arrive together go to the database as one statement, so a node renews all its
//! leases with a statement or two per period instead of one per room.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{DocId, Epoch, SharedStatements, StorageError};

/// How long the batch waits for the renewals that arrive with its first one.
const GATHER: Duration = Duration::from_millis(5);

struct Renewal {
    doc: DocId,
    node: String,
    epoch: Epoch,
    ttl: Duration,
    reply: oneshot::Sender<Result<bool, StorageError>>,
}

/// A node's renewal queue, started with its first renewal (and again if its task ever ends).
#[derive(Default)]
pub(super) struct Renewals {
    tx: Mutex<Option<mpsc::UnboundedSender<Renewal>>>,
}

impl Renewals {
    /// Renews `node`'s lease on `doc` under `epoch` for `ttl`, in the next batch: true if it
    /// still held it. `statements` runs the batch (it is asked for only to start the queue).
    pub(super) async fn renew(
        &self,
        statements: impl FnOnce() -> Arc<dyn SharedStatements>,
        (doc, node, epoch, ttl): (DocId, &str, Epoch, Duration),
    ) -> Result<bool, StorageError> {
        let (reply, answer) = oneshot::channel();
        let renewal = Renewal {
            doc,
            node: node.to_owned(),
            epoch,
            ttl,
            reply,
        };
        {
            let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
            let renewal = match tx.as_ref() {
                Some(queue) => match queue.send(renewal) {
                    Ok(()) => None,
                    Err(mpsc::error::SendError(renewal)) => Some(renewal),
                },
                None => Some(renewal),
            };
            if let Some(renewal) = renewal {
                let (queue, rx) = mpsc::unbounded_channel();
                tokio::spawn(batches(statements(), rx));
                queue.send(renewal).map_err(|_| StorageError::Closed)?;
                *tx = Some(queue);
            }
        }
        answer.await.map_err(|_| StorageError::Closed)?
    }
}

/// Takes every renewal waiting (and those arriving within [`GATHER`]) and renews them with one
/// statement per node and lease time (one node and one lease time, in practice).
async fn batches(statements: Arc<dyn SharedStatements>, mut rx: mpsc::UnboundedReceiver<Renewal>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        let gathering = tokio::time::sleep(GATHER);
        tokio::pin!(gathering);
        loop {
            tokio::select! {
                more = rx.recv() => match more {
                    Some(renewal) => batch.push(renewal),
                    None => break,
                },
                _ = &mut gathering => break,
            }
        }
        while !batch.is_empty() {
            let (node, ttl) = (batch[0].node.clone(), batch[0].ttl);
            let (these, rest): (Vec<_>, Vec<_>) = batch
                .into_iter()
                .partition(|r| r.node == node && r.ttl == ttl);
            batch = rest;
            let leases: Vec<(DocId, Epoch)> = these.iter().map(|r| (r.doc, r.epoch)).collect();
            match statements.renew_leases(&node, ttl, &leases).await {
                Ok(renewed) => {
                    let renewed: HashSet<(DocId, Epoch)> = renewed.into_iter().collect();
                    for r in these {
                        let _ = r.reply.send(Ok(renewed.contains(&(r.doc, r.epoch))));
                    }
                }
                Err(e) => {
                    // (`StorageError` is not `Clone`: each room gets the text.)
                    let text = e.to_string();
                    for r in these {
                        let err = StorageError::Database(sqlx::Error::Protocol(text.clone()));
                        let _ = r.reply.send(Err(err));
                    }
                }
            }
        }
    }
}
