//! Whether an update integrates completely into a document, as JavaScript Yjs integrates it,
//! before anything of it is applied.
//!
//! Yjs integrates a block only once everything it refers to is there: its client's earlier
//! clocks, its origin, its right origin and its parent item. A block that arrives ahead of
//! those is held back ("pending") until they come. yrs differs: since 0.27 it integrates a
//! block ahead of its client's earlier clocks and leaves a hole (y-crdt #632), so a server
//! applying such bytes would hold a document no browser holds. And a document holding a
//! pending update can no longer be encoded whole, which wedges every read, version and
//! snapshot. So nothing that does not integrate completely enters a document: [`plan`]
//! replays Yjs's integration order over the update's block ids alone (no document touched,
//! `O(blocks · log blocks)`), and [`admit`] also cuts deletions of clocks that neither the
//! document nor the update holds (a delete of what does not exist yet would otherwise wait in
//! the document and delete whatever its author types later).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use yrs::{ClientID, IdSet, ReadTxn, StateVector, Transact, Update, ID};

/// What [`admit`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// The update integrates completely; `cut`: the deletions of clocks nobody holds that
    /// were dropped from it (its bytes must be encoded again).
    Integrates { cut: Option<IdSet> },
    /// A block needs this id, which neither the document nor the update holds.
    Missing(ID),
}

/// The state the document reaches once `update` is integrated onto `sv`, or the first id a
/// block of it needs that neither holds.
pub fn plan(sv: &StateVector, update: &Update) -> Result<StateVector, ID> {
    let clients = update.block_deps();
    let mut state = Clocks {
        sv,
        moved: HashMap::new(),
    };
    // (yrs's state vector stops at a client's first hole, so an id past a hole a document an
    // earlier Quire stored still has counts as missing too.)
    let met = |state: &Clocks<'_>, dep: &ID| state.get(dep.client) > dep.clock;
    // Clients whose next block waits for a client's clock: (client waited on) -> min-heap of
    // (clock needed, index of the waiting client).
    let mut waiting: HashMap<ClientID, BinaryHeap<Reverse<(u32, usize)>>> = HashMap::new();
    let mut next = vec![0usize; clients.len()];
    let mut ready: Vec<usize> = (0..clients.len()).collect();
    while let Some(ci) = ready.pop() {
        let (client, blocks) = &clients[ci];
        while let Some(block) = blocks.get(next[ci]) {
            if block.skip {
                // Not carried: whatever follows it starts past it, and needs what it skips.
                next[ci] += 1;
                continue;
            }
            // Its client's earlier clocks first (no holes), then what it refers to.
            let earlier = block
                .id
                .clock
                .checked_sub(1)
                .map(|clock| ID::new(*client, clock));
            let unmet = earlier
                .into_iter()
                .chain(block.deps.iter().flatten().copied())
                .find(|dep| !met(&state, dep));
            // An item refers only to items created before it: one of its own client's at or
            // after its first clock (its own range) is bytes no Yjs client writes, which yrs may
            // not survive integrating. It never integrates.
            if block
                .deps
                .iter()
                .flatten()
                .any(|dep| dep.client == *client && dep.clock >= block.id.clock)
            {
                return Err(ID::new(*client, u32::MAX));
            }
            if let Some(dep) = unmet {
                waiting
                    .entry(dep.client)
                    .or_default()
                    .push(Reverse((dep.clock, ci)));
                break;
            }
            let Some(end) = block.id.clock.checked_add(block.len) else {
                // Past the last clock: it can never integrate.
                return Err(ID::new(*client, u32::MAX));
            };
            next[ci] += 1;
            if end > state.get(*client) {
                state.moved.insert(*client, end);
                if let Some(heap) = waiting.get_mut(client) {
                    while let Some(Reverse((clock, waiter))) = heap.peek().copied() {
                        if clock >= end {
                            break;
                        }
                        heap.pop();
                        ready.push(waiter);
                    }
                }
            }
        }
    }
    // Stuck: name a dependency nobody in the update can bring (a root), so that whoever waits
    // for it is woken when it arrives; one another stuck block of the update would bring is no
    // use to wait for.
    let unmet_of = |ci: usize| -> Option<ID> {
        let (client, blocks) = &clients[ci];
        let block = blocks[next[ci]..].iter().find(|b| !b.skip)?;
        let have = state.get(*client);
        if block.id.clock > have {
            return Some(ID::new(*client, have));
        }
        let earlier = block.id.clock.checked_sub(1).map(|c| ID::new(*client, c));
        earlier
            .into_iter()
            .chain(block.deps.iter().flatten().copied())
            .find(|dep| !met(&state, dep))
            .or(Some(block.id))
    };
    // Whether a stuck block of the update covers `id`.
    let carried = |id: &ID| {
        clients.iter().enumerate().any(|(ci, (client, blocks))| {
            *client == id.client
                && blocks[next[ci]..].iter().any(|b| {
                    !b.skip && b.id.clock <= id.clock && id.clock < b.id.clock.saturating_add(b.len)
                })
        })
    };
    let mut first = None;
    for ci in 0..clients.len() {
        if let Some(dep) = unmet_of(ci) {
            if !carried(&dep) {
                return Err(dep);
            }
            first.get_or_insert(dep);
        }
    }
    if let Some(dep) = first {
        // Every stuck block waits for another stuck block: a cycle, which nothing completes.
        return Err(dep);
    }
    let mut reached = sv.clone();
    for (client, clock) in state.moved {
        reached.set_max(client, clock);
    }
    Ok(reached)
}

