//! One typing client of one document, whatever socket it is on: its own yrs document, its
//! sends (stamped in its room's send times), the durable acks it waits for and the deliveries
//! it measures. `run_client` drives one over a socket of its own; `multiplex` drives several
//! over one Hocuspocus socket.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use quire_protocol as protocol;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::{Doc, ReadTxn, StateVector, Text, Transact};

use crate::wire::{self, Incoming};
use crate::{ClientPlan, Measured, SendTimes, Shared};

/// The sending half of a client's socket.
pub(crate) type Sink = futures_util::stream::SplitSink<wire::Ws, WsMessage>;

/// One client of one document.
pub(crate) struct Typist {
    pub(crate) plan: ClientPlan,
    doc: Doc,
    text: yrs::TextRef,
    times: Arc<SendTimes>,
    measured: Measured,
    pending_acks: HashMap<u64, Instant>,
    ack_seq: u64,
    /// Updates sent so far: the start clock of the next insert.
    n: u32,
}

impl Typist {
    pub(crate) fn new(plan: ClientPlan, times: Arc<SendTimes>, shared: Arc<Shared>) -> Typist {
        let doc = Doc::with_client_id(plan.client_id);
        let text = doc.get_or_insert_text("text");
        Typist {
            plan,
            doc,
            text,
            times,
            measured: Measured::new(shared),
            pending_acks: HashMap::new(),
            ack_seq: 0,
            n: 0,
        }
    }

    /// The timer of its sends, from now: every period, from a phase its index spreads over
    /// one period.
    pub(crate) fn timer(&self) -> tokio::time::Interval {
        let period = Duration::from_secs_f64(1.0 / self.plan.rate);
        // Spread the clients' phases over one period.
        let phase = period.mul_f64((self.plan.index as f64 * 0.618_034) % 1.0);
        let mut tick = tokio::time::interval_at((Instant::now() + phase).into(), period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick
    }

    /// Types a character and sends the update, at `now` (then a durable-ack request, --ack).
    pub(crate) async fn send_update(
        &mut self,
        sink: &mut Sink,
        now: Instant,
    ) -> anyhow::Result<()> {
        let update = {
            let mut txn = self.doc.transact_mut();
            self.text.insert(&mut txn, 0, "x");
            txn.encode_update_v1()
        };
        let plan = &self.plan;
        // Keyed by the insert's start clock, which receivers read back from the update.
        self.times
            .write()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert((plan.client_id, self.n), now);
        self.n += 1;
        let frame = wire::wrap(plan.flavor, &plan.doc, protocol::encode_update(&update));
        sink.send(WsMessage::Binary(frame)).await?;
        let shared = &self.measured.shared;
        if shared.measuring(now) {
            shared.sent.fetch_add(1, Ordering::Relaxed);
        }
        if plan.ack {
            self.ack_seq += 1;
            self.pending_acks.insert(self.ack_seq, now);
            let ack = protocol::encode_durable_ack(self.ack_seq);
            let frame = wire::wrap(plan.flavor, &plan.doc, ack);
            sink.send(WsMessage::Binary(frame)).await?;
        }
        Ok(())
    }

    /// Handles one message for its document, received at `now`.
    pub(crate) async fn receive(
        &mut self,
        msg: Incoming,
        sink: &mut Sink,
        now: Instant,
    ) -> anyhow::Result<()> {
        match msg {
            Incoming::Step1 => {
                // Answer with what we have (only our own edits).
                let diff = self.doc.transact().encode_diff_v1(&StateVector::default());
                let step2 = protocol::encode_step2(&diff);
                let frame = wire::wrap(self.plan.flavor, &self.plan.doc, step2);
                sink.send(WsMessage::Binary(frame)).await?;
            }
            Incoming::Update(u) | Incoming::Step2(u) => record_delivery(
                &u,
                self.plan.client_id,
                &self.times,
                &mut self.measured,
                now,
            ),
            Incoming::Ack(raw) => {
                let seq = protocol::read_durable_ack(&raw).unwrap_or(0);
                if let Some(sent) = self.pending_acks.remove(&seq) {
                    let shared = &self.measured.shared;
                    if shared.measuring(sent) {
                        shared.acks.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut h) = shared.ack_latency.lock() {
                            let _ = h.record(now.duration_since(sent).as_micros().max(1) as u64);
                        }
                    }
                }
            }
            Incoming::Other => {}
        }
        Ok(())
    }
}

/// The data of a frame a client read: `None` for a frame without (a Ping); an error when the
/// server closed the socket or it failed.
pub(crate) fn frame_data(
    frame: Option<Result<WsMessage, tokio_tungstenite::tungstenite::Error>>,
) -> anyhow::Result<Option<Bytes>> {
    let Some(frame) = frame else {
        anyhow::bail!("server closed the connection")
    };
    match frame? {
        WsMessage::Binary(b) => Ok(Some(b)),
        WsMessage::Close(f) => anyhow::bail!("closed by server: {f:?}"),
        _ => Ok(None),
    }
}

/// Records the latency of every send in `update` made by another client. Servers that echo
/// updates to their sender (the reference server does) are not credited for the echo.
fn record_delivery(
    update: &[u8],
    me: u64,
    times: &SendTimes,
    measured: &mut Measured,
    now: Instant,
) {
    let ids = wire::update_ids(update);
    let Ok(map) = times.read() else { return };
    for key in ids {
        if key.0 == me {
            continue;
        }
        if let Some(sent) = map.get(&key).copied() {
            if measured.shared.measuring(sent) {
                measured.record(now.duration_since(sent));
            }
        }
    }
}
