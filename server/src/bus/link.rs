//! What a node publishes, batched: one task per destination (another node's subject, or
//! every node's) takes the envelopes sent to it in order and publishes all those waiting as
//! one signed message, so a burst of frames between two nodes costs one signature, one NATS
//! message and one wake-up on the receiving node instead of one each. Nothing waits for a
//! batch to fill: a link publishes as soon as it has looked once more for envelopes queued
//! meanwhile, so a lone frame leaves at once and batches grow only under load.
//!
//! A message that cannot be published takes its envelopes' connections down with it (see
//! [`Bus::undelivered`]): a relayed connection never goes on past a frame that was not sent.
//! A link idle for [`LINK_IDLE`] closes its queue, publishes what is still in it and ends
//! (a restarted node comes back under a new id; its old link must not stay forever); the
//! next envelope for that node starts a new one.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{lock, subject, Bus, Envelope, FaultAction, Faults, RemoteIn, ALL};
use crate::bus::BatchWriter;
use crate::metrics::Metrics;

/// Envelopes waiting for a link's task; a sender waits while it is full.
pub const LINK_QUEUE: usize = 4096;

/// Most bytes of envelopes in one message (less if the NATS server's `max_payload` is
/// smaller). One envelope larger than this travels alone.
pub const BATCH_BYTES: usize = 256 * 1024;

/// A link with nothing to send for this long ends.
pub const LINK_IDLE: Duration = Duration::from_secs(60);

/// The sending end of a link.
pub(super) type LinkTx = mpsc::Sender<Envelope>;

/// Starts the task of the link to `subject` (for node `node`, or `None` for every node).
pub(super) fn start(bus: &Bus, subject: String, node: Option<String>) -> LinkTx {
    let (tx, rx) = mpsc::channel(LINK_QUEUE);
    let task = Link {
        bus: bus.me.clone(),
        metrics: bus.metrics.clone(),
        faults: bus.faults.clone(),
        client: bus.client.clone(),
        key: bus.key.clone(),
        subject,
        node,
    };
    tokio::spawn(task.run(rx));
    tx
}

struct Link {
    /// The bus, to close what an unpublished message carried (the task ends with its queue,
    /// so it holds no strong reference).
    bus: Weak<Bus>,
    metrics: Arc<Metrics>,
    faults: Option<Arc<Faults>>,
    client: async_nats::Client,
    key: super::ClusterKey,
    subject: String,
    node: Option<String>,
}

impl Link {
    async fn run(self, mut rx: mpsc::Receiver<Envelope>) {
        let subject = async_nats::Subject::from(self.subject.as_str());
        // An envelope that did not fit in the previous message.
        let mut carried: Option<Envelope> = None;
        let mut batch: Vec<Envelope> = Vec::new();
        loop {
            let first = match carried.take() {
                Some(env) => env,
                None => match tokio::time::timeout(LINK_IDLE, rx.recv()).await {
                    Ok(Some(env)) => env,
                    Ok(None) => return,
                    Err(_idle) => {
                        // Senders now get an error and start a new link; what they queued
                        // before is still published here.
                        rx.close();
                        continue;
                    }
                },
            };
            self.hold().await;
            // The server's limit as the client knows it now (it may have reconnected to
            // another server).
            let limit = BATCH_BYTES.min(self.client.max_payload().saturating_sub(64).max(1));
            let mut writer = BatchWriter::with_capacity(4096);
            writer.push(&first, limit);
            batch.push(first);
            while let Ok(env) = rx.try_recv() {
                if !writer.push(&env, limit) {
                    carried = Some(env);
                    break;
                }
                batch.push(env);
            }
            let count = writer.count() as u64;
            let payload = writer.seal(&self.key, &self.subject);
            match self.client.publish(subject.clone(), payload).await {
                Ok(()) => {
                    self.metrics.bus_messages.inc();
                    self.metrics.bus_envelopes.inc_by(count);
                }
                Err(e) => {
                    tracing::debug!(error = %e, subject = %self.subject, "bus publish failed");
                    if let Some(bus) = self.bus.upgrade() {
                        for env in &batch {
                            bus.undelivered(self.node.as_deref(), env);
                        }
                    }
                }
            }
            batch.clear();
        }
    }

