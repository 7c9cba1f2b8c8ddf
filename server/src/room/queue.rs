//! A peer's outbound queue: the frames the room has encoded for one connection, plus the
//! room's order to close it.
//!
//! It replaces a bounded `mpsc` channel and a `oneshot` for the close order with one small
//! shared cell. An idle connection's queue holds no buffer at all (tokio's channel allocates
//! a 32-slot block up front, about 1 KiB per connection), and the close order travels in the
//! same cell instead of a second allocation.
//!
//! The room ([`QueueTx`]) pushes with [`QueueTx::try_send`], which never waits: a full queue
//! is the room's signal to close the peer with 1013. The queue is bounded twice: by frames
//! (`peer_queue`) and by bytes (`peer_queue_bytes`). One frame is always accepted into an
//! empty queue, however large (a whole-document Sync Step 2 may exceed the byte bound), so
//! the bound is on what piles up behind the frame being written. The connection
//! ([`QueueRx`]) receives frames in order; a close order, once given, is seen before any
//! frame still queued.
//!
//! Answers to requests ([`Answer`]: Sync Step 2, the awareness table) are queued with
//! [`QueueTx::try_send_answer`], which queues nothing while an earlier answer of the same kind
//! is still waiting to be read: a client that repeats its request without reading gets one
//! answer, not one per request (everything that changes after that answer was encoded reaches
//! the peer as broadcasts anyway).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use prometheus::IntGauge;

use super::CloseReason;

struct State {
    frames: VecDeque<Bytes>,
    /// Bytes of the frames queued.
    bytes: usize,
    /// Frames ever popped, and for each [`Answer`] kind the count the queue must reach
    /// (frames popped) before that answer has been taken by the connection.
    popped: u64,
    pushed: u64,
    answer_until: [u64; 2],
    kill: Option<CloseReason>,
    /// The room's keep-alive tick: time to check the peer is alive and ping it.
    ping: bool,
    /// The room dropped its end (it stopped, or forgot the peer).
    closed: bool,
}

impl State {
    /// The next frame; a queue drained empty gives its buffer back, so an idle connection
    /// holds none (a busy one allocates again on the next push, which costs far less than
    /// the write it precedes).
    fn pop(&mut self, gauge: &IntGauge) -> Option<Bytes> {
        let frame = self.frames.pop_front();
        if let Some(f) = &frame {
            self.bytes -= f.len();
            self.popped += 1;
            gauge.sub(f.len() as i64);
        }
        if self.frames.is_empty() && self.frames.capacity() > 0 {
            self.frames = VecDeque::new();
        }
        frame
    }
}

struct Shared {
    state: Mutex<State>,
    waker: AtomicWaker,
    capacity: usize,
    max_bytes: usize,
    /// Bytes queued in every peer queue of the process (`quire_peer_queue_bytes`).
    gauge: IntGauge,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        self.gauge.sub(state.bytes as i64);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // The lock is never held across code that can panic, but a poisoned lock still
        // holds consistent data: take it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The room's end.
pub struct QueueTx(Arc<Shared>);

/// The connection's end.
pub struct QueueRx(Arc<Shared>);

/// Why a frame was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum SendError {
    /// The queue holds `capacity` frames, or the frame would take it past its byte bound:
    /// the peer is not reading fast enough.
    Full,
    /// The connection is gone.
    Disconnected,
}

/// What the connection receives next.
#[derive(Debug, PartialEq)]
pub enum Next {
    Frame(Bytes),
    /// The room's order to close, with the code and reason to send.
    Kill(CloseReason),
    /// The room's keep-alive tick.
    Ping,
    /// The room dropped the peer without an order (it stopped or panicked).
    Closed,
}

/// Kinds of answers of which a peer has at most one queued at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Sync Step 2, the answer to a Sync Step 1.
    Sync = 0,
    /// The awareness table, the answer to a QueryAwareness.
    Awareness = 1,
}

