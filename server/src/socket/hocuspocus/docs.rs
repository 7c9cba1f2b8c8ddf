//! The socket's documents by address: open sessions, addresses waiting for their `Auth`
//! with the frames they sent meanwhile, and addresses closed. What waits for authentication
//! is bounded ([`HoldBounds`]): past a bound the socket is closed.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use tokio::time::{Duration, Instant};

use super::session::Session;

/// One address of the socket.
pub(super) enum DocState {
    /// Frames received before the address's `Auth`, held until it is answered.
    Held {
        frames: Vec<Bytes>,
        since: Instant,
    },
    Open(Session),
    /// Refused (`PermissionDenied`) or closed by the server (`Close`): the provider keeps
    /// sending its presence renewals and edits for it until it reconnects or attaches the
    /// document again, and those are dropped instead of held. A new `Auth` is a fresh attempt.
    Closed,
}

/// What one socket may hold before authentication (`hocuspocus_max_documents`,
/// `hocuspocus_pending_frames`, `hocuspocus_pending_bytes`).
#[derive(Debug, Clone, Copy)]
pub(super) struct HoldBounds {
    /// Addresses open or waiting for their `Auth`; also how many closed ones are remembered.
    pub documents: usize,
    /// Frames, and their bytes, held for addresses not yet authenticated.
    pub frames: usize,
    pub bytes: usize,
}

/// The socket's addresses.
pub(super) struct Docs {
    by_address: HashMap<String, DocState>,
    bounds: HoldBounds,
    held_frames: usize,
    held_bytes: usize,
    /// Closed addresses, oldest first (see [`Docs::tombstone`]).
    closed: VecDeque<String>,
}

/// Why a frame could not be held: the socket closes with this reason.
pub(super) const TOO_MANY_DOCUMENTS: &str = "too many documents on this connection";
pub(super) const TOO_MANY_FRAMES: &str = "too many frames before authentication";

impl Docs {
    pub(super) fn new(bounds: HoldBounds) -> Docs {
        Docs {
            by_address: HashMap::new(),
            bounds,
            held_frames: 0,
            held_bytes: 0,
            closed: VecDeque::new(),
        }
    }

    pub(super) fn get(&self, address: &str) -> Option<&DocState> {
        self.by_address.get(address)
    }

    pub(super) fn get_mut(&mut self, address: &str) -> Option<&mut DocState> {
        self.by_address.get_mut(address)
    }

    /// Whether another address may open: fewer than the bound are open or waiting.
    pub(super) fn has_room(&self) -> bool {
        self.live() < self.bounds.documents
    }