/// What to wait for before trying an update [`plan`] found `missing` for again, onto a
/// document at `sv`: `missing` itself, or, if the document already holds it (an update whose
/// blocks refer to themselves or otherwise can never integrate), an id that never arrives, so
/// that nothing retries it in a loop.
pub fn wait_for(sv: &StateVector, missing: ID) -> ID {
    if sv.get(&missing.client) > missing.clock {
        ID::new(missing.client, u32::MAX)
    } else {
        missing
    }
}

/// Whether `update` integrates completely onto a document at `sv`; if it does, deletions of
/// clocks it would still not hold are cut from it.
pub fn admit(sv: &StateVector, update: &mut Update) -> Admission {
    let reached = match plan(sv, update) {
        Ok(reached) => reached,
        Err(missing) => return Admission::Missing(missing),
    };
    let deletes = update.delete_set();
    let beyond = deletes.iter().any(|(client, ranges)| {
        let have = reached.get(client);
        ranges.iter().any(|r| r.end > have)
    });
    if !beyond {
        return Admission::Integrates { cut: None };
    }
    let mut held = IdSet::new();
    for client in deletes.client_ids() {
        let have = reached.get(&client);
        if have > 0 {
            held.insert(ID::new(client, 0), have);
        }
    }
    let kept = deletes.intersect(&held);
    let dropped = deletes.diff(&held);
    update.set_delete_set(kept);
    Admission::Integrates { cut: Some(dropped) }
}

/// Whether `doc` already holds everything `update` carries: its blocks and its deletions.
pub fn contained(doc: &yrs::Doc, update: &Update) -> bool {
    let txn = doc.transact();
    let have = txn.state_vector();
    // Every block's range, wherever it starts (`Update::state_vector` counts only clients
    // whose blocks start at clock 0, so it misses an ordinary incremental update).
    let blocks_in = update.insertions(true).iter().all(|(client, ranges)| {
        let clock = have.get(client);
        ranges.iter().all(|range| range.end <= clock)
    });
    if !blocks_in {
        return false;
    }
    if update.delete_set().is_empty() {
        return true;
    }
    update
        .delete_set()
        .diff(&txn.snapshot().delete_set)
        .is_empty()
}

/// A state vector and the clocks the planned integration moved.
struct Clocks<'a> {
    sv: &'a StateVector,
    moved: HashMap<ClientID, u32>,
}

