//! A document of many items, most of them deleted, as documents edited for months are: the
//! editing trace replayed many times, each replay typed by a client of its own (Yjs gives
//! every session a new client id) without seeing the others, and the text of all but every
//! `keep_every`-th replay deleted once typed. A replay is about 8,000 items (structs, as a
//! loader reads them; a kept one 11,000): 1,250 replays make a document of about 10 million.
//!
//! Replays are typed in independent documents and merge as concurrent inserts at the start of
//! the text. Their client ids descend, so each merged replay lands before the earlier ones
//! after one comparison (with ascending ids every integration would walk past every earlier
//! item: quadratic). Typing the trace takes yrs about 2 s, so it is typed twice (a kept and a
//! deleted replay) and every replay is one of the two with its client id rewritten: the same
//! bytes as that client typing it ([`with_client`]).

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use yrs::{Doc, ReadTxn, Text, Transact};

use crate::Trace;

/// The client id of the first replay; replay `r` is `FIRST_CLIENT - r`.
const FIRST_CLIENT: u64 = 1 << 44;

/// The updates of a many-item document, one per replay (each the whole state of its replay's
/// document), and how many items they hold.
pub struct ItemsDoc {
    pub updates: Vec<Vec<u8>>,
    pub items: u64,
}

/// The structs a Yjs v1 update declares (each client's count comes first in its section).
pub fn structs_in(update: &[u8]) -> u64 {
    let mut r = Reader { buf: update, at: 0 };
    // One client per replay's update: the count of its structs follows the count of clients.
    match (r.var(), r.var()) {
        (Some(1), Some(n)) => n,
        _ => 0,
    }
}

