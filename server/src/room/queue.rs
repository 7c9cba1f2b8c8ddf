//! A peer's outbound queue: the frames the room has encoded for one connection, plus the
//! room's order to close it.
//!
//! It replaces a bounded `mpsc` channel and a `oneshot` for the close order with one small
//! shared cell. An idle connection's queue holds no buffer at all (tokio's channel allocates
//! a 32-slot block up front, about 1 KiB per connection), and the close order travels in the
//! same cell instead of a second allocation.
//!
//! The room ([`QueueTx`]) pushes with [`QueueTx::try_send`], which never waits: a full queue
//! is the room's signal to close the peer with 1013. The connection ([`QueueRx`]) receives
//! frames in order; a close order, once given, is seen before any frame still queued.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;

use super::CloseReason;

struct State {
    frames: VecDeque<Bytes>,
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
    fn pop(&mut self) -> Option<Bytes> {
        let frame = self.frames.pop_front();
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
    /// The queue holds `capacity` frames: the peer is not reading.
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

/// A queue holding at most `capacity` frames.
pub fn queue(capacity: usize) -> (QueueTx, QueueRx) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            frames: VecDeque::new(),
            kill: None,
            ping: false,
            closed: false,
        }),
        waker: AtomicWaker::new(),
        capacity: capacity.max(1),
    });
    (QueueTx(shared.clone()), QueueRx(shared))
}

impl QueueTx {
    /// Queues `frame` without waiting.
    pub fn try_send(&self, frame: Bytes) -> Result<(), SendError> {
        {
            let mut state = self.0.lock();
            if Arc::strong_count(&self.0) == 1 {
                return Err(SendError::Disconnected);
            }
            if state.frames.len() >= self.0.capacity {
                return Err(SendError::Full);
            }
            state.frames.push_back(frame);
        }
        self.0.waker.wake();
        Ok(())
    }

    /// Orders the connection to close with `reason`; the first order wins.
    pub fn kill(&self, reason: CloseReason) {
        {
            let mut state = self.0.lock();
            if state.kill.is_none() {
                state.kill = Some(reason);
            }
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
        poll_fn(|cx| {
            self.0.waker.register(cx.waker());
            let state = self.0.lock();
            match (&state.kill, state.closed) {
                (Some(reason), _) => Poll::Ready(reason.clone()),
                (None, true) => Poll::Ready(closed_reason()),
                (None, false) => Poll::Pending,
            }
        })
        .await
    }

    /// A queued frame if one is there now (a close order comes first and stops the drain).
    pub fn try_recv(&self) -> Option<Bytes> {
        let mut state = self.0.lock();
        if state.kill.is_some() {
            return None;
        }
        state.pop()
    }

    fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Next> {
        // Register first so a push between the check and the return still wakes us.
        self.0.waker.register(cx.waker());
        let mut state = self.0.lock();
        if let Some(reason) = state.kill.take() {
            return Poll::Ready(Next::Kill(reason));
        }
        if std::mem::take(&mut state.ping) {
            return Poll::Ready(Next::Ping);
        }
        if let Some(frame) = state.pop() {
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
}