    /// Holds a frame of `address`, which has no session (yet); `Err` with the reason to
    /// close the socket when a bound would be crossed.
    pub(super) fn hold(
        &mut self,
        address: &str,
        data: Bytes,
        now: Instant,
    ) -> Result<(), &'static str> {
        if !self.by_address.contains_key(address) && !self.has_room() {
            return Err(TOO_MANY_DOCUMENTS);
        }
        if self.held_frames >= self.bounds.frames
            || self.held_bytes + data.len() > self.bounds.bytes
        {
            return Err(TOO_MANY_FRAMES);
        }
        self.held_frames += 1;
        self.held_bytes += data.len();
        let state = self
            .by_address
            .entry(address.to_owned())
            .or_insert_with(|| DocState::Held {
                frames: Vec::new(),
                since: now,
            });
        if let DocState::Held { frames, .. } = state {
            frames.push(data);
        }
        Ok(())
    }

    /// Frames held for addresses not yet authenticated.
    #[cfg(test)]
    pub(super) fn held_frames(&self) -> usize {
        self.held_frames
    }

    /// When the oldest held frames will have waited `timeout`.
    pub(super) fn held_deadline(&self, timeout: Duration) -> Option<Instant> {
        self.by_address
            .values()
            .filter_map(|d| match d {
                DocState::Held { since, .. } => Some(*since + timeout),
                _ => None,
            })
            .min()
    }

    /// Addresses open or waiting for their Auth (not the closed ones).
    pub(super) fn live(&self) -> usize {
        self.by_address
            .values()
            .filter(|d| !matches!(d, DocState::Closed))
            .count()
    }

    /// Removes `address`; the frames it held, if any, are no longer counted.
    pub(super) fn remove(&mut self, address: &str) -> Option<DocState> {
        let state = self.by_address.remove(address);
        if let Some(DocState::Held { frames, .. }) = &state {
            self.held_frames -= frames.len();
            self.held_bytes -= frames.iter().map(Bytes::len).sum::<usize>();
        }
        state
    }

    /// The session of `address`, replacing whatever it was.
    pub(super) fn open(&mut self, address: String, session: Session) {
        self.remove(&address);
        self.by_address.insert(address, DocState::Open(session));
    }

    /// Forgets `address`, remembering it as closed, so the frames the provider still sends
    /// for it are dropped; the oldest closed addresses are forgotten past the documents bound.
    pub(super) fn tombstone(&mut self, address: &str) {
        self.remove(address);
        self.by_address.insert(address.to_owned(), DocState::Closed);
        self.closed.push_back(address.to_owned());
        while self.closed.len() > self.bounds.documents {
            if let Some(old) = self.closed.pop_front() {
                if matches!(self.by_address.get(&old), Some(DocState::Closed)) {
                    self.by_address.remove(&old);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docs(documents: usize, frames: usize, bytes: usize) -> Docs {
        Docs::new(HoldBounds {
            documents,
            frames,
            bytes,
        })
    }

    fn frame(n: usize) -> Bytes {
        Bytes::from(vec![0u8; n])
    }

    #[test]
    fn frames_before_authentication_are_held_within_the_frame_and_byte_bounds() {
        let now = Instant::now();
        let mut d = docs(10, 3, 100);
        d.hold("a", frame(40), now).expect("first");
        d.hold("b", frame(40), now).expect("second");
        assert_eq!(d.hold("a", frame(21), now), Err(TOO_MANY_FRAMES), "bytes");
        d.hold("a", frame(20), now).expect("exactly the byte bound");
        assert_eq!(d.hold("c", frame(0), now), Err(TOO_MANY_FRAMES), "frames");
        assert_eq!(d.held_frames(), 3);
        // Removing an address gives its frames back to the bounds.
        let Some(DocState::Held { frames, .. }) = d.remove("a") else {
            panic!("a held frames");
        };
        assert_eq!(frames.len(), 2);
        assert_eq!(d.held_frames(), 1);
        d.hold("c", frame(60), now).expect("room again");
    }

    #[test]
    fn a_socket_holds_at_most_its_documents_bound_of_addresses() {
        let now = Instant::now();
        let mut d = docs(2, 100, 1 << 20);
        d.hold("a", frame(1), now).expect("a");
        d.hold("b", frame(1), now).expect("b");
        assert_eq!(d.hold("c", frame(1), now), Err(TOO_MANY_DOCUMENTS));
        // A known address may still hold more frames.
        d.hold("a", frame(1), now).expect("a again");
        assert!(!d.has_room());
        // A closed address does not count.
        d.tombstone("b");
        assert!(d.has_room());
        assert_eq!(d.live(), 1);
        d.hold("c", frame(1), now).expect("c after b closed");
    }

    #[test]
    fn the_oldest_held_address_sets_the_deadline() {
        let start = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut d = docs(10, 100, 1 << 20);
        assert_eq!(d.held_deadline(timeout), None);
        d.hold("late", frame(1), start + Duration::from_secs(3))
            .expect("late");
        d.hold("early", frame(1), start + Duration::from_secs(1))
            .expect("early");
        d.hold("late", frame(1), start + Duration::from_secs(5))
            .expect("late again");
        assert_eq!(
            d.held_deadline(timeout),
            Some(start + Duration::from_secs(11))
        );
        d.remove("early");
        assert_eq!(
            d.held_deadline(timeout),
            Some(start + Duration::from_secs(13)),
            "the address's first frame counts, not its last"
        );
    }

    #[test]
    fn closed_addresses_are_remembered_up_to_the_bound_and_drop_their_frames() {
        let now = Instant::now();
        let mut d = docs(2, 100, 1 << 20);
        d.hold("x", frame(10), now).expect("x");
        d.tombstone("x");
        assert_eq!(d.held_frames(), 0, "a closed address holds nothing");
        assert!(matches!(d.get("x"), Some(DocState::Closed)));
        d.tombstone("y");
        d.tombstone("z");
        assert!(
            d.get("x").is_none(),
            "the oldest closed address is forgotten"
        );
        assert!(matches!(d.get("y"), Some(DocState::Closed)));
        assert!(matches!(d.get("z"), Some(DocState::Closed)));
    }
}
