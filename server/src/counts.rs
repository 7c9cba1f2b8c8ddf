//! Declared counts checked against the bytes that are there, before yrs decodes a payload.
//!
//! yrs reserves room for a count as soon as it reads it (`HashMap::try_reserve` for the
//! clients of a state vector, an awareness update or an update, and for the entries of a map
//! in `Any` content): a count of 100 million in four bytes made it reserve gigabytes and write
//! a hash table's control bytes (about one byte per entry) for a 7-byte frame, before failing
//! for lack of entries (found by fuzzing, `fuzz/`). Every entry takes at least one byte, so a
//! count larger than the bytes left cannot be honest; these checks refuse such payloads first.
//! They also refuse `Any` values nested deeper than [`MAX_DEPTH`], which yrs decodes
//! recursively (a deep enough nesting would overflow its stack).
//!
//! The walk follows the Yjs v1 update encoding only as far as it needs to find counts; where
//! it meets a kind of content it does not walk (legacy JSON content, subdocuments, unknown
//! kinds), it stops and leaves the rest to yrs, whose own checks still apply: the aim is to
//! refuse impossible counts, never to refuse a payload yrs would accept.

use yrs::encoding::read::{Cursor, Read};

/// Deepest nesting of `Any` arrays and maps accepted in an update's content.
pub const MAX_DEPTH: usize = 64;

/// Why a payload was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CountError {
    #[error("a count of {count} at byte {at} with only {left} bytes left")]
    Impossible { at: usize, count: u64, left: usize },
    #[error("values nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("client id {0} has more than 53 bits")]
    ClientId(u64),
    #[error("a deleted range ends past clock 2^32")]
    ClockOverflow,
}

/// Where the walk stopped early without finding anything wrong (the rest is yrs's to judge).
struct Stop;

enum Fault {
    Count(CountError),
    Stop,
}

impl From<Stop> for Fault {
    fn from(_: Stop) -> Fault {
        Fault::Stop
    }
}

type Walk<T> = Result<T, Fault>;

struct Reader<'a> {
    cur: Cursor<'a>,
    len: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            cur: Cursor::new(buf),
            len: buf.len(),
        }
    }

    fn left(&self) -> usize {
        self.len.saturating_sub(self.cur.next)
    }

    fn var(&mut self) -> Walk<u64> {
        self.cur.read_var::<u64>().map_err(|_| Fault::Stop)
    }

    fn u8(&mut self) -> Walk<u8> {
        self.cur.read_u8().map_err(|_| Fault::Stop)
    }

    /// A count of entries that each take at least `per_entry` bytes.
    fn count(&mut self, per_entry: usize) -> Walk<u64> {
        let at = self.cur.next;
        let count = self.var()?;
        let left = self.left();
        if count.saturating_mul(per_entry as u64) > left as u64 {
            return Err(Fault::Count(CountError::Impossible { at, count, left }));
        }
        Ok(count)
    }

    /// Skips `n` bytes (a string's or a buffer's body).
    fn skip(&mut self, n: u64) -> Walk<()> {
        let n = usize::try_from(n).map_err(|_| Fault::Stop)?;
        if n > self.left() {
            return Err(Fault::Stop);
        }
        self.cur.next += n;
        Ok(())
    }

    /// A Yjs client id: at most 53 bits (JavaScript numbers; yrs asserts it in debug builds).
    fn client(&mut self) -> Walk<()> {
        let id = self.var()?;
        if id >> 53 != 0 {
            return Err(Fault::Count(CountError::ClientId(id)));
        }
        Ok(())
    }

    /// A length-prefixed string or buffer.
    fn bytes(&mut self) -> Walk<()> {
        let n = self.var()?;
        self.skip(n)
    }

    /// A signed lib0 varint.
    fn signed(&mut self) -> Walk<()> {
        while self.u8()? & 0x80 != 0 {}
        Ok(())
    }
}

fn finish(walk: Walk<()>) -> Result<(), CountError> {
    match walk {
        Ok(()) | Err(Fault::Stop) => Ok(()),
        Err(Fault::Count(e)) => Err(e),
    }
}

/// A v1 state vector: a count of (client, clock) pairs, two bytes each at least.
pub fn check_state_vector(payload: &[u8]) -> Result<(), CountError> {
    let r = &mut Reader::new(payload);
    finish((|| {
        for _ in 0..r.count(2)? {
            r.client()?;
            r.var()?;
        }
        Ok(())
    })())
}

