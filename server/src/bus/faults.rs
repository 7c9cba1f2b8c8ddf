//! Fault injection for the tests of the bus (drop, duplicate, delay, reorder, slow consumer).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{lock, Kind};

/// What a [`Faults`] plan does to one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Never published.
    Drop,
    /// Published twice.
    Duplicate,
    /// Published after this long (later messages overtake it).
    Delay(Duration),
    /// Published right after the next message (to any node).
    Reorder,
}

/// Fault injection for tests: messages of a kind that this node publishes are dropped,
/// duplicated, delayed or reordered, one at a time, as planned; and this node can be made a
/// slow consumer (a small subscription buffer, a pause before it reads the next message).
#[derive(Debug, Default)]
pub struct Faults {
    /// (action, kind, messages of that kind still to let through first)
    plan: Mutex<Vec<(FaultAction, Kind, usize)>>,
    /// A message held back by `Reorder`, and the node it is for (`None`: every node).
    pub(super) held: Mutex<Option<(Option<String>, super::Envelope)>>,
    applied: AtomicUsize,
    /// Messages each subscription buffers (0: the client library's default).
    pub(super) subscription_capacity: AtomicUsize,
    /// A pause before reading the next message, taken once.
    pub(super) inbox_pause: Mutex<Option<Duration>>,
    /// While set, every link of this node waits on it (until it is closed) before it
    /// publishes its next message.
    pub(super) link_gate: Mutex<Option<Arc<tokio::sync::Semaphore>>>,
}

impl Faults {
    /// Each of this node's subscriptions buffers `n` messages; NATS drops what arrives while
    /// they are full (a slow consumer). Set before the node starts.
    pub fn set_subscription_capacity(&self, n: usize) {
        self.subscription_capacity.store(n, Ordering::Relaxed);
    }

    /// This node stops reading the bus for `pause` when it next takes a message.
    pub fn pause_inbox_once(&self, pause: Duration) {
        *lock(&self.inbox_pause) = Some(pause);
    }

    /// This node's links hold their next message until [`release_links`](Self::release_links):
    /// whatever is sent to a node meanwhile travels in the same message.
    pub fn hold_links(&self) {
        *lock(&self.link_gate) = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }

    /// Lets the held links publish.
    pub fn release_links(&self) {
        if let Some(gate) = lock(&self.link_gate).take() {
            gate.close();
        }
    }

    /// Applies `action` to the message of `kind` after the next `skip` ones.
    pub fn arm(&self, action: FaultAction, kind: Kind, skip: usize) {
        lock(&self.plan).push((action, kind, skip));
    }

    /// Faults applied so far.
    pub fn applied(&self) -> usize {
        self.applied.load(Ordering::Relaxed)
    }

    pub(super) fn take(&self, kind: Kind) -> Option<FaultAction> {
        let mut plan = lock(&self.plan);
        let mut fire = None;
        // The first plan for this kind that is due fires; the others count this message.
        for (i, (action, k, skip)) in plan.iter_mut().enumerate() {
            if *k != kind {
                continue;
            }
            if *skip == 0 && fire.is_none() {
                fire = Some((i, *action));
            } else {
                *skip = skip.saturating_sub(1);
            }
        }
        let (i, action) = fire?;
        plan.remove(i);
        self.applied.fetch_add(1, Ordering::Relaxed);
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planned_faults_hit_the_nth_message_of_their_kind_once() {
        let faults = Faults::default();
        faults.arm(FaultAction::Drop, Kind::Frame, 1);
        faults.arm(FaultAction::Duplicate, Kind::Frame, 2);
        assert_eq!(faults.take(Kind::Out), None);
        assert_eq!(faults.take(Kind::Frame), None);
        assert_eq!(faults.take(Kind::Frame), Some(FaultAction::Drop));
        assert_eq!(faults.take(Kind::Frame), Some(FaultAction::Duplicate));
        assert_eq!(faults.take(Kind::Frame), None);
        assert_eq!(faults.applied(), 2);
    }
}