/// The bounds of a peer's queue.
#[derive(Debug, Clone)]
pub struct Bounds {
    /// Most frames queued.
    pub frames: usize,
    /// Most bytes queued (one frame is accepted into an empty queue whatever its size).
    pub bytes: usize,
    /// Counts the bytes queued, summed over every queue sharing it.
    pub gauge: IntGauge,
}

impl Bounds {
    /// Bounds for tests and tools: a private gauge.
    pub fn new(frames: usize, bytes: usize) -> Bounds {
        Bounds {
            frames,
            bytes,
            gauge: IntGauge::new("peer_queue_bytes", "unregistered")
                .unwrap_or_else(|_| unreachable!("a literal metric name is valid")),
        }
    }
}

/// A queue within `bounds`.
pub fn queue(bounds: Bounds) -> (QueueTx, QueueRx) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            bytes: 0,
            popped: 0,
            pushed: 0,
            answer_until: [0; 2],
            kill: None,
            ping: false,
            closed: false,
        }),
        waker: AtomicWaker::new(),
        capacity: bounds.frames.max(1),
        max_bytes: bounds.bytes,
        gauge: bounds.gauge,
    });
    (QueueTx(shared.clone()), QueueRx(shared))
}

impl QueueTx {
    /// Queues `frame` without waiting.
    pub fn try_send(&self, frame: Bytes) -> Result<(), SendError> {
        {
            let mut state = self.0.lock();
            self.push(&mut state, frame)?;
        }
        self.0.waker.wake();
        Ok(())
    }

    /// Queues an answer of kind `kind`, unless one is still queued unread: `Ok(false)` then,
    /// and nothing is queued.
    pub fn try_send_answer(&self, kind: Answer, frame: Bytes) -> Result<bool, SendError> {
        {
            let mut state = self.0.lock();
            if state.popped < state.answer_until[kind as usize] {
                return Ok(false);
            }
            self.push(&mut state, frame)?;
            state.answer_until[kind as usize] = state.pushed;
        }
        self.0.waker.wake();
        Ok(true)
    }

    /// Whether an answer of kind `kind` is queued and not yet read (asking for another one
    /// would queue nothing).
    pub fn answer_pending(&self, kind: Answer) -> bool {
        let state = self.0.lock();
        state.popped < state.answer_until[kind as usize]
    }

    fn push(&self, state: &mut State, frame: Bytes) -> Result<(), SendError> {
        if Arc::strong_count(&self.0) == 1 {
            return Err(SendError::Disconnected);
        }
        let over_bytes = state.bytes + frame.len() > self.0.max_bytes && !state.frames.is_empty();
        if state.frames.len() >= self.0.capacity || over_bytes {
            return Err(SendError::Full);
        }
        state.bytes += frame.len();
        state.pushed += 1;
        self.0.gauge.add(frame.len() as i64);
        state.frames.push_back(frame);
        Ok(())
    }

    /// Orders the connection to close with `reason`; the first order wins. Frames still
    /// queued will never be sent (the order overtakes them), so they are freed at once
    /// rather than when the close handshake ends, which can take a slow peer a while.
    pub fn kill(&self, reason: CloseReason) {
        {
            let mut state = self.0.lock();
            if state.kill.is_none() {
                state.kill = Some(reason);
            }
            self.0.gauge.sub(state.bytes as i64);
            state.bytes = 0;
            state.frames = VecDeque::new();
        }
        self.0.waker.wake();
    }
}

impl QueueTx {
    /// Asks the connection to check its peer is alive and ping it (coalesced: ticks the
    /// connection has not handled yet count once).
    pub fn ping(&self) {
        self.0.lock().ping = true;
        self.0.waker.wake();
    }
}

impl Drop for QueueTx {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.waker.wake();
    }
}