/// An awareness update: a count of (client, clock, state) entries, three bytes each at least.
pub fn check_awareness(payload: &[u8]) -> Result<(), CountError> {
    let r = &mut Reader::new(payload);
    finish((|| {
        for _ in 0..r.count(3)? {
            r.client()?;
            r.var()?;
            r.bytes()?;
        }
        Ok(())
    })())
}

/// A Yjs v1 update: the number of clients, each client's number of blocks, and the counts in
/// `Any` content.
pub fn check_update(payload: &[u8]) -> Result<(), CountError> {
    finish(walk_update(&mut Reader::new(payload)))
}

fn walk_update(r: &mut Reader<'_>) -> Walk<()> {
    // Per client: the number of blocks, the client id and the first clock.
    let clients = r.count(3)?;
    for _ in 0..clients {
        let blocks = r.count(1)?;
        r.client()?;
        r.var()?; // clock
        for _ in 0..blocks {
            walk_block(r)?;
        }
    }
    // The delete set: per client, its ranges (clock and length).
    for _ in 0..r.count(2)? {
        r.client()?;
        for _ in 0..r.count(2)? {
            // yrs adds the two as u32 (a debug-build panic past u32::MAX; found by fuzzing).
            let (clock, len) = (r.var()?, r.var()?);
            if clock.saturating_add(len) > u64::from(u32::MAX) {
                return Err(Fault::Count(CountError::ClockOverflow));
            }
        }
    }
    Ok(())
}

const HAS_ORIGIN: u8 = 0b1000_0000;
const HAS_RIGHT_ORIGIN: u8 = 0b0100_0000;
const HAS_PARENT_SUB: u8 = 0b0010_0000;
const GC: u8 = 0;
const SKIP: u8 = 10;

fn walk_block(r: &mut Reader<'_>) -> Walk<()> {
    let info = r.u8()?;
    // yrs tells GC and skip blocks by the whole info byte (flags included), like Yjs.
    if let GC | SKIP = info {
        r.var()?; // length
        return Ok(());
    }
    if info & HAS_ORIGIN != 0 {
        r.client()?;
        r.var()?;
    }
    if info & HAS_RIGHT_ORIGIN != 0 {
        r.client()?;
        r.var()?;
    }
    if info & (HAS_ORIGIN | HAS_RIGHT_ORIGIN) == 0 {
        // The parent: a root type's name, or the id of the item holding the type.
        if r.var()? == 1 {
            r.bytes()?;
        } else {
            r.client()?;
            r.var()?;
        }
        if info & HAS_PARENT_SUB != 0 {
            r.bytes()?;
        }
    }
    match info & 0b1111 {
        1 => r.var().map(drop),                  // deleted: a length
        3..=5 => r.bytes(),                      // binary, string, embed (JSON text)
        6 => r.bytes().and_then(|()| r.bytes()), // format: key and value
        7 => {
            // A type: its kind (one byte, as yrs reads it), and a name for XML elements only
            // (yrs reads none for hooks).
            match r.u8()? {
                3 => r.bytes(),
                0..=2 | 4..=6 | 9 | 15 => Ok(()),
                _ => Err(Stop.into()),
            }
        }
        8 => {
            // `Any` values: each takes at least its tag byte.
            let n = r.count(1)?;
            for _ in 0..n {
                walk_any(r, 0)?;
            }
            Ok(())
        }
        2 => {
            // Legacy JSON content: yrs reserves room for its count of strings first (found by
            // fuzzing: a Vec of 6 GB); each string takes at least its length byte. How many
            // strings yrs then reads is left to it.
            r.count(1)?;
            Err(Stop.into())
        }
        9 => {
            // A subdocument: its guid, then its options as an `Any` map.
            r.bytes()?;
            walk_any(r, 0)
        }
        // Anything else: left to yrs.
        _ => Err(Stop.into()),
    }
}

