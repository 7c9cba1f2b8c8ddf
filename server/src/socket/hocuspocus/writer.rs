//! The write side of a Hocuspocus socket: what every document of the socket has for its
//! client, written by the socket's own task, which polls it with the reading side
//! ([`Writer::poll_write`]) on the one unsplit socket.
//!
//! Two kinds of sources feed it:
//!
//! - **The socket's queue** ([`Out`]): the socket's own answers (Pong, Authenticated,
//!   PermissionDenied, Close) and the frames of documents relayed to another node, bounded in
//!   frames (`peer_queue`) and bytes (`peer_queue_bytes`) across the socket.
//! - **The room queues of its documents joined on this node** ([`Direct`]): read here
//!   directly, as a y-websocket connection reads its own, and turned into Hocuspocus frames
//!   on the way out; no task or queue between. Each is bounded in its room (`peer_queue`,
//!   `peer_queue_bytes`), which closes it with 1013 when the client does not read; that
//!   close order overtakes a write stuck on the client.
//!
//! The socket's queue goes first in each round, so an `Authenticated` always precedes its
//! document's frames; the documents take turns.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::bell::{self, BellRx, BellTx, Doorbell};
use super::handover::{Acks, Ended, Event};
use crate::close;
use crate::metrics::Metrics;
use crate::protocol::hocuspocus as hp;
use crate::protocol::{self, MSG_DURABLE_ACK, MSG_STATELESS};
use crate::room::queue::{self, Next, QueueRx};
use crate::room::CloseReason;
use crate::socket::transport::{Duplex, LastSeen, WsMessage};

/// Most frames written with one flush.
const MAX_FRAMES_PER_FLUSH: usize = 64;

/// Most flushes in one poll of the writer: the rest waits for the task's next poll.
const MAX_BURSTS_PER_POLL: u8 = 4;

/// The socket's outbound queue, shared by the socket's own answers and its relayed documents'
/// sessions: bounded in frames (the channel, `peer_queue`) and in bytes (`peer_queue_bytes`,
/// across all of them). A session that cannot queue waits; its room's queue for it fills
/// meanwhile, and the room closes it with 1013, which closes the socket. A queued frame rings
/// the socket's [`Doorbell`] ([`bell::OUT`]).
#[derive(Clone)]
pub(super) struct Out {
    tx: mpsc::Sender<(Bytes, OwnedSemaphorePermit)>,
    budget: Arc<Semaphore>,
    max: u32,
    bell: Arc<Doorbell>,
}

/// The receiving end of [`Out`].
pub(super) type OutRx = mpsc::Receiver<(Bytes, OwnedSemaphorePermit)>;

impl Out {
    /// A queue of `frames` frames and `bytes` bytes behind `bell`.
    pub(super) fn new(frames: usize, bytes: usize, bell: &Arc<Doorbell>) -> (Out, OutRx) {
        let (tx, rx) = mpsc::channel(frames.max(4));
        let max = u32::try_from(bytes).unwrap_or(u32::MAX).max(1);
        let out = Out {
            tx,
            budget: Arc::new(Semaphore::new(max as usize)),
            max,
            bell: bell.clone(),
        };
        (out, rx)
    }

    fn units(&self, frame: &Bytes) -> u32 {
        u32::try_from(frame.len())
            .unwrap_or(u32::MAX)
            .clamp(1, self.max)
    }

    /// Queues a frame if there is room for it now (false: the queue is full, or the socket
    /// gone).
    pub(super) fn try_send(&self, frame: Bytes) -> bool {
        let Ok(permit) = self
            .budget
            .clone()
            .try_acquire_many_owned(self.units(&frame))
        else {
            return false;
        };
        if self.tx.try_send((frame, permit)).is_err() {
            return false;
        }
        self.bell.ring(bell::OUT);
        true
    }

    /// Queues a frame; fails only once the socket is gone.
    pub(super) async fn send(&self, frame: Bytes) -> Result<(), ()> {
        let permit = self
            .budget
            .clone()
            .acquire_many_owned(self.units(&frame))
            .await
            .map_err(|_| ())?;
        self.tx.send((frame, permit)).await.map_err(|_| ())?;
        self.bell.ring(bell::OUT);
        Ok(())
    }
}

