//! Answers that many peers ask for, encoded once per document version and shared.
//!
//! A Sync Step 2 for an empty state vector is the whole document; every joining client asks
//! for it, and a hostile one can ask for it thousands of times. The room keeps the last few
//! Step 2 frames it encoded, keyed by the state vector they answer, and the Step 1 it sends
//! joiners, until the document changes; each peer's queue then holds a reference to one
//! shared buffer instead of a copy. (The awareness table keeps its own encoded frame, see
//! [`super::awareness::AwarenessTable::full_state_frame`].)
//!
//! A large answer (at least [`LARGE_ANSWER_BYTES`]) is a second copy of the document beside
//! the room's `Doc`: it is held for [`LARGE_ANSWER_GRACE`] after it was last asked for (a
//! join storm, or one client asking again and again within its rate, is answered from one
//! encoding), and after that only as long as a peer's queue still holds it (a weak
//! reference), so a quiet large document does not keep its whole-state answer in memory
//! until its next change.

use std::sync::{Arc, Weak};

use bytes::Bytes;
use tokio::time::{Duration, Instant};
use yrs::{Doc, ReadTxn, StateVector, Transact};

use crate::metrics::Metrics;
use crate::protocol;

/// Distinct state vectors whose answers are kept (the empty one, which every new client
/// sends, and the few that clients reconnecting at the same version share).
const KEPT: usize = 4;
/// Longest state vector (in clients) whose answer is kept: a hostile Step 1 may carry
/// millions of entries, which are not kept beyond its answer.
const MAX_KEPT_CLIENTS: usize = 1024;
/// Answers at least this large are held only for [`LARGE_ANSWER_GRACE`] after their last use,
/// then only while a peer's queue holds them.
pub const LARGE_ANSWER_BYTES: usize = 256 * 1024;
/// How long a large answer is held after it was last asked for: longer than the pause the
/// sync-request rate allows between two requests of one connection (0.5 s).
pub const LARGE_ANSWER_GRACE: Duration = Duration::from_secs(2);

/// A frame shared through a reference count the room can hold weakly.
struct SharedFrame(Arc<Bytes>);

impl AsRef<[u8]> for SharedFrame {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

struct Kept {
    sv: StateVector,
    /// The frame, while the room holds it.
    frame: Option<Bytes>,
    /// A large frame's buffer, for as long as anyone holds it.
    weak: Option<Weak<Bytes>>,
    used: Instant,
}

impl Kept {
    /// The frame, held or still alive in a peer's queue.
    fn frame(&mut self, now: Instant) -> Option<Bytes> {
        if self.frame.is_none() {
            let arc = self.weak.as_ref()?.upgrade()?;
            self.frame = Some(Bytes::from_owner(SharedFrame(arc)));
        }
        self.used = now;
        self.frame.clone()
    }
}

#[derive(Default)]
pub struct SharedAnswers {
    /// Most recently used first.
    step2: Vec<Kept>,
    step1: Option<Bytes>,
}

impl SharedAnswers {
    /// The document changed: every kept answer is stale.
    pub fn invalidate(&mut self) {
        self.step2.clear();
        self.step1 = None;
    }

    /// The Sync Step 2 frame answering `sv`, encoded only if no kept answer fits.
    pub fn step2(&mut self, doc: &Doc, sv: &StateVector, metrics: &Metrics) -> Bytes {
        let now = Instant::now();
        if let Some(at) = self.step2.iter().position(|kept| kept.sv == *sv) {
            let mut entry = self.step2.remove(at);
            if let Some(frame) = entry.frame(now) {
                metrics.sync_answers_shared.inc();
                self.step2.insert(0, entry);
                return frame;
            }
        }
        metrics.sync_answers_encoded.inc();
        let frame = protocol::encode_step2(&doc.transact().encode_diff_v1(sv));
        if sv.len() > MAX_KEPT_CLIENTS {
            // A state vector this long is nobody's everyday one: not worth keeping in memory.
            return frame;
        }
        let (frame, weak) = if frame.len() >= LARGE_ANSWER_BYTES {
            let arc = Arc::new(frame);
            let weak = Arc::downgrade(&arc);
            (Bytes::from_owner(SharedFrame(arc)), Some(weak))
        } else {
            (frame, None)
        };
        self.step2.truncate(KEPT - 1);
        self.step2.insert(
            0,
            Kept {
                sv: sv.clone(),
                frame: Some(frame.clone()),
                weak,
                used: now,
            },
        );
        frame
    }

    /// When [`SharedAnswers::release`] has a large answer to let go of; `None` if it holds
    /// none.
    pub fn release_due(&self) -> Option<Instant> {
        self.step2
            .iter()
            .filter(|k| k.frame.is_some() && k.weak.is_some())
            .map(|k| k.used + LARGE_ANSWER_GRACE)
            .min()
    }

    /// Lets go of the large answers not asked for within [`LARGE_ANSWER_GRACE`] of `now`
    /// (peers' queues may still hold them, and share them meanwhile), and forgets the ones
    /// nobody holds any more.
    pub fn release(&mut self, now: Instant) {
        for kept in &mut self.step2 {
            if kept.weak.is_some() && now >= kept.used + LARGE_ANSWER_GRACE {
                kept.frame = None;
            }
        }
        self.step2
            .retain(|k| k.frame.is_some() || k.weak.as_ref().is_some_and(|w| w.strong_count() > 0));
    }