/// A Yjs v1 update of one client's structs (strings, deleted content, garbage-collected
/// ranges) with every occurrence of that client's id (its section, origins, parents, delete
/// set) replaced by `client`. `None` for anything else: several clients, other content.
pub fn with_client(update: &[u8], client: u64) -> Option<Vec<u8>> {
    let mut r = Reader { buf: update, at: 0 };
    let mut out = Vec::with_capacity(update.len() + 8);
    if r.var()? != 1 {
        return None;
    }
    put_var(&mut out, 1);
    let structs = r.var()?;
    let own = r.var()?;
    let clock = r.var()?;
    put_var(&mut out, structs);
    put_var(&mut out, client);
    put_var(&mut out, clock);
    // An id: the client, rewritten when it is the update's own, and the clock.
    let id = |r: &mut Reader, out: &mut Vec<u8>| -> Option<()> {
        let c = r.var()?;
        put_var(out, if c == own { client } else { c });
        put_var(out, r.var()?);
        Some(())
    };
    for _ in 0..structs {
        let info = r.byte()?;
        out.push(info);
        match info & 0x1f {
            // A garbage-collected range, or a skip: its length.
            0 | 10 => put_var(&mut out, r.var()?),
            content => {
                if info & 0x80 != 0 {
                    id(&mut r, &mut out)?;
                }
                if info & 0x40 != 0 {
                    id(&mut r, &mut out)?;
                }
                if info & 0xc0 == 0 {
                    // The parent: a root type's name, or an item's id.
                    let named = r.var()?;
                    put_var(&mut out, named);
                    if named == 1 {
                        r.copy_bytes(&mut out)?;
                    } else {
                        id(&mut r, &mut out)?;
                    }
                    if info & 0x20 != 0 {
                        r.copy_bytes(&mut out)?;
                    }
                }
                match content {
                    // Deleted content: its length.
                    1 => put_var(&mut out, r.var()?),
                    // A string.
                    4 => r.copy_bytes(&mut out)?,
                    _ => return None,
                }
            }
        }
    }
    // The delete set.
    let clients = r.var()?;
    put_var(&mut out, clients);
    for _ in 0..clients {
        let c = r.var()?;
        put_var(&mut out, if c == own { client } else { c });
        let ranges = r.var()?;
        put_var(&mut out, ranges);
        for _ in 0..ranges * 2 {
            put_var(&mut out, r.var()?);
        }
    }
    (r.at == update.len()).then_some(out)
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.buf.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn var(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// A length-prefixed byte string, copied as it is.
    fn copy_bytes(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let len = usize::try_from(self.var()?).ok()?;
        let bytes = self.buf.get(self.at..self.at.checked_add(len)?)?;
        put_var(out, len as u64);
        out.extend_from_slice(bytes);
        self.at += len;
        Some(())
    }
}

fn put_var(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// One replay of the trace by `client`, deleted whole unless `keep`.
fn replay(trace: &Trace, client: u64, keep: bool) -> Vec<u8> {
    let doc = Doc::with_client_id(client);
    let text = doc.get_or_insert_text("text");
    for (pos, del, ins) in &trace.edits {
        let mut txn = doc.transact_mut();
        if *del > 0 {
            text.remove_range(&mut txn, *pos, *del);
        }
        if !ins.is_empty() {
            text.insert(&mut txn, *pos, ins);
        }
    }
    if !keep {
        let mut txn = doc.transact_mut();
        let len = text.len(&txn);
        text.remove_range(&mut txn, 0, len);
    }
    let txn = doc.transact();
    txn.encode_state_as_update_v1(&yrs::StateVector::default())
}

/// The document of `replays` replays, keeping every `keep_every`-th replay's text. Cached in
/// `cache` (a rewrite is cheap, typing the trace is not): the same file for every server and run.
pub fn trace_replays(
    trace: &Trace,
    replays: usize,
    keep_every: usize,
    cache: &Path,
) -> anyhow::Result<ItemsDoc> {
    let updates = match read_cache(cache) {
        Some(updates) if updates.len() == replays => updates,
        _ => {
            let kept = replay(trace, FIRST_CLIENT, true);
            let deleted = replay(trace, FIRST_CLIENT, false);
            let updates = (0..replays)
                .map(|r| {
                    let keep = keep_every > 0 && r.is_multiple_of(keep_every);
                    let template = if keep { &kept } else { &deleted };
                    with_client(template, FIRST_CLIENT - r as u64)
                        .context("a replay's update has content the rewrite does not know")
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            // The rewrite checked once on the real trace: a replay typed by its own client.
            if let Some(last) = updates.last() {
                let r = replays - 1;
                let keep = keep_every > 0 && r.is_multiple_of(keep_every);
                anyhow::ensure!(
                    *last == replay(trace, FIRST_CLIENT - r as u64, keep),
                    "a rewritten replay differs from its client typing it"
                );
            }
            write_cache(cache, &updates).with_context(|| format!("write {}", cache.display()))?;
            updates
        }
    };
    let items = updates.iter().map(|u| structs_in(u)).sum();
    Ok(ItemsDoc { updates, items })
}

fn read_cache(path: &Path) -> Option<Vec<Vec<u8>>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .read_to_end(&mut bytes)
        .ok()?;
    let mut updates = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize;
        updates.push(bytes.get(at + 4..at + 4 + len)?.to_vec());
        at += 4 + len;
    }
    Some(updates)
}

fn write_cache(path: &Path, updates: &[Vec<u8>]) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    for u in updates {
        file.write_all(&u32::try_from(u.len())?.to_le_bytes())?;
        file.write_all(u)?;
    }
    file.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::GetString;

    /// Replays merge as concurrent inserts at the start: the kept replays' texts, the latest
    /// first, and the struct count read from the header is the number of structs.
    #[test]
    fn replays_merge_into_the_kept_texts_and_their_structs_are_counted() {
        let trace = Trace {
            edits: vec![
                (0, 0, "hello".into()),
                (5, 0, " world".into()),
                (0, 1, "H".into()),
            ],
            final_text: "Hello world".into(),
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = dir.path().join("items.bin");
        let doc = trace_replays(&trace, 5, 2, &cache).expect("replays");
        assert_eq!(doc.updates.len(), 5);
        // Every replay: "hello", " world", "H" and the deleted "h" are four structs.
        assert!(doc.items >= 5 * 3, "{}", doc.items);
        let merged = Doc::new();
        let text = merged.get_or_insert_text("text");
        for u in &doc.updates {
            let u = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u).expect("decodes");
            merged.transact_mut().apply_update(u).expect("applies");
        }
        // Replays 0, 2 and 4 kept, the latest first.
        assert_eq!(text.get_string(&merged.transact()), "Hello world".repeat(3));
        // A rewritten replay is what its client typing it would have sent.
        for (r, keep) in [(1, false), (2, true)] {
            assert_eq!(
                doc.updates[r],
                replay(&trace, FIRST_CLIENT - r as u64, keep),
                "replay {r}"
            );
        }
        // The cache gives the same updates back.
        let again = trace_replays(&trace, 5, 2, &cache).expect("cached");
        assert_eq!(again.updates, doc.updates);
    }
}
