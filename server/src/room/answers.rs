//! Answers that many peers ask for, encoded once per document version and shared.
//!
//! A Sync Step 2 for an empty state vector is the whole document; every joining client asks
//! for it, and a hostile one can ask for it thousands of times. The room keeps the last few
//! Step 2 frames it encoded, keyed by the state vector they answer, and the Step 1 it sends
//! joiners, until the document changes; each peer's queue then holds a reference to one
//! shared buffer instead of a copy. (The awareness table keeps its own encoded frame, see
//! [`super::awareness::AwarenessTable::full_state_frame`].)

use bytes::Bytes;
use yrs::{Doc, ReadTxn, StateVector, Transact};

use crate::metrics::Metrics;
use crate::protocol;

/// Distinct state vectors whose answers are kept (the empty one, which every new client
/// sends, and the few that clients reconnecting at the same version share).
const KEPT: usize = 4;
/// Longest state vector (in clients) whose answer is kept: a hostile Step 1 may carry
/// millions of entries, which are not kept beyond its answer.
const MAX_KEPT_CLIENTS: usize = 1024;

#[derive(Default)]
pub struct SharedAnswers {
    /// Most recently used first.
    step2: Vec<(StateVector, Bytes)>,
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
        if let Some(at) = self.step2.iter().position(|(kept, _)| kept == sv) {
            metrics.sync_answers_shared.inc();
            let entry = self.step2.remove(at);
            let frame = entry.1.clone();
            self.step2.insert(0, entry);
            return frame;
        }
        metrics.sync_answers_encoded.inc();
        let frame = protocol::encode_step2(&doc.transact().encode_diff_v1(sv));
        if sv.len() > MAX_KEPT_CLIENTS {
            // A state vector this long is nobody's everyday one: not worth keeping in memory.
            return frame;
        }
        self.step2.truncate(KEPT - 1);
        self.step2.insert(0, (sv.clone(), frame.clone()));
        frame
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
}
