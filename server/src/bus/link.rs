//! What a node publishes, batched: one task per destination (another node's subject, or
//! every node's) takes the envelopes sent to it in order and publishes all those waiting as
//! one signed message, so a burst of frames between two nodes costs one signature, one NATS
//! message and one wake-up on the receiving node instead of one each.
//!
//! Without a tick (the default) a link publishes as soon as it has looked once for envelopes
//! queued meanwhile, so a lone frame leaves at once and batches grow only under load. With
//! one ([`super::BusConfig::tick`]) a link publishes at most one message per tick: an
//! envelope that comes after a quiet tick leaves at once; one that comes less than a tick
//! after the link's last message waits for that tick to end, and whatever else comes
//! meanwhile leaves with it. A busy pair of nodes then exchanges one message per tick rather
//! than one per frame, and a frame waits up to a tick (a full message leaves at once). Fewer
//! messages cost the NATS server less, the relayed clients' latency more (docs/cluster.md).
//!
//! A message that cannot be published takes its envelopes' connections down with it (see
//! [`Bus::undelivered`]): a relayed connection never goes on past a frame that was not sent.
//! A link idle for [`LINK_IDLE`] closes its queue, publishes what is still in it and ends
//! (a restarted node comes back under a new id; its old link must not stay forever); the
//! next envelope for that node starts a new one.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

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
        tick: bus.tick,
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
    tick: Duration,
    subject: String,
    node: Option<String>,
}

impl Link {
    async fn run(self, mut rx: mpsc::Receiver<Envelope>) {
        let subject = async_nats::Subject::from(self.subject.as_str());
        // An envelope that did not fit in the previous message.
        let mut carried: Option<Envelope> = None;
        let mut batch: Vec<Envelope> = Vec::new();
        // When the last message left: the next one leaves no sooner than a tick later.
        let mut last: Option<Instant> = None;
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
            let until = tick_end(last, self.tick, Instant::now());
            carried = gather(&mut rx, (&mut writer, &mut batch), limit, until).await;
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
            last = Some(Instant::now());
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

/// When a message whose link last published at `last` may leave: `None` at once (no message
/// in the last `tick`), or the end of the tick that message began.
fn tick_end(last: Option<Instant>, tick: Duration, now: Instant) -> Option<Instant> {
    // (A tick too long to add leaves at once rather than failing the link.)
    last.and_then(|at| at.checked_add(tick))
        .filter(|end| *end > now)
}

/// Adds to the message being written what is queued now and, with `until`, what comes
/// before then; stops early when the message is full. The envelope that did not fit, if any.
async fn gather(
    rx: &mut mpsc::Receiver<Envelope>,
    (writer, batch): (&mut BatchWriter, &mut Vec<Envelope>),
    limit: usize,
    until: Option<Instant>,
) -> Option<Envelope> {
    loop {
        let env = match rx.try_recv() {
            Ok(env) => env,
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
            Err(mpsc::error::TryRecvError::Empty) => {
                let until = until?;
                match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(env)) => env,
                    Ok(None) | Err(_) => return None,
                }
            }
        };
        if !writer.push(&env, limit) {
            return Some(env);
        }
        batch.push(env);
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
            Envelope::Request(request) => {
                lock(&self.pending).remove(&request.id);
            }
            Envelope::Close { .. }
            | Envelope::Kill { .. }
            | Envelope::Changed { .. }
            | Envelope::Response(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn frame(seq: u64, len: usize) -> Envelope {
        Envelope::Frame {
            from: "n".into(),
            conn: 1,
            seq,
            data: Bytes::from(vec![0u8; len]),
        }
    }

    fn seqs(batch: &[Envelope]) -> Vec<u64> {
        batch
            .iter()
            .map(|env| match env {
                Envelope::Frame { seq, .. } => *seq,
                _ => 0,
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_after_a_quiet_tick_leaves_at_once_and_a_sooner_one_waits_for_its_end() {
        let tick = Duration::from_millis(2);
        let now = Instant::now();
        assert_eq!(tick_end(None, tick, now), None, "the link's first message");
        let quiet = now - Duration::from_millis(3);
        assert_eq!(tick_end(Some(quiet), tick, now), None, "a tick passed");
        let recent = now - Duration::from_millis(1);
        assert_eq!(
            tick_end(Some(recent), tick, now),
            Some(now + Duration::from_millis(1)),
            "the rest of the tick the last message began"
        );
        assert_eq!(tick_end(Some(recent), Duration::ZERO, now), None, "no tick");
        assert_eq!(
            tick_end(Some(recent), Duration::MAX, now),
            None,
            "no overflow"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_takes_what_comes_before_its_tick_ends_and_nothing_after() {
        let (tx, mut rx) = mpsc::channel(16);
        let start = Instant::now();
        tx.send(frame(2, 10)).await.ok();
        let late = tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1)).await;
            late.send(frame(3, 10)).await.ok();
            tokio::time::sleep(Duration::from_millis(4)).await;
            late.send(frame(4, 10)).await.ok();
        });
        let (mut writer, mut batch) = (BatchWriter::with_capacity(64), vec![frame(1, 10)]);
        writer.push(&batch[0], BATCH_BYTES);
        let until = Some(start + Duration::from_millis(2));
        let carried = gather(&mut rx, (&mut writer, &mut batch), BATCH_BYTES, until).await;
        assert!(carried.is_none());
        assert_eq!(seqs(&batch), [1, 2, 3], "what came within the tick");
        assert_eq!(writer.count(), 3);
        assert_eq!(
            Instant::now(),
            start + Duration::from_millis(2),
            "left at its end"
        );
        // What came after the tick's end waits for the next message.
        let next = rx.recv().await.map(|env| seqs(&[env]));
        assert_eq!(next, Some(vec![4]));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_tick_or_with_a_full_message_nothing_waits() {
        let (tx, mut rx) = mpsc::channel(16);
        let start = Instant::now();
        for seq in 2..=3 {
            tx.send(frame(seq, 100)).await.ok();
        }
        let (mut writer, mut batch) = (BatchWriter::with_capacity(64), vec![frame(1, 100)]);
        writer.push(&batch[0], BATCH_BYTES);
        let carried = gather(&mut rx, (&mut writer, &mut batch), BATCH_BYTES, None).await;
        assert!(carried.is_none());
        assert_eq!(seqs(&batch), [1, 2, 3], "everything queued, nothing more");
        assert_eq!(Instant::now(), start);

        // A message that is full leaves at once, even within a tick; the envelope that did
        // not fit starts the next one.
        for seq in 5..=6 {
            tx.send(frame(seq, 100)).await.ok();
        }
        let (mut writer, mut batch) = (BatchWriter::with_capacity(64), vec![frame(4, 100)]);
        // (Two 100-byte frames and their heads fit, three do not.)
        let limit = 300;
        writer.push(&batch[0], limit);
        let until = Some(start + Duration::from_secs(1));
        let carried = gather(&mut rx, (&mut writer, &mut batch), limit, until).await;
        assert_eq!(seqs(&batch), [4, 5]);
        assert_eq!(carried.map(|env| seqs(&[env])), Some(vec![6]));
        assert_eq!(
            Instant::now(),
            start,
            "a full message does not wait for the tick"
        );
    }
}