/// A document of the socket joined on this node: its room's queue for it, read by the writer.
pub(super) struct Direct {
    /// The session's generation (tells it from an earlier session of the same address).
    pub(super) generation: u64,
    pub(super) address: String,
    pub(super) out_rx: QueueRx,
    pub(super) acks: Arc<Acks>,
    /// An echo was translated and its `SyncStatus(true)` may not all be made yet: only then
    /// are the shared counts read (another cache line on every wake-up otherwise).
    pub(super) owing: bool,
}

/// What the socket's reader tells its writer.
pub(super) enum WriterCmd {
    /// A document joined on this node: write what its room queues.
    Add(Box<Direct>),
    /// The document's session ended on the reader's side: stop reading its queue.
    Remove(u64),
}

/// The socket's write side. See the module's documentation.
pub(super) struct Writer {
    rx: OutRx,
    /// The socket's bell, rung when frames are queued in `rx`.
    bell: Arc<Doorbell>,
    /// `rx` was read for a ring and not yet found empty.
    rx_more: bool,
    cmds: BellRx<WriterCmd>,
    /// Where a session's end is reported (the room closed it).
    events: BellTx<Event>,
    metrics: Arc<Metrics>,
    direct: Vec<Direct>,
    /// The document whose queue is read first in the next round.
    turn: usize,
    /// Frames gathered for the next write, each with its share of the socket's budget.
    pending: VecDeque<(Bytes, Option<OwnedSemaphorePermit>)>,
    ping: PingTimer,
    /// A ping is to be written.
    ping_due: bool,
    idle_timeout: Duration,
    /// Frames were handed to the socket and are not flushed yet.
    flushing: bool,
}

impl Writer {
    /// The writer of the socket whose queue is `rx` behind `bell`, pinging every
    /// `ping_every` and closing a client silent for `idle_timeout`.
    pub(super) fn new(
        (rx, bell): (OutRx, &Arc<Doorbell>),
        cmds: BellRx<WriterCmd>,
        events: BellTx<Event>,
        metrics: Arc<Metrics>,
        (ping_every, idle_timeout): (Duration, Duration),
    ) -> Writer {
        Writer {
            ping: PingTimer::new(ping_every),
            idle_timeout,
            ping_due: false,
            flushing: false,
            metrics,
            rx,
            bell: bell.clone(),
            rx_more: false,
            cmds,
            events,
            direct: Vec::new(),
            turn: 0,
            pending: VecDeque::new(),
        }
    }

