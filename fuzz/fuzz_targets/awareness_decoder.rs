//! Awareness updates from a client: `yrs::sync::AwarenessUpdate::decode_v1` behind the
//! server's count check (`counts::check_awareness`, what `decode_frame` does), then the room's
//! `AwarenessTable` (apply, remove a peer's states, encode the full state).
//!
//! The input is a sequence of awareness update payloads, each a varUint8Array (length, then
//! bytes) as in an awareness message, applied in turn by three peers. Besides "no panic", the
//! table is checked against a model of the y-protocols rules (a newer clock wins; an equal
//! clock with a `null` state removes; every peer may speak for every client id here, and a
//! state is kept as `stamp` makes it, without an identity): what `apply` reports as changed,
//! and what `full_state_frame` holds, which must decode back with `decode_frame`.
#![no_main]

use std::collections::HashMap;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use quire_server::counts;
use quire_server::protocol::{decode_frame, encode_awareness, Message};
use quire_server::room::awareness::{stamp, AwarenessTable, Sender};
use tokio::time::{Duration, Instant};
use yrs::encoding::read::{Cursor, Read};
use yrs::sync::AwarenessUpdate;
use yrs::updates::decoder::Decode;

/// The model: client id -> (clock, live state or `None` once removed, peer that set it).
type Model = HashMap<u64, (u32, Option<Arc<str>>, u64)>;

fn apply_model(model: &mut Model, update: &AwarenessUpdate, peer: u64) -> bool {
    let mut changed = false;
    for (client, entry) in &update.clients {
        let json = match &*entry.json {
            "null" => None,
            _ => match stamp(&entry.json, None) {
                Some(json) => Some(json),
                // A state the server cannot read back is dropped.
                None => continue,
            },
        };
        match model.get_mut(&client.get()) {
            Some((clock, state, owner)) => {
                let removes = *clock == entry.clock && json.is_none() && state.is_some();
                if *clock < entry.clock || removes {
                    *clock = entry.clock;
                    *state = json;
                    *owner = peer;
                    changed = true;
                }
            }
            None => {
                changed |= json.is_some();
                model.insert(client.get(), (entry.clock, json, peer));
            }
        }
    }
    changed
}

/// The table's full state must be the model's live states, encoded as one awareness message.
fn check_full_state(table: &mut AwarenessTable, model: &Model) {
    let live: HashMap<u64, (u32, Arc<str>)> = model
        .iter()
        .filter_map(|(id, (clock, json, _))| json.as_ref().map(|j| (*id, (*clock, j.clone()))))
        .collect();
    let Some(frame) = table.full_state_frame() else {
        assert!(live.is_empty(), "no full state, but live states: {live:?}");
        return;
    };
    let update = match decode_frame(&frame).as_deref() {
        Ok([Message::Awareness { update, .. }]) => update.clone(),
        other => panic!("the full state {frame:02x?} decodes as {other:?}"),
    };
    let got: HashMap<u64, (u32, Arc<str>)> = update
        .clients
        .iter()
        .map(|(id, e)| (id.get(), (e.clock, e.json.clone())))
        .collect();
    assert_eq!(got, live, "the full state differs from the live states");
}

fuzz_target!(|data: &[u8]| {
    let mut table = AwarenessTable::default();
    let mut model = Model::new();
    let now = Instant::now();
    let mut cursor = Cursor::new(data);
    let mut peers = 0u64;
    while let Ok(payload) = cursor.read_buf() {
        if counts::check_awareness(payload).is_err() {
            continue;
        }
        let Ok(update) = AwarenessUpdate::decode_v1(payload) else {
            continue;
        };
        // Three peers take turns; an update decoded from the input must encode to one that
        // decodes equal (the room relays the raw bytes, and re-encodes what it sends itself).
        let peer = 1 + peers % 3;
        peers += 1;
        match decode_frame(&encode_awareness(&update)).as_deref() {
            Ok([Message::Awareness { update: again, .. }]) => assert_eq!(again, &update),
            other => panic!("{update:?} re-encodes into a frame that decodes as {other:?}"),
        }
        let expected = apply_model(&mut model, &update, peer);
        // Anonymous peers whose owners count as closed: any of them may take any id, the
        // y-protocols rules the model follows.
        let from = Sender {
            peer,
            user: None,
            is_open: &|_| false,
            grace: Duration::ZERO,
            verified: None,
        };
        let changed = table.apply(&update, &from, now).relay.is_some();
        assert_eq!(changed, expected, "apply's result for {update:?}");
        check_full_state(&mut table, &model);
        // The same update again changes nothing.
        assert!(
            table.apply(&update, &from, now).relay.is_none(),
            "applying twice changed the table"
        );
        if peers > 64 {
            break;
        }
    }
    if peers == 0 {
        return;
    }
    // Peer 1 leaves: its live states are removed with a clock one higher, and a removal
    // decodes as an awareness message too.
    let removed = table.remove_peer(1, now);
    let owned: Vec<u64> = model
        .iter()
        .filter(|(_, (_, json, owner))| *owner == 1 && json.is_some())
        .map(|(id, _)| *id)
        .collect();
    match &removed {
        None => assert!(
            owned.is_empty(),
            "peer 1's states {owned:?} were not removed"
        ),
        Some(update) => {
            let mut ids: Vec<u64> = update.clients.keys().map(|c| c.get()).collect();
            ids.sort_unstable();
            let mut expected = owned.clone();
            expected.sort_unstable();
            assert_eq!(ids, expected, "remove_peer removed other states");
            for (client, entry) in &update.clients {
                let (clock, _, _) = model[&client.get()];
                assert_eq!(entry.clock, clock.wrapping_add(1));
                assert_eq!(&*entry.json, "null");
            }
            match decode_frame(&encode_awareness(update)).as_deref() {
                Ok([Message::Awareness { .. }]) => {}
                other => panic!("a removal decodes as {other:?}"),
            }
        }
    }
    for id in owned {
        if let Some(entry) = model.get_mut(&id) {
            entry.0 = entry.0.wrapping_add(1);
            entry.1 = None;
        }
    }
    check_full_state(&mut table, &model);
});