    /// Before a message closes: the tasks already woken (a room's other recipients, other
    /// clients' frames) add theirs. In tests, a held link waits until it is let go.
    async fn hold(&self) {
        let gate = self
            .faults
            .as_ref()
            .and_then(|f| lock(&f.link_gate).clone());
        match gate {
            Some(gate) => {
                // Released by closing the semaphore (`Faults::release_links`).
                let _ = gate.acquire().await;
            }
            None => tokio::task::yield_now().await,
        }
    }
}

impl Bus {
    /// Queues `env` for `node` (every node: `None`), through the planned faults in tests.
    pub(super) async fn publish(&self, node: Option<&str>, env: Envelope) -> Result<(), ()> {
        let Some(faults) = &self.faults else {
            return self.enqueue(node, env).await;
        };
        let held = lock(&faults.held).take();
        let result = match faults.take(env.kind()) {
            None => self.enqueue(node, env).await,
            Some(FaultAction::Drop) => Ok(()),
            Some(FaultAction::Duplicate) => {
                let first = self.enqueue(node, env.clone()).await;
                first.and(self.enqueue(node, env).await)
            }
            Some(FaultAction::Delay(after)) => {
                let (me, node) = (self.me.clone(), node.map(str::to_owned));
                tokio::spawn(async move {
                    tokio::time::sleep(after).await;
                    if let Some(bus) = me.upgrade() {
                        let _ = bus.enqueue(node.as_deref(), env).await;
                    }
                });
                Ok(())
            }
            Some(FaultAction::Reorder) => {
                *lock(&faults.held) = Some((node.map(str::to_owned), env));
                Ok(())
            }
        };
        if let Some((node, env)) = held {
            let _ = self.enqueue(node.as_deref(), env).await;
        }
        result
    }

    /// Hands `env` to the link to `node` (every node: `None`), starting it on first use.
    async fn enqueue(&self, node: Option<&str>, env: Envelope) -> Result<(), ()> {
        let mut env = env;
        // A link that ended (idle) is replaced once.
        for _ in 0..2 {
            let tx = self.link(node);
            match tx.send(env).await {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => env = back,
            }
        }
        Err(())
    }

    /// The link to `node` (every node: `None`); a new one if there is none or it has ended.
    fn link(&self, node: Option<&str>) -> LinkTx {
        let start = |node: Option<&str>| {
            let subject = node.map_or_else(|| ALL.to_owned(), subject);
            start(self, subject, node.map(str::to_owned))
        };
        match node {
            Some(node) => {
                let mut links = lock(&self.links);
                match links.get(node) {
                    Some(tx) if !tx.is_closed() => tx.clone(),
                    _ => {
                        // (Links that ended, to nodes no longer heard from, go too.)
                        links.retain(|_, tx| !tx.is_closed());
                        let tx = start(Some(node));
                        links.insert(node.to_owned(), tx.clone());
                        tx
                    }
                }
            }
            None => {
                let mut everyone = lock(&self.everyone);
                match everyone.as_ref() {
                    Some(tx) if !tx.is_closed() => tx.clone(),
                    _ => everyone.insert(start(None)).clone(),
                }
            }
        }
    }

    /// `env`, sent to `node` (every node: `None`), was in a message NATS did not take: the
    /// connection it belongs to is closed (its client reconnects and resyncs), a forwarded
    /// request stops waiting for its response.
    pub(super) fn undelivered(&self, node: Option<&str>, env: &Envelope) {
        self.metrics.bus_publish_failures.inc();
        match env {
            Envelope::Open { conn, .. }
            | Envelope::Frame { conn, .. }
            | Envelope::Alive { conn, .. }
            | Envelope::Reauth { conn, .. } => {
                if let Some(relay) = lock(&self.relays).remove(conn) {
                    relay.tx.kill(super::lost_link());
                }
            }
            Envelope::Out { conn, .. } | Envelope::Beat { conn, .. } => {
                // The remote peer leaves its room and tells the relaying node (1012).
                let from = node.unwrap_or_default();
                if let Some(remote) = lock(&self.remotes).remove(from, *conn) {
                    let _ = remote.tx.send(RemoteIn::Gap);
                }
            }
            Envelope::Request { id, .. } => {
                lock(&self.pending).remove(id);
            }
            Envelope::Close { .. }
            | Envelope::Kill { .. }
            | Envelope::Changed { .. }
            | Envelope::Response { .. } => {}
        }
    }
}