    /// The Sync Step 1 frame the room sends a joining peer (the document's state vector).
    pub fn step1(&mut self, doc: &Doc) -> Bytes {
        self.step1
            .get_or_insert_with(|| protocol::encode_step1(&doc.transact().state_vector()))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::{GetString, Text};

    #[test]
    fn an_answer_is_encoded_once_per_version_and_shared() {
        let doc = Doc::with_client_id(1);
        let text = doc.get_or_insert_text("t");
        text.insert(&mut doc.transact_mut(), 0, "hello");
        let metrics = Metrics::new();
        let mut answers = SharedAnswers::default();
        let empty = StateVector::default();
        let a = answers.step2(&doc, &empty, &metrics);
        let b = answers.step2(&doc, &empty, &metrics);
        // The same buffer, not a copy.
        assert_eq!(a.as_ptr(), b.as_ptr());
        assert_eq!(metrics.sync_answers_encoded.get(), 1);
        assert_eq!(metrics.sync_answers_shared.get(), 1);
        // A change makes it stale: the next answer holds the new text.
        text.insert(&mut doc.transact_mut(), 5, "!");
        answers.invalidate();
        let c = answers.step2(&doc, &empty, &metrics);
        assert_eq!(metrics.sync_answers_encoded.get(), 2);
        let msgs = protocol::decode_frame(&c).expect("frame");
        let protocol::Message::SyncStep2(update) = &msgs[0] else {
            panic!("not a step 2: {msgs:?}");
        };
        let fresh = Doc::new();
        {
            use yrs::updates::decoder::Decode;
            let u = yrs::Update::decode_v1(update).expect("update");
            fresh.transact_mut().apply_update(u).expect("apply");
        }
        let t = fresh.get_or_insert_text("t");
        assert_eq!(t.get_string(&fresh.transact()), "hello!");
    }

    #[test]
    fn only_a_few_state_vectors_are_kept() {
        let doc = Doc::with_client_id(1);
        let metrics = Metrics::new();
        let mut answers = SharedAnswers::default();
        let svs: Vec<StateVector> = (0..KEPT as u32 + 1)
            .map(|n| {
                let mut sv = StateVector::default();
                sv.set_max(yrs::ClientID::new(99), n + 1);
                sv
            })
            .collect();
        for sv in &svs {
            answers.step2(&doc, sv, &metrics);
        }
        assert_eq!(answers.step2.len(), KEPT);
        // The oldest was dropped; the newest are shared.
        answers.step2(&doc, &svs[KEPT], &metrics);
        assert_eq!(metrics.sync_answers_shared.get(), 1);
        answers.step2(&doc, &svs[0], &metrics);
        assert_eq!(metrics.sync_answers_encoded.get(), KEPT as u64 + 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_answer_is_let_go_after_its_grace_and_shared_while_a_queue_holds_it() {
        let doc = Doc::with_client_id(1);
        let text = doc.get_or_insert_text("t");
        text.insert(&mut doc.transact_mut(), 0, &"x".repeat(LARGE_ANSWER_BYTES));
        let metrics = Metrics::new();
        let mut answers = SharedAnswers::default();
        let empty = StateVector::default();
        let first = answers.step2(&doc, &empty, &metrics);
        assert!(first.len() >= LARGE_ANSWER_BYTES);
        let due = answers.release_due().expect("a large answer is held");
        // Asked again within the grace: shared, and held longer.
        tokio::time::advance(LARGE_ANSWER_GRACE / 2).await;
        let again = answers.step2(&doc, &empty, &metrics);
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert!(answers.release_due().expect("held") > due);
        // Past the grace the room lets go; a queue still holding it keeps it shared.
        tokio::time::advance(LARGE_ANSWER_GRACE).await;
        answers.release(Instant::now());
        assert!(answers.release_due().is_none(), "not held by the room");
        drop(again);
        let queued = first;
        let shared = answers.step2(&doc, &empty, &metrics);
        assert_eq!(
            queued.as_ptr(),
            shared.as_ptr(),
            "shared from the queue's reference"
        );
        assert_eq!(metrics.sync_answers_encoded.get(), 1);
        // Nobody holds it any more: the next ask encodes it again.
        tokio::time::advance(LARGE_ANSWER_GRACE).await;
        answers.release(Instant::now());
        drop((queued, shared));
        answers.release(Instant::now());
        assert!(answers.step2.is_empty(), "forgotten");
        let fresh = answers.step2(&doc, &empty, &metrics);
        assert_eq!(metrics.sync_answers_encoded.get(), 2);
        assert!(fresh.len() >= LARGE_ANSWER_BYTES);
        // A small answer is held until the document changes, whatever the time.
        let small = Doc::with_client_id(2);
        small
            .get_or_insert_text("t")
            .insert(&mut small.transact_mut(), 0, "hi");
        let mut answers = SharedAnswers::default();
        answers.step2(&small, &empty, &metrics);
        assert!(answers.release_due().is_none());
        tokio::time::advance(LARGE_ANSWER_GRACE * 10).await;
        answers.release(Instant::now());
        assert_eq!(answers.step2.len(), 1);
    }
}