    /// Writes what the socket's documents have for the client, as far as the socket takes
    /// it: a burst of frames per flush, a ping every `ping_interval`, and a close for a client
    /// silent for `idle_timeout`. `Ready` when the socket ends (`None`: it failed). While a
    /// write waits on a client that does not read, a room's close order for one of the
    /// documents (one joined meanwhile too) still gets through.
    pub(super) fn poll_write<T: Duplex>(
        &mut self,
        conn: &mut T,
        seen: &LastSeen,
        cx: &mut Context<'_>,
    ) -> Poll<Option<CloseReason>> {
        // Bursts written in this poll: past a few, the rest waits for the task's next poll
        // (woken again at once), so the reader is not kept waiting by a busy socket.
        let mut bursts = 0;
        loop {
            // The timer first, whatever else there is to write: a steady stream of frames
            // must not hold back the pings (and the idle check) for as long as it lasts.
            // Checked while a write is stuck too (a ping already due included): a client that
            // neither reads nor sends is closed after `idle_timeout` either way.
            if self.ping.poll_due(cx).is_ready() {
                if seen.last().elapsed() >= self.idle_timeout {
                    let reason = CloseReason::new(close::GOING_AWAY, "idle timeout");
                    return Poll::Ready(Some(reason));
                }
                self.ping_due = true;
                // The next tick wakes this task even if nothing else does (a stuck write).
                let _ = self.ping.poll_due(cx);
            }
            while !self.pending.is_empty() || self.ping_due {
                match Pin::new(&mut *conn).poll_ready(cx) {
                    Poll::Pending => return self.poll_stuck(cx),
                    Poll::Ready(Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(())) => {}
                }
                let (msg, _permit) = match self.pending.pop_front() {
                    Some((frame, permit)) => (WsMessage::Binary(frame), permit),
                    None => {
                        self.ping_due = false;
                        (WsMessage::Ping(Bytes::new()), None)
                    }
                };
                if Pin::new(&mut *conn).start_send(msg).is_err() {
                    return Poll::Ready(None);
                }
                self.flushing = true;
            }
            if self.flushing {
                match Pin::new(&mut *conn).poll_flush(cx) {
                    Poll::Pending => return self.poll_stuck(cx),
                    Poll::Ready(Err(_)) => return Poll::Ready(None),
                    Poll::Ready(Ok(())) => self.flushing = false,
                }
                bursts += 1;
                if bursts == MAX_BURSTS_PER_POLL {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            if !ready!(self.poll_gather(cx)) {
                return Poll::Ready(None);
            }
        }
    }

    /// Gathers up to a burst of frames: the socket's queue first, then each document's in
    /// turn. `Ready(false)` once the socket's queue has closed.
    fn poll_gather(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        // One answer for both of the writer's queues (one registration of the waker).
        let rung = self.bell.answer(cx, bell::CMDS | bell::OUT);
        if rung & bell::CMDS != 0 {
            self.cmds.rung();
        }
        self.rx_more |= rung & bell::OUT != 0;
        while let Some(cmd) = self.cmds.try_next() {
            if !self.on_cmd(cmd) {
                return Poll::Ready(false);
            }
        }
        // The socket's queue first, read with `try_recv` (which the scheduler's budget does
        // not cut short) when its bell rang: an `Authenticated` queued before its document was
        // added is taken before anything of the document's.
        while self.rx_more && self.pending.len() < MAX_FRAMES_PER_FLUSH {
            match self.rx.try_recv() {
                Ok((frame, permit)) => self.pending.push_back((frame, Some(permit))),
                // (Answered above in this poll: a frame queued since rings again.)
                Err(mpsc::error::TryRecvError::Empty) => self.rx_more = false,
                Err(mpsc::error::TryRecvError::Disconnected) => return Poll::Ready(false),
            }
        }
        let n = self.direct.len();
        let mut ended = Vec::new();
        for i in 0..n {
            let at = (self.turn + i) % n;
            let direct = &mut self.direct[at];
            let to = (direct.address.as_str(), &*direct.acks);
            while self.pending.len() < MAX_FRAMES_PER_FLUSH {
                // The acknowledgements owed first, as many as the burst has room for.
                if direct.owing {
                    if let Some(status) = next_status(to) {
                        self.pending.push_back((status, None));
                        continue;
                    }
                    direct.owing = false;
                }
                match direct.out_rx.poll_next(cx) {
                    Poll::Ready(Next::Frame(frame)) => {
                        let pending = &mut self.pending;
                        let push = |f| pending.push_back((f, None));
                        direct.owing |= translate(to, &self.metrics, &frame, push);
                    }
                    // The room's keep-alive tick: the socket pings for all its documents.
                    Poll::Ready(Next::Ping) => {}
                    Poll::Ready(Next::Kill(reason)) => {
                        ended.push((at, reason));
                        break;
                    }
                    Poll::Ready(Next::Closed) => {
                        ended.push((at, queue::closed_reason()));
                        break;
                    }
                    Poll::Pending => break,
                }
            }
        }
        if n > 0 {
            self.turn = (self.turn + 1) % n;
        }
        ended.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        for (at, reason) in ended {
            let direct = self.direct.remove(at);
            self.ended(direct, reason);
        }
        if self.pending.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(true)
        }
    }

    /// Takes the reader's commands. False once the reader is gone (so is the socket).
    fn poll_cmds(&mut self, cx: &mut Context<'_>) -> bool {
        while let Poll::Ready(cmd) = self.cmds.poll_recv(cx) {
            if !self.on_cmd(cmd) {
                return false;
            }
        }
        true
    }

    /// One of the reader's commands (`None`: the reader is gone); false if it was that.
    fn on_cmd(&mut self, cmd: Option<WriterCmd>) -> bool {
        match cmd {
            Some(WriterCmd::Add(direct)) => self.direct.push(*direct),
            Some(WriterCmd::Remove(generation)) => {
                self.direct.retain(|d| d.generation != generation)
            }
            None => return false,
        }
        true
    }

    /// A write waits on the client: the reader's commands are taken, and a room's close order
    /// for one of the documents ends it, while the write waits. Always `Pending` (the socket
    /// wakes the task when the write can go on).
    fn poll_stuck(&mut self, cx: &mut Context<'_>) -> Poll<Option<CloseReason>> {
        // (The reader never goes first: it holds the commands' sender.)
        let _ = self.poll_cmds(cx);
        let mut at = 0;
        while at < self.direct.len() {
            match self.direct[at].out_rx.poll_killed(cx) {
                Poll::Ready(reason) => {
                    let direct = self.direct.remove(at);
                    self.ended(direct, reason);
                }
                Poll::Pending => at += 1,
            }
        }
        Poll::Pending
    }

    /// A document's room closed it (or went away): the reader decides what that closes.
    fn ended(&self, direct: Direct, reason: CloseReason) {
        self.events.send(Event::Ended(Ended {
            address: direct.address,
            generation: direct.generation,
            outcome: Some(reason),
        }));
    }
}

/// The writer's ping timer, polled only when it is due or the socket's waker changed: a
/// timer keeps the waker it was last polled with until it fires, so polling it on every
/// wake-up of the socket (every frame either way) only re-read its entry in the runtime's
/// timer wheel, a cold cache line per wake-up. A tick late after a stall is not made up for.
struct PingTimer {
    sleep: Pin<Box<Sleep>>,
    /// The timer's deadline, kept here: reading it from the timer is another cache line.
    due: Instant,
    every: Duration,
    /// The waker the timer holds.
    waker: Option<Waker>,
}

impl PingTimer {
    fn new(every: Duration) -> PingTimer {
        let due = Instant::now() + every;
        PingTimer {
            sleep: Box::pin(tokio::time::sleep_until(due)),
            due,
            every,
            waker: None,
        }
    }