impl QueueRx {
    /// The next frame or order; waits while there is none.
    pub async fn recv(&self) -> Next {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Resolves once the room has ordered a close (or dropped the peer); frames queued in the
    /// meantime stay queued.
    pub async fn killed(&self) -> CloseReason {
        poll_fn(|cx| self.poll_killed(cx)).await
    }

    /// [`QueueRx::killed`] for a caller that polls.
    pub fn poll_killed(&self, cx: &mut Context<'_>) -> Poll<CloseReason> {
        self.0.waker.register(cx.waker());
        let state = self.0.lock();
        match (&state.kill, state.closed) {
            (Some(reason), _) => Poll::Ready(reason.clone()),
            (None, true) => Poll::Ready(closed_reason()),
            (None, false) => Poll::Pending,
        }
    }

    /// [`QueueRx::poll_killed`] for a connection whose write is stuck, with the keep-alive
    /// tick as well (taken, as [`QueueRx::poll_next`] takes it): the connection checks its
    /// peer is alive on it even while it cannot write.
    pub fn poll_stuck(&self, cx: &mut Context<'_>) -> Poll<Next> {
        self.0.waker.register(cx.waker());
        let mut state = self.0.lock();
        if let Some(reason) = state.kill.clone() {
            return Poll::Ready(Next::Kill(reason));
        }
        if state.closed {
            return Poll::Ready(Next::Closed);
        }
        if std::mem::take(&mut state.ping) {
            return Poll::Ready(Next::Ping);
        }
        Poll::Pending
    }

    /// A queued frame if one is there now (a close order comes first and stops the drain).
    pub fn try_recv(&self) -> Option<Bytes> {
        let mut state = self.0.lock();
        if state.kill.is_some() {
            return None;
        }
        state.pop(&self.0.gauge)
    }

    /// [`QueueRx::recv`] for a caller that polls.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        // Register first so a push between the check and the return still wakes us.
        self.0.waker.register(cx.waker());
        let mut state = self.0.lock();
        if let Some(reason) = state.kill.take() {
            return Poll::Ready(Next::Kill(reason));
        }
        if std::mem::take(&mut state.ping) {
            return Poll::Ready(Next::Ping);
        }
        if let Some(frame) = state.pop(&self.0.gauge) {
            return Poll::Ready(Next::Frame(frame));
        }
        if state.closed {
            return Poll::Ready(Next::Closed);
        }
        Poll::Pending
    }
}

