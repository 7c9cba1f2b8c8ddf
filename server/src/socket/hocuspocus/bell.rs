//! A Hocuspocus socket's doorbell: the one waker behind the socket's own queues.
//!
//! A socket's task polls its reader and its writer together, and every wake-up (a frame from
//! the client, one from a room) used to poll each of its queues too: the reader's events, the
//! writer's commands and the socket's outbound queue. Polling an empty tokio channel reads it
//! twice and registers the waker in it, and with hundreds of sockets those are cold cache
//! lines: a few microseconds per wake-up, a tenth of the endpoint's CPU per update at the light
//! load (docs/benchmarks.md, "The Hocuspocus endpoint").
//!
//! So whoever queues something for the socket also rings its bell ([`Doorbell::ring`]): a bit
//! per queue and one waker. A queue's reader checks its bit ([`Doorbell::answer`]), which
//! registers the socket's waker, and reads the queue with `try_recv` only when the bit was
//! set: a wake-up that concerns none of them costs one cache line.
//!
//! Ordering: a sender queues, then rings; a reader clears the bit, then reads until the queue
//! is empty. A message queued after the bit was cleared rings again, so none waits unseen.
//! A queue whose senders are all gone rings nothing: each of these queues has a sender in the
//! socket itself for as long as its reader is polled.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::sync::mpsc;

/// The socket's outbound queue ([`super::writer::Out`]).
pub(super) const OUT: u8 = 1;
/// What the sessions and the writer tell the socket's reader.
pub(super) const EVENTS: u8 = 2;
/// What the reader tells the writer.
pub(super) const CMDS: u8 = 4;

/// See the module's documentation.
#[derive(Default)]
pub(super) struct Doorbell {
    waker: AtomicWaker,
    rung: AtomicU8,
}

impl Doorbell {
    /// Something was queued behind `bits`: wakes the socket.
    pub(super) fn ring(&self, bits: u8) {
        self.rung.fetch_or(bits, Ordering::Release);
        self.waker.wake();
    }

    /// Which of `bits` were rung since they were last answered (clearing them); the socket
    /// is woken at the next ring either way.
    pub(super) fn answer(&self, cx: &Context<'_>, bits: u8) -> u8 {
        self.waker.register(cx.waker());
        self.rung.fetch_and(!bits, Ordering::Acquire) & bits
    }
}

/// The sending end of an unbounded queue behind a doorbell.
pub(super) struct BellTx<T> {
    tx: mpsc::UnboundedSender<T>,
    bell: Arc<Doorbell>,
    bit: u8,
}

impl<T> Clone for BellTx<T> {
    fn clone(&self) -> Self {
        BellTx {
            tx: self.tx.clone(),
            bell: self.bell.clone(),
            bit: self.bit,
        }
    }
}

impl<T> BellTx<T> {
    /// Queues `value` (false once the receiver is gone).
    pub(super) fn send(&self, value: T) -> bool {
        if self.tx.send(value).is_err() {
            return false;
        }
        self.bell.ring(self.bit);
        true
    }
}

/// The receiving end of an unbounded queue behind a doorbell.
pub(super) struct BellRx<T> {
    rx: mpsc::UnboundedReceiver<T>,
    bell: Arc<Doorbell>,
    bit: u8,
    /// The bit was answered and the queue not yet found empty.
    more: bool,
}

impl<T> BellRx<T> {
    /// The next value; `Ready(None)` once every sender is gone and the queue is empty (seen
    /// when the queue is read for a ring).
    pub(super) fn poll_recv(&mut self, cx: &Context<'_>) -> Poll<Option<T>> {
        loop {
            if !self.more {
                // Registers this poll's waker: a send after this rings it.
                if self.bell.answer(cx, self.bit) == 0 {
                    return Poll::Pending;
                }
                self.more = true;
            }
            match self.rx.try_recv() {
                Ok(value) => return Poll::Ready(Some(value)),
                // Answered again before giving up: a ring since the last answer reads again.
                Err(mpsc::error::TryRecvError::Empty) => self.more = false,
                Err(mpsc::error::TryRecvError::Disconnected) => return Poll::Ready(None),
            }
        }
    }
}

impl<T> BellRx<T> {
    /// For a reader that answered the bell itself (several bits at once, one registration):
    /// its bit rang.
    pub(super) fn rung(&mut self) {
        self.more = true;
    }

    /// The next value if the bit rang and the queue holds one (`Some(None)`: every sender is
    /// gone); the caller answered the bell in this same poll, so a send after this rings.
    pub(super) fn try_next(&mut self) -> Option<Option<T>> {
        if !self.more {
            return None;
        }
        match self.rx.try_recv() {
            Ok(value) => Some(Some(value)),
            Err(mpsc::error::TryRecvError::Empty) => {
                self.more = false;
                None
            }
            Err(mpsc::error::TryRecvError::Disconnected) => Some(None),
        }
    }
}

/// An unbounded queue behind `bell`'s `bit`.
pub(super) fn unbounded<T>(bell: &Arc<Doorbell>, bit: u8) -> (BellTx<T>, BellRx<T>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let tx = BellTx {
        tx,
        bell: bell.clone(),
        bit,
    };
    let rx = BellRx {
        rx,
        bell: bell.clone(),
        bit,
        more: false,
    };
    (tx, rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A queue behind the bell is read only when its bit rang, every value sent is read, a
    /// send after the queue was found empty wakes the socket, and another queue's ring does
    /// not make this one read.
    #[test]
    fn a_ring_wakes_the_socket_and_reads_only_the_queue_rung() {
        let bell = Arc::new(Doorbell::default());
        let (tx, mut rx) = unbounded::<u32>(&bell, EVENTS);
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = std::task::Waker::from(woken.clone());
        let cx = Context::from_waker(&waker);

        assert!(rx.poll_recv(&cx).is_pending());
        bell.ring(CMDS);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        assert!(rx.poll_recv(&cx).is_pending(), "another queue's ring");

        assert!(tx.send(1) && tx.send(2));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(Some(1)));
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(Some(2)));
        assert!(rx.poll_recv(&cx).is_pending());

        // Found empty, then sent to: the waker registered by that poll is woken.
        assert!(tx.send(3));
        assert_eq!(woken.0.load(Ordering::SeqCst), 3);
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(Some(3)));

        // A value queued without its ring (a sender between its send and its ring) is read
        // with the ring that follows, not lost.
        assert!(rx.poll_recv(&cx).is_pending());
        tx.tx.send(4).expect("open");
        assert!(rx.poll_recv(&cx).is_pending());
        bell.ring(EVENTS);
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(Some(4)));
        assert!(rx.poll_recv(&cx).is_pending());

        // A reader answering several bits at once: what rang, read with `try_next`; none
        // read for a bit that did not ring.
        let (cmds_tx, mut cmds_rx) = unbounded::<u32>(&bell, CMDS);
        assert!(cmds_tx.send(5) && tx.send(6));
        assert_eq!(bell.answer(&cx, CMDS | OUT), CMDS);
        assert_eq!(rx.try_next(), None, "not rung as far as this reader knows");
        cmds_rx.rung();
        assert_eq!(cmds_rx.try_next(), Some(Some(5)));
        assert_eq!(cmds_rx.try_next(), None);
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(Some(6)));

        drop(tx);
        bell.ring(EVENTS);
        assert_eq!(rx.poll_recv(&cx), Poll::Ready(None));
    }
}