impl Clocks<'_> {
    fn get(&self, client: ClientID) -> u32 {
        self.moved
            .get(&client)
            .copied()
            .unwrap_or_else(|| self.sv.get(&client))
    }
}

#[cfg(test)]
mod tests {
    use super::{admit, plan, Admission};
    use yrs::updates::decoder::Decode;
    use yrs::updates::encoder::Encode;
    use yrs::{ClientID, Doc, GetString, ReadTxn, StateVector, Text, Transact, Update, ID};

    fn c(id: u64) -> ClientID {
        ClientID::new(id)
    }

    fn since(doc: &Doc, sv: &StateVector) -> Update {
        Update::decode_v1(&doc.transact().encode_state_as_update_v1(sv)).expect("decodes")
    }

    fn sv(doc: &Doc) -> StateVector {
        doc.transact().state_vector()
    }

    /// Two edits of client 1 as two updates; and a document at the state before both.
    fn two_edits() -> (Doc, Update, Update) {
        let a = Doc::with_client_id(1);
        let text = a.get_or_insert_text("t");
        let s0 = sv(&a);
        text.insert(&mut a.transact_mut(), 0, "first ");
        let s1 = sv(&a);
        text.insert(&mut a.transact_mut(), 6, "second");
        let first = since(&a, &s0);
        let second = since(&a, &s1);
        (Doc::with_client_id(9), first, second)
    }

    #[test]
    fn an_update_whose_clients_earlier_clocks_are_missing_does_not_integrate() {
        let (server, first, mut second) = two_edits();
        assert_eq!(
            admit(&sv(&server), &mut second),
            Admission::Missing(ID::new(c(1), 0))
        );
        let mut first = first;
        assert_eq!(
            admit(&sv(&server), &mut first),
            Admission::Integrates { cut: None }
        );
        server.transact_mut().apply_update(first).expect("applies");
        assert_eq!(
            admit(&sv(&server), &mut second),
            Admission::Integrates { cut: None }
        );
    }

    #[test]
    fn an_update_referring_to_another_clients_missing_item_does_not_integrate() {
        let a = Doc::with_client_id(1);
        let text = a.get_or_insert_text("t");
        text.insert(&mut a.transact_mut(), 0, "abc");
        let b = Doc::with_client_id(2);
        b.transact_mut()
            .apply_update(since(&a, &StateVector::default()))
            .expect("applies");
        let before = sv(&b);
        b.get_or_insert_text("t")
            .insert(&mut b.transact_mut(), 1, "X");
        // Client 2's first block, clock 0: its own clocks are complete, its origin is not.
        let mut edit = since(&b, &before);
        let server = Doc::with_client_id(9);
        assert_eq!(
            admit(&sv(&server), &mut edit),
            Admission::Missing(ID::new(c(1), 0))
        );
        // Together with what it refers to, in one update, in any order.
        let mut both = Update::merge_updates([since(&a, &StateVector::default()), edit]);
        assert_eq!(
            admit(&sv(&server), &mut both),
            Admission::Integrates { cut: None }
        );
    }

