//! What a node publishes, batched: one task per destination (another node's subject, or
//! every node's) takes the envelopes sent to it in order and publishes all those waiting as
//! one signed message, so a burst of frames between two nodes costs one signature, one NATS
//! message and one wake-up on the receiving node instead of one each. Nothing waits for a
//! batch to fill: a link publishes as soon as it has looked once more for envelopes queued
//! meanwhile, so a lone frame leaves at once and batches grow only under load.
//!
//! A message that cannot be published takes its envelopes' connections down with it (see
//! [`Bus::undelivered`]): a relayed connection never goes on past a frame that was not sent.

use std::sync::{Arc, Weak};

use tokio::sync::mpsc;

use super::{lock, Bus, Envelope, Faults};
use crate::bus::BatchWriter;
use crate::metrics::Metrics;

/// Envelopes waiting for a link's task; a sender waits while it is full.
pub const LINK_QUEUE: usize = 4096;

/// Most bytes of envelopes in one message (less if the NATS server's `max_payload` is
/// smaller). One envelope larger than this travels alone.
pub const BATCH_BYTES: usize = 256 * 1024;

/// The sending end of a link.
pub(super) type LinkTx = mpsc::Sender<Envelope>;

/// Starts the task of the link to `subject` (for node `node`, or `None` for every node).
pub(super) fn start(bus: &Bus, subject: String, node: Option<String>) -> LinkTx {
    let (tx, rx) = mpsc::channel(LINK_QUEUE);
    let limit = BATCH_BYTES.min(bus.client.max_payload().saturating_sub(64).max(1));
    let task = Link {
        bus: bus.me.clone(),
        metrics: bus.metrics.clone(),
        faults: bus.faults.clone(),
        client: bus.client.clone(),
        key: bus.key.clone(),
        subject,
        node,
        limit,
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
    limit: usize,
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
                None => match rx.recv().await {
                    Some(env) => env,
                    None => return,
                },
            };
            // The tasks already woken (a room's other recipients, other clients' frames)
            // add theirs before the message closes.
            match self
                .faults
                .as_ref()
                .and_then(|f| lock(&f.link_pause).take())
            {
                Some(pause) => tokio::time::sleep(pause).await,
                None => tokio::task::yield_now().await,
            }
            let mut writer = BatchWriter::with_capacity(4096);
            writer.push(&first, self.limit);
            batch.push(first);
            while let Ok(env) = rx.try_recv() {
                if !writer.push(&env, self.limit) {
                    carried = Some(env);
                    break;
                }
                batch.push(env);
            }
            self.metrics.bus_messages.inc();
            self.metrics.bus_envelopes.inc_by(writer.count() as u64);
            let payload = writer.seal(&self.key, &self.subject);
            let published = self.client.publish(subject.clone(), payload).await;
            if let Err(e) = published {
                tracing::debug!(error = %e, subject = %self.subject, "bus publish failed");
                if let Some(bus) = self.bus.upgrade() {
                    for env in &batch {
                        bus.undelivered(self.node.as_deref(), env);
                    }
                }
            }
            batch.clear();
        }
    }
}