/// The reason given when the room went away without an order.
pub fn closed_reason() -> CloseReason {
    CloseReason::new(crate::close::INTERNAL, "document closed, reconnect")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    fn queue(frames: usize) -> (QueueTx, QueueRx) {
        super::queue(Bounds::new(frames, 1 << 20))
    }

    #[tokio::test]
    async fn frames_arrive_in_order_and_the_bound_holds() {
        let (tx, rx) = queue(2);
        assert_eq!(tx.try_send(frame(1)), Ok(()));
        assert_eq!(tx.try_send(frame(2)), Ok(()));
        assert_eq!(tx.try_send(frame(3)), Err(SendError::Full));
        assert_eq!(rx.recv().await, Next::Frame(frame(1)));
        assert_eq!(rx.try_recv(), Some(frame(2)));
        assert_eq!(rx.try_recv(), None);
        assert_eq!(tx.try_send(frame(4)), Ok(()));
        assert_eq!(rx.recv().await, Next::Frame(frame(4)));
    }

    #[tokio::test]
    async fn a_close_order_overtakes_queued_frames() {
        let (tx, rx) = queue(8);
        tx.try_send(frame(1)).unwrap();
        tx.kill(CloseReason::new(1013, "full"));
        tx.kill(CloseReason::new(4403, "second order loses"));
        assert_eq!(rx.killed().await.code, 1013);
        assert_eq!(rx.try_recv(), None);
        assert!(
            rx.0.lock().frames.is_empty(),
            "frames behind a close order are freed"
        );
        assert_eq!(rx.recv().await, Next::Kill(CloseReason::new(1013, "full")));
    }

    #[tokio::test]
    async fn dropping_the_room_end_ends_the_stream_after_the_frames() {
        let (tx, rx) = queue(8);
        tx.try_send(frame(1)).unwrap();
        drop(tx);
        assert_eq!(rx.recv().await, Next::Frame(frame(1)));
        assert_eq!(rx.recv().await, Next::Closed);
        assert_eq!(rx.killed().await.code, crate::close::INTERNAL);
    }

    #[tokio::test]
    async fn keep_alive_ticks_coalesce_and_come_before_frames() {
        let (tx, rx) = queue(8);
        tx.try_send(frame(1)).unwrap();
        tx.ping();
        tx.ping();
        assert_eq!(rx.recv().await, Next::Ping);
        assert_eq!(rx.recv().await, Next::Frame(frame(1)));
        tx.ping();
        assert_eq!(rx.recv().await, Next::Ping);
    }

    #[tokio::test]
    async fn sending_to_a_gone_connection_fails() {
        let (tx, rx) = queue(8);
        drop(rx);
        assert_eq!(tx.try_send(frame(1)), Err(SendError::Disconnected));
    }

    #[tokio::test]
    async fn a_waiting_receiver_wakes_on_send() {
        let (tx, rx) = queue(8);
        let waiter = tokio::spawn(async move { rx.recv().await });
        tokio::task::yield_now().await;
        tx.try_send(frame(7)).unwrap();
        assert_eq!(waiter.await.unwrap(), Next::Frame(frame(7)));
    }

    #[tokio::test]
    async fn the_byte_bound_holds_behind_one_frame_of_any_size() {
        let bounds = Bounds::new(100, 10);
        let gauge = bounds.gauge.clone();
        let (tx, rx) = super::queue(bounds);
        // An empty queue takes a frame larger than the bound...
        assert_eq!(tx.try_send(Bytes::from(vec![0; 25])), Ok(()));
        // ... but nothing more behind it.
        assert_eq!(tx.try_send(frame(1)), Err(SendError::Full));
        assert_eq!(gauge.get(), 25);
        assert_eq!(rx.try_recv().map(|f| f.len()), Some(25));
        assert_eq!(gauge.get(), 0);
        for n in 0..10 {
            assert_eq!(tx.try_send(frame(n)), Ok(()));
        }
        assert_eq!(tx.try_send(frame(10)), Err(SendError::Full));
        assert_eq!(gauge.get(), 10);
        drop(rx);
        drop(tx);
        assert_eq!(
            gauge.get(),
            0,
            "a dropped queue gives its bytes back to the gauge"
        );
    }

    #[tokio::test]
    async fn an_answer_is_queued_once_until_it_is_read() {
        let (tx, rx) = queue(8);
        assert_eq!(tx.try_send(frame(0)), Ok(()));
        assert_eq!(tx.try_send_answer(Answer::Sync, frame(1)), Ok(true));
        assert!(tx.answer_pending(Answer::Sync));
        assert_eq!(tx.try_send_answer(Answer::Sync, frame(2)), Ok(false));
        // Another kind of answer is independent.
        assert_eq!(tx.try_send_answer(Answer::Awareness, frame(3)), Ok(true));
        // Reading the frame before the answer does not free it...
        assert_eq!(rx.try_recv(), Some(frame(0)));
        assert_eq!(tx.try_send_answer(Answer::Sync, frame(4)), Ok(false));
        // ... reading the answer does.
        assert_eq!(rx.try_recv(), Some(frame(1)));
        assert!(!tx.answer_pending(Answer::Sync));
        assert_eq!(tx.try_send_answer(Answer::Sync, frame(5)), Ok(true));
        assert_eq!(rx.try_recv(), Some(frame(3)));
        assert_eq!(rx.try_recv(), Some(frame(5)));
        assert_eq!(rx.try_recv(), None);
    }
}