    #[test]
    fn deletions_of_clocks_nobody_holds_are_cut_and_the_rest_kept() {
        let a = Doc::with_client_id(1);
        let text = a.get_or_insert_text("t");
        text.insert(&mut a.transact_mut(), 0, "hello");
        let server = Doc::with_client_id(9);
        server
            .transact_mut()
            .apply_update(since(&a, &StateVector::default()))
            .expect("applies");
        // A delete set naming client 1's clocks 2..4 (held) and 4..1000, and client 7's
        // 0..10 (nobody's): as raw bytes, no structs.
        let mut ds = yrs::IdSet::new();
        ds.insert(ID::new(c(1), 2), 998);
        ds.insert(ID::new(c(7), 0), 10);
        let mut update = Update::new();
        update.set_delete_set(ds);
        let mut update = Update::decode_v1(&update.encode_v1()).expect("decodes");
        let mut dropped = yrs::IdSet::new();
        dropped.insert(ID::new(c(1), 5), 995);
        dropped.insert(ID::new(c(7), 0), 10);
        assert_eq!(
            admit(&sv(&server), &mut update),
            Admission::Integrates { cut: Some(dropped) }
        );
        server.transact_mut().apply_update(update).expect("applies");
        assert!(!server.transact().has_missing_updates(), "nothing pending");
        assert_eq!(
            server
                .get_or_insert_text("t")
                .get_string(&server.transact()),
            "he"
        );
        // The victim types on: its edits stay.
        let b = Doc::with_client_id(7);
        b.transact_mut()
            .apply_update(since(&server, &StateVector::default()))
            .expect("applies");
        let before = sv(&b);
        b.get_or_insert_text("t")
            .insert(&mut b.transact_mut(), 2, "y!");
        let mut typed = since(&b, &before);
        assert_eq!(
            admit(&sv(&server), &mut typed),
            Admission::Integrates { cut: None }
        );
        server.transact_mut().apply_update(typed).expect("applies");
        assert_eq!(
            server
                .get_or_insert_text("t")
                .get_string(&server.transact()),
            "hey!"
        );
    }

    #[test]
    fn a_chain_across_clients_merged_in_reverse_order_integrates() {
        // Three clients editing in turn: each update refers to the previous client's item.
        let docs: Vec<Doc> = (1..=3).map(Doc::with_client_id).collect();
        let mut updates = Vec::new();
        for round in 0..4 {
            for d in &docs {
                for other in &docs {
                    let u = since(other, &sv(d));
                    d.transact_mut().apply_update(u).expect("applies");
                }
                let before = sv(d);
                let t = d.get_or_insert_text("t");
                let len = t.len(&d.transact());
                t.insert(&mut d.transact_mut(), len, &format!("{round}"));
                updates.push(since(d, &before));
            }
        }
        updates.reverse();
        let mut all = Update::merge_updates(updates);
        let reached = plan(&StateVector::default(), &all).expect("integrates");
        assert_eq!(reached.get(&c(1)), 4);
        assert_eq!(
            admit(&StateVector::default(), &mut all),
            Admission::Integrates { cut: None }
        );
    }
}

#[cfg(test)]
mod cut_tests {
    use super::{admit, Admission};
    use yrs::updates::decoder::Decode;
    use yrs::updates::encoder::Encode;
    use yrs::{ClientID, IdSet, StateVector, Update, ID};

    #[test]
    fn deletions_of_a_client_nobody_has_seen_are_all_cut() {
        let mut ds = IdSet::new();
        ds.insert(ID::new(ClientID::new(3), 0), 100_000);
        let mut u = Update::new();
        u.set_delete_set(ds);
        let mut u = Update::decode_v1(&u.encode_v1()).expect("decodes");
        let mut sv = StateVector::default();
        sv.set_max(ClientID::new(1), 4);
        assert!(matches!(
            admit(&sv, &mut u),
            Admission::Integrates { cut: Some(_) }
        ));
        assert!(u.delete_set().is_empty(), "{:?}", u.delete_set());
        assert_eq!(u.encode_v1(), vec![0, 0]);
    }
}

#[cfg(test)]
mod root_tests {
    use super::plan;
    use yrs::updates::decoder::Decode;
    use yrs::{ClientID, Doc, ReadTxn, StateVector, Text, Transact, Update, ID};

    fn since(doc: &Doc, sv: &StateVector) -> Update {
        Update::decode_v1(&doc.transact().encode_state_as_update_v1(sv)).expect("decodes")
    }

