//! One direction of a relayed connection's numbered messages, handed on strictly in order.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::REORDER_WINDOW;

/// Hands on one direction of a relayed connection's numbered messages strictly in order.
#[derive(Debug)]
pub struct InOrder {
    next: u64,
    held: BTreeMap<u64, Bytes>,
    /// The number an earlier `check_sent` found missing.
    suspect: Option<u64>,
}

/// A message was lost: the relayed connection must be closed.
#[derive(Debug, PartialEq, Eq)]
pub struct Gap;

/// What one numbered message gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// These messages, in order, are next (one, or several once a missing one arrived).
    Ready(Released),
    /// Ahead of a missing one: held until it arrives.
    Held,
    /// Seen before: ignored.
    Duplicate,
}

/// The messages one arrival hands on, in order: the one that arrived, then those it released
/// (none, usually: no allocation for a message that came in order).
#[derive(Debug, PartialEq, Eq)]
pub struct Released {
    first: Bytes,
    then: Vec<Bytes>,
}

impl IntoIterator for Released {
    type Item = Bytes;
    type IntoIter = std::iter::Chain<std::iter::Once<Bytes>, std::vec::IntoIter<Bytes>>;

    fn into_iter(self) -> Self::IntoIter {
        std::iter::once(self.first).chain(self.then)
    }
}

impl Default for InOrder {
    fn default() -> Self {
        InOrder {
            next: 1,
            held: BTreeMap::new(),
            suspect: None,
        }
    }
}

impl InOrder {
    pub fn push(&mut self, seq: u64, data: Bytes) -> Result<Arrival, Gap> {
        if seq < self.next || self.held.contains_key(&seq) {
            return Ok(Arrival::Duplicate);
        }
        if seq > self.next {
            if self.held.len() >= REORDER_WINDOW {
                return Err(Gap);
            }
            self.held.insert(seq, data);
            return Ok(Arrival::Held);
        }
        let mut then = Vec::new();
        self.next += 1;
        while let Some(d) = self.held.remove(&self.next) {
            then.push(d);
            self.next += 1;
        }
        Ok(Arrival::Ready(Released { first: data, then }))
    }

    /// The sender says it sent up to `sent`. A number up to it still missing at the next
    /// such report (a second later) is lost: the bus keeps one publisher's order, so it would
    /// have arrived before the report, and the second look lets a delayed or reordered
    /// message through.
    pub fn check_sent(&mut self, sent: u64) -> Result<(), Gap> {
        if sent < self.next {
            self.suspect = None;
            return Ok(());
        }
        if self.suspect == Some(self.next) {
            return Err(Gap);
        }
        self.suspect = Some(self.next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(n: u8) -> Bytes {
        Bytes::from(vec![n])
    }

    fn ready(frames: Vec<Bytes>) -> Result<Arrival, Gap> {
        let mut frames = frames.into_iter();
        let first = frames.next().unwrap_or_default();
        Ok(Arrival::Ready(Released {
            first,
            then: frames.collect(),
        }))
    }

    #[test]
    fn numbered_messages_come_out_in_order_once_and_a_hole_is_a_gap() {
        let mut order = InOrder::default();
        assert_eq!(order.push(1, b(1)), ready(vec![b(1)]));
        assert_eq!(order.check_sent(1), Ok(()));
        // Duplicated: ignored.
        assert_eq!(order.push(1, b(1)), Ok(Arrival::Duplicate));
        // Reordered: 3 waits for 2, then both come out in order.
        assert_eq!(order.push(3, b(3)), Ok(Arrival::Held));
        assert_eq!(order.push(3, b(3)), Ok(Arrival::Duplicate));
        // 2 is missing when the sender reports 3 sent: suspect, not yet lost (it may be late).
        assert_eq!(order.check_sent(3), Ok(()));
        assert_eq!(order.push(2, b(2)), ready(vec![b(2), b(3)]));
        assert_eq!(order.check_sent(3), Ok(()));
        // Lost, with nothing after it: the sender's count shows it at its second report.
        assert_eq!(order.check_sent(4), Ok(()));
        assert_eq!(order.check_sent(4), Err(Gap));
        let mut order = InOrder::default();
        assert_eq!(order.push(1, b(1)), ready(vec![b(1)]));
        // Lost, with more after it than the window holds.
        for seq in 5..5 + REORDER_WINDOW as u64 {
            assert_eq!(order.push(seq, b(0)), Ok(Arrival::Held));
        }
        assert_eq!(order.push(5 + REORDER_WINDOW as u64, b(0)), Err(Gap));
    }
}