    fn poll_due(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let holds = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if holds && Instant::now() < self.due {
            return Poll::Pending;
        }
        // Outside the scheduler's budget: a budget spent would leave the timer unpolled (no
        // waker registered) while this records the waker as held.
        let mut sleep = tokio::task::unconstrained(self.sleep.as_mut());
        match Pin::new(&mut sleep).poll(cx) {
            Poll::Ready(()) => {
                self.due = Instant::now() + self.every;
                self.sleep.as_mut().reset(self.due);
                self.waker = None;
                Poll::Ready(())
            }
            Poll::Pending => {
                self.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Turns a frame a room queued for a peer (y-websocket messages) into Hocuspocus frames for
/// the document's address, one per message: Sync, Awareness and QueryAwareness as they are
/// after the address; a refused update as `SyncStatus(false)`; a stateless message as
/// `Stateless`. A durable acknowledgement makes one `SyncStatus(true)` owed for each update
/// it covers ([`next_status`]). True if the frame held such an acknowledgement.
pub(super) fn translate(
    (address, acks): (&str, &Acks),
    metrics: &Metrics,
    frame: &Bytes,
    mut emit: impl FnMut(Bytes),
) -> bool {
    let Ok(messages) = protocol::split_frame(frame) else {
        debug!("dropping a frame that does not split into messages");
        return false;
    };
    let mut echoed = false;
    for (tag, message) in messages {
        match tag {
            0 | 1 | 3 => emit(hp::wrap(address, &message)),
            // The room refused a read-only client's update: Hocuspocus says so with
            // SyncStatus(false).
            2 if message.get(1) == Some(&0) => {
                acks.refused.fetch_add(1, Ordering::Relaxed);
                emit(hp::encode_sync_status(address, false));
            }
            t if t == u64::from(MSG_DURABLE_ACK) => {
                // Everything up to update `n` is committed: one SyncStatus(true) is owed for
                // each update not yet answered (refusals were answered already; counting them
                // here before their turn only delays an answer, never sends one early). They
                // are made by `next_status`, as the writer has room for them.
                let Some(n) = protocol::read_durable_ack(&message) else {
                    continue;
                };
                let n = n.min(acks.requested.load(Ordering::Relaxed));
                let target = n.saturating_sub(acks.refused.load(Ordering::Relaxed));
                acks.owed.fetch_max(target, Ordering::Relaxed);
                echoed = true;
            }
            t if t == u64::from(MSG_STATELESS) => {
                if let Some(payload) = protocol::read_stateless(&message) {
                    metrics.stateless_sent.inc();
                    emit(hp::encode_stateless(address, &payload));
                }
            }
            _ => {}
        }
    }
    echoed
}

/// The next `SyncStatus(true)` owed to a document, if any.
pub(super) fn next_status((address, acks): (&str, &Acks)) -> Option<Bytes> {
    if acks.issued.load(Ordering::Relaxed) >= acks.owed.load(Ordering::Relaxed) {
        return None;
    }
    acks.issued.fetch_add(1, Ordering::Relaxed);
    Some(hp::encode_sync_status(address, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One echo covering many updates (the room coalesces acknowledgement requests) makes no
    /// frames by itself: each `SyncStatus(true)` is made when the writer has room for it, so
    /// an echo for a million updates to a client that does not read costs a counter.
    #[test]
    fn an_echo_covering_many_updates_owes_their_answers_and_makes_them_one_at_a_time() {
        let metrics = Metrics::new();
        let acks = Acks::default();
        acks.requested.store(1_000_000, Ordering::Relaxed);
        acks.refused.store(2, Ordering::Relaxed);
        let mut frames = Vec::new();
        let echo = protocol::encode_durable_ack(1_000_000);
        translate(("doc", &acks), &metrics, &echo, |f| frames.push(f));
        assert!(frames.is_empty(), "{} frames made at once", frames.len());
        assert_eq!(acks.owed.load(Ordering::Relaxed), 999_998);
        let status = next_status(("doc", &acks)).expect("one owed");
        assert_eq!(status, hp::encode_sync_status("doc", true));
        assert_eq!(acks.issued.load(Ordering::Relaxed), 1);
        // An echo claiming more than was requested is not believed, and an older echo
        // owes nothing more.
        let more = protocol::encode_durable_ack(5_000_000);
        let older = protocol::encode_durable_ack(10);
        translate(("doc", &acks), &metrics, &more, |f| frames.push(f));
        translate(("doc", &acks), &metrics, &older, |f| frames.push(f));
        assert_eq!(acks.owed.load(Ordering::Relaxed), 999_998);
        let made = std::iter::from_fn(|| next_status(("doc", &acks))).count();
        assert_eq!(made, 999_997);
        assert!(next_status(("doc", &acks)).is_none());
    }

    /// A socket that takes everything at once, recording the frames of each flush.
    #[derive(Default)]
    struct Recorder {
        sent: Vec<WsMessage>,
        flushes: Vec<usize>,
        unflushed: usize,
    }

    impl futures_util::Sink<WsMessage> for Recorder {
        type Error = crate::socket::transport::WsError;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn start_send(mut self: Pin<&mut Self>, msg: WsMessage) -> Result<(), Self::Error> {
            self.sent.push(msg);
            self.unflushed += 1;
            Ok(())
        }
        fn poll_flush(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Result<(), Self::Error>> {
            let n = std::mem::take(&mut self.unflushed);
            if n > 0 {
                self.flushes.push(n);
            }
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
    }

    impl futures_util::Stream for Recorder {
        type Item = Result<WsMessage, crate::socket::transport::WsError>;
        fn poll_next(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            Poll::Pending
        }
    }

    /// A writer over a queue of `frames` frames, with no ping due for an hour.
    fn writer(frames: usize) -> (Writer, Out, BellTx<WriterCmd>) {
        let bell = Arc::new(Doorbell::default());
        let (out, out_rx) = Out::new(frames, 1 << 20, &bell);
        let (cmds_tx, cmds_rx) = bell::unbounded(&bell, bell::CMDS);
        let (events_tx, _events_rx) = bell::unbounded(&bell, bell::EVENTS);
        let hour = Duration::from_secs(3600);
        let w = Writer::new(
            (out_rx, &bell),
            cmds_rx,
            events_tx,
            Arc::new(Metrics::new()),
            (hour, hour),
        );
        (w, out, cmds_tx)
    }

    fn binaries(sent: &[WsMessage]) -> Vec<Bytes> {
        sent.iter()
            .map(|m| match m {
                WsMessage::Binary(b) => b.clone(),
                other => panic!("not a frame: {other:?}"),
            })
            .collect()
    }

    /// A full queue leaves in bursts: at most `MAX_FRAMES_PER_FLUSH` frames per flush and
    /// `MAX_BURSTS_PER_POLL` flushes per poll, after which the writer wakes itself and lets
    /// the reader have its turn; the rest goes on the next poll, in order.
    #[tokio::test]
    async fn a_full_queue_leaves_in_bursts_and_the_writer_yields_between_them() {
        let total = MAX_FRAMES_PER_FLUSH * MAX_BURSTS_PER_POLL as usize + 10;
        let (mut w, out, _cmds) = writer(total);
        for i in 0..total {
            assert!(out.try_send(Bytes::from((i as u32).to_be_bytes().to_vec())));
        }
        let mut socket = Recorder::default();
        let seen = LastSeen::new();
        let woken = Arc::new(WakeCount::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(w.poll_write(&mut socket, &seen, &mut cx).is_pending());
        assert_eq!(
            socket.flushes,
            vec![MAX_FRAMES_PER_FLUSH; MAX_BURSTS_PER_POLL as usize],
            "one poll writes its bursts and stops"
        );
        assert_eq!(woken.count(), 1, "and wakes itself for the rest");
        assert!(w.poll_write(&mut socket, &seen, &mut cx).is_pending());
        assert_eq!(socket.flushes.last(), Some(&10));
        let frames = binaries(&socket.sent);
        assert_eq!(frames.len(), total);
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(
                f.as_ref(),
                (i as u32).to_be_bytes(),
                "frame {i} out of order"
            );
        }
        // Every frame's share of the queue's budget went back as it was written.
        for i in 0..total {
            assert!(
                out.try_send(Bytes::from(vec![i as u8])),
                "budget not returned"
            );
        }
    }

    #[derive(Default)]
    struct WakeCount(std::sync::atomic::AtomicUsize);

    impl WakeCount {
        fn count(&self) -> usize {
            self.0.load(Ordering::Relaxed)
        }
    }

    impl std::task::Wake for WakeCount {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A room's frame becomes one Hocuspocus frame per message, for the document's address:
    /// updates and awareness wrapped as they are, a refused update as `SyncStatus(false)`, a
    /// stateless message as `Stateless`; a durable acknowledgement makes no frame by itself.
    /// A frame that does not split into messages is dropped whole.
    #[test]
    fn a_room_frame_becomes_one_hocuspocus_frame_per_message() {
        let metrics = Metrics::new();
        let acks = Acks::default();
        acks.requested.store(1, Ordering::Relaxed);
        let update = protocol::encode_update(&[0, 0]);
        let denied = protocol::encode_permission_denied("read-only");
        let stateless = protocol::encode_stateless("{\"hi\":1}");
        let ack = protocol::encode_durable_ack(1);
        let frame = Bytes::from([&update[..], &denied, &ack, &stateless].concat());
        let mut frames = Vec::new();
        let echoed = translate(("a\0s", &acks), &metrics, &frame, |f| frames.push(f));
        assert!(echoed);
        assert_eq!(
            frames,
            vec![
                hp::wrap("a\0s", &update),
                hp::encode_sync_status("a\0s", false),
                hp::encode_stateless("a\0s", "{\"hi\":1}"),
            ]
        );
        // The refusal was counted, so the acknowledgement owes nothing for it.
        assert_eq!(acks.owed.load(Ordering::Relaxed), 0);
        let mut cut = frame.to_vec();
        cut.truncate(update.len() + 3);
        let mut none = Vec::new();
        assert!(!translate(("a", &acks), &metrics, &Bytes::from(cut), |f| {
            none.push(f)
        }));
        assert!(none.is_empty(), "a frame cut short sends nothing of it");
    }
}
