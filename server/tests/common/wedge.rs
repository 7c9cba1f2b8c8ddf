//! Updates that do not integrate, as an attacker sends them (docs/durability.md).

use yrs::updates::encoder::Encode;
use yrs::{ClientID, Doc, IdSet, ReadTxn, Text, Transact, Update, ID};

/// Client `client`'s two edits of the text ("FIRST", then "SECOND" after it), as two
/// updates: an attacker sends only the second, which depends on the first.
pub fn ahead_pair(client: u64) -> (Vec<u8>, Vec<u8>) {
    let d = Doc::with_client_id(client);
    let t = d.get_or_insert_text("text");
    let s0 = d.transact().state_vector();
    t.insert(&mut d.transact_mut(), 0, "FIRST");
    let s1 = d.transact().state_vector();
    t.insert(&mut d.transact_mut(), 5, "SECOND");
    let first = d.transact().encode_state_as_update_v1(&s0);
    let second = d.transact().encode_state_as_update_v1(&s1);
    (first, second)
}

/// An update that only deletes `client`'s clocks `from..from + len`.
pub fn deletes_only(client: u64, from: u32, len: u32) -> Vec<u8> {
    let mut ds = IdSet::new();
    ds.insert(ID::new(ClientID::new(client), from), len);
    let mut u = Update::new();
    u.set_delete_set(ds);
    u.encode_v1()
}