fn walk_any(r: &mut Reader<'_>, depth: usize) -> Walk<()> {
    if depth > MAX_DEPTH {
        return Err(Fault::Count(CountError::TooDeep));
    }
    match r.u8()? {
        127 | 126 | 121 | 120 => Ok(()), // undefined, null, false, true
        125 => r.signed(),               // integer
        124 => r.skip(4),                // float32
        123 | 122 => r.skip(8),          // float64, bigint
        119 | 116 => r.bytes(),          // string, buffer
        118 => {
            // A map: each entry is a key (at least its length byte) and a value (its tag).
            let n = r.count(2)?;
            for _ in 0..n {
                r.bytes()?;
                walk_any(r, depth + 1)?;
            }
            Ok(())
        }
        117 => {
            let n = r.count(1)?;
            for _ in 0..n {
                walk_any(r, depth + 1)?;
            }
            Ok(())
        }
        _ => Err(Stop.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use yrs::updates::encoder::Encode;
    use yrs::{Any, Array, Doc, Map, ReadTxn, Text, Transact};

    /// varUint 104,857,558 in four bytes.
    const HUGE: [u8; 4] = [0xd6, 0xff, 0xff, 0x31];

    #[test]
    fn impossible_counts_are_refused_before_yrs_sees_them() {
        assert!(check_state_vector(&HUGE).is_err());
        assert!(check_awareness(&HUGE).is_err());
        assert!(check_update(&HUGE).is_err());
        // One client whose block count is impossible.
        assert!(check_update(&[&[1][..], &HUGE].concat()).is_err());
        // A map in `Any` content declaring 100 million entries.
        let any_map = [&[1u8, 1, 7, 0, 0x08, 1, 1, b'm', 1, 118][..], &HUGE].concat();
        assert!(matches!(
            check_update(&any_map),
            Err(CountError::Impossible { .. })
        ));
    }

    #[test]
    fn legacy_json_content_and_subdocument_options_are_checked_too() {
        // One client, one block under root "m": JSON content (2) declaring 100 million strings.
        let json = [&[1u8, 1, 7, 0, 2, 1, 1, b'm'][..], &HUGE].concat();
        assert!(check_update(&json).is_err());
        // A subdocument (9): guid "g", options a map declaring 100 million entries.
        let doc = [&[1u8, 1, 7, 0, 9, 1, 1, b'm', 1, b'g', 118][..], &HUGE].concat();
        assert!(check_update(&doc).is_err());
    }

    /// Fuzz finding (CI smoke, frame_decoder): legacy JSON content after type blocks the walk
    /// read differently from yrs (a type's kind is one byte, and an XML hook has no name), so
    /// it lost its place before the JSON count and let a 6.4 GB reservation through.
    #[test]
    fn the_walk_reads_blocks_as_yrs_does() {
        let hex = "1316000000c49221070707070502200307ffffff7e0707070707070707070707070700000707\
                   070707070707070000076207070707076307c0070707079c989e966e00";
        let bytes: Vec<u8> = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0))
            .collect();
        assert!(check_update(&bytes).is_err());
    }

    #[test]
    fn deep_nesting_is_refused() {
        // One client, one block: a root "m", Any content of one array nested 100 deep.
        let mut u = vec![1u8, 1, 7, 0, 8, 1, 1, b'm', 1];
        u.extend(std::iter::repeat_n([117u8, 1], 100).flatten());
        u.push(126);
        assert_eq!(check_update(&u), Err(CountError::TooDeep));
    }

    #[test]
    fn real_updates_pass() {
        let doc = Doc::with_client_id(7);
        let text = doc.get_or_insert_text("t");
        let map = doc.get_or_insert_map("m");
        let array = doc.get_or_insert_array("a");
        let mut updates = Vec::new();
        for i in 0..20u32 {
            let mut txn = doc.transact_mut();
            text.insert(&mut txn, 0, &format!("a{i}é🙂"));
            map.insert(
                &mut txn,
                format!("k{i}"),
                Any::from(vec![Any::from(i as f64)]),
            );
            let nested: Any =
                serde_json::from_str(r#"{"a":[1,{"b":null}],"c":"x","d":true}"#).expect("json");
            array.push_back(&mut txn, nested);
            if i % 3 == 0 {
                text.remove_range(&mut txn, 0, 1);
            }
            updates.push(txn.encode_update_v1());
        }
        updates.push(
            doc.transact()
                .encode_state_as_update_v1(&Default::default()),
        );
        for u in &updates {
            assert_eq!(check_update(u), Ok(()), "{u:02x?}");
        }
        let sv = doc.transact().state_vector().encode_v1();
        assert_eq!(check_state_vector(&sv), Ok(()));
    }
}