    /// A waits on B's item, which the update carries; B waits on C's, which nobody sent: the
    /// update names C's (what must arrive), not B's (which it brings itself).
    #[test]
    fn a_stuck_update_names_what_must_arrive_not_what_it_carries() {
        let c = Doc::with_client_id(3);
        c.get_or_insert_text("t")
            .insert(&mut c.transact_mut(), 0, "c");
        let b = Doc::with_client_id(2);
        b.transact_mut()
            .apply_update(since(&c, &StateVector::default()))
            .expect("applies");
        let before_b = b.transact().state_vector();
        b.get_or_insert_text("t")
            .insert(&mut b.transact_mut(), 1, "b");
        let a = Doc::with_client_id(1);
        a.transact_mut()
            .apply_update(since(&b, &StateVector::default()))
            .expect("applies");
        let before_a = a.transact().state_vector();
        a.get_or_insert_text("t")
            .insert(&mut a.transact_mut(), 2, "a");
        for order in 0..2 {
            let parts = [since(&b, &before_b), since(&a, &before_a)];
            let parts: Vec<Update> = if order == 0 {
                parts.into_iter().collect()
            } else {
                parts.into_iter().rev().collect()
            };
            let both = Update::merge_updates(parts);
            assert_eq!(
                plan(&StateVector::default(), &both),
                Err(ID::new(ClientID::new(3), 0))
            );
        }
    }
}

#[cfg(test)]
mod contained_tests {
    use super::contained;
    use yrs::updates::decoder::Decode;
    use yrs::{Doc, ReadTxn, StateVector, Text, Transact, Update};

    fn update_since(doc: &Doc, sv: &StateVector) -> Update {
        let bytes = doc.transact().encode_state_as_update_v1(sv);
        Update::decode_v1(&bytes).expect("decodes")
    }

    #[test]
    fn only_updates_the_document_already_holds_count_as_contained() {
        let server = Doc::with_client_id(1);
        let text = server.get_or_insert_text("t");
        text.insert(&mut server.transact_mut(), 0, "hello world");
        text.remove_range(&mut server.transact_mut(), 0, 6);
        // A reader's Sync Step 2: everything it was sent, deletions included.
        let reader = Doc::with_client_id(2);
        reader
            .transact_mut()
            .apply_update(update_since(&server, &StateVector::default()))
            .expect("applies");
        let step2 = update_since(&reader, &server.transact().state_vector());
        assert!(contained(&server, &step2), "nothing new");
        // The reader's edits: its first, at clock 0, and its second, at clock 1 (an update
        // whose blocks do not start at clock 0).
        let rtext = reader.get_or_insert_text("t");
        let sv0 = reader.transact().state_vector();
        rtext.insert(&mut reader.transact_mut(), 0, "a");
        assert!(!contained(&server, &update_since(&reader, &sv0)));
        let sv1 = reader.transact().state_vector();
        rtext.insert(&mut reader.transact_mut(), 0, "b");
        let second = update_since(&reader, &sv1);
        assert!(!contained(&server, &second), "an edit past clock 0");
        // A deletion of text the server still has.
        let reader2 = Doc::with_client_id(3);
        reader2
            .transact_mut()
            .apply_update(update_since(&server, &StateVector::default()))
            .expect("applies");
        let sv = reader2.transact().state_vector();
        reader2
            .get_or_insert_text("t")
            .remove_range(&mut reader2.transact_mut(), 0, 1);
        assert!(
            !contained(&server, &update_since(&reader2, &sv)),
            "a new deletion"
        );
    }
}

#[cfg(test)]
mod self_reference {
    use super::plan;
    use yrs::updates::decoder::Decode;
    use yrs::{ClientID, StateVector, Update, ID};

    /// Fuzz finding (`room_update`, seed 1): a deleted block of client 1 over clocks 0..12721
    /// whose parent is its own clock 1. Onto a document holding client 1's first clocks it
    /// looked integrable, and the room hung applying it. An item refers only to earlier items.
    #[test]
    fn a_block_referring_to_its_own_range_never_integrates() {
        let u = Update::decode_v1(&[1, 1, 1, 0, 1, 0x84, 1, 1, 1, 0xb1, 0x63, 0]).expect("decodes");
        for clock in [0, 2, 5] {
            let mut sv = StateVector::default();
            sv.set_max(ClientID::new(1), clock);
            assert_eq!(plan(&sv, &u), Err(ID::new(ClientID::new(1), u32::MAX)));
        }
    }
}
