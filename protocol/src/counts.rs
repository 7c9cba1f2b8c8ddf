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
//! The walk follows yrs 0.28's v1 update decoder byte for byte (every kind of content it can
//! decode, with the same integer widths), so that it stops only where yrs's decoder fails as
//! well: a walk that stopped early and left the rest to yrs would let yrs read counts nobody
//! checked (a fuzz finding: a walk that stopped at legacy JSON content let a block count
//! through that made yrs reserve 100 GB). `walk_update` says whether it reached the end. The
//! aim is to refuse impossible counts, never to refuse a payload yrs would accept; a yrs
//! upgrade should re-run the fuzz targets, which check that a stopped walk means a failed
//! decode.

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
    /// Bytes the entries declared by open containers still take at least: a new count is
    /// checked against the bytes left after those, so nested counts cannot each claim the
    /// whole rest of the payload (found in review: 65 nested maps, each declaring half of
    /// 16 MiB in entries, passed one by one).
    owed: u64,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader {
            cur: Cursor::new(buf),
            len: buf.len(),
            owed: 0,
        }
    }

    fn left(&self) -> usize {
        self.len.saturating_sub(self.cur.next)
    }

    fn var(&mut self) -> Walk<u64> {
        self.cur.read_var::<u64>().map_err(|_| Fault::Stop)
    }

    /// A varint read as yrs reads a `u32` (the same bytes as [`Reader::var`], its value
    /// wrapped: yrs reads lengths and parent flags this way).
    fn var32(&mut self) -> Walk<u32> {
        self.cur.read_var::<u32>().map_err(|_| Fault::Stop)
    }

    fn u8(&mut self) -> Walk<u8> {
        self.cur.read_u8().map_err(|_| Fault::Stop)
    }

    /// A count of entries that each take at least `per_entry` bytes, checked against the
    /// bytes left that no open container's entries are owed; each entry then starts with
    /// [`Reader::entry`].
    fn count(&mut self, per_entry: usize) -> Walk<u64> {
        let at = self.cur.next;
        let count = self.var()?;
        let free = (self.left() as u64).saturating_sub(self.owed);
        let need = count.saturating_mul(per_entry as u64);
        if need > free {
            let left = usize::try_from(free).unwrap_or(usize::MAX);
            return Err(Fault::Count(CountError::Impossible { at, count, left }));
        }
        self.owed += need;
        Ok(count)
    }

    /// An entry of a counted container begins: its least size is no longer owed (its bytes
    /// are about to be read).
    fn entry(&mut self, per_entry: usize) {
        self.owed = self.owed.saturating_sub(per_entry as u64);
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

    /// A length-prefixed string or buffer (its length a `u32`, as yrs reads it).
    fn bytes(&mut self) -> Walk<()> {
        let n = self.var32()?;
        self.skip(u64::from(n))
    }

    /// A signed lib0 varint.
    fn signed(&mut self) -> Walk<()> {
        while self.u8()? & 0x80 != 0 {}
        Ok(())
    }
}

fn finish(walk: Walk<()>) -> Result<(), CountError> {
    walked(walk).map(drop)
}

/// How far a walk that found nothing wrong went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walked {
    /// To the end of what yrs decodes.
    Whole,
    /// It stopped at something yrs's decoder refuses too (a truncated varint, a string longer
    /// than the payload, an unknown kind of content, type or value).
    Stopped,
}

fn walked(walk: Walk<()>) -> Result<Walked, CountError> {
    match walk {
        Ok(()) => Ok(Walked::Whole),
        Err(Fault::Stop) => Ok(Walked::Stopped),
        Err(Fault::Count(e)) => Err(e),
    }
}

/// A v1 state vector: a count of (client, clock) pairs, two bytes each at least.
pub fn check_state_vector(payload: &[u8]) -> Result<(), CountError> {
    let r = &mut Reader::new(payload);
    finish((|| {
        for _ in 0..r.count(2)? {
            r.entry(2);
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
            r.entry(3);
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

/// [`check_update`], saying whether the walk reached the end (the fuzz targets check that a
/// walk that stopped means an update yrs refuses).
pub fn walk_update_v1(payload: &[u8]) -> Result<Walked, CountError> {
    walked(walk_update(&mut Reader::new(payload)))
}

fn walk_update(r: &mut Reader<'_>) -> Walk<()> {
    // Per client: the number of blocks, the client id and the first clock.
    let clients = r.count(3)?;
    for _ in 0..clients {
        r.entry(3);
        let blocks = r.count(1)?;
        r.client()?;
        r.var()?; // clock
        for _ in 0..blocks {
            r.entry(1);
            walk_block(r)?;
        }
    }
    // The delete set: per client, its ranges (clock and length).
    for _ in 0..r.count(2)? {
        r.entry(2);
        r.client()?;
        for _ in 0..r.count(2)? {
            r.entry(2);
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
        // The parent: a root type's name, or the id of the item holding the type (yrs reads
        // the flag as a u32).
        if r.var32()? == 1 {
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
                // Weak links (7, behind yrs's `weak` feature, which Quire leaves off) and
                // unknown kinds: yrs refuses them too.
                _ => Err(Stop.into()),
            }
        }
        8 => {
            // `Any` values: each takes at least its tag byte.
            let n = r.count(1)?;
            for _ in 0..n {
                r.entry(1);
                walk_any(r, 0)?;
            }
            Ok(())
        }
        2 => {
            // Legacy JSON content: yrs reserves room for its count of strings first (found by
            // fuzzing: a Vec of 6 GB); each string takes at least its length byte. yrs 0.28
            // then reads one string more than the count (Yjs reads exactly the count).
            let n = r.count(1)?;
            for _ in 0..=n {
                r.entry(1);
                r.bytes()?;
            }
            Ok(())
        }
        9 => {
            // A subdocument: its guid, then its options as an `Any` map.
            r.bytes()?;
            walk_any(r, 0)
        }
        // Anything else (0 or 10 with flags, 11 to 15): yrs refuses it too.
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
                r.entry(2);
                r.bytes()?;
                walk_any(r, depth + 1)?;
            }
            Ok(())
        }
        117 => {
            let n = r.count(1)?;
            for _ in 0..n {
                r.entry(1);
                walk_any(r, depth + 1)?;
            }
            Ok(())
        }
        // An unknown tag: yrs refuses it too.
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

    /// Fuzz finding `fuzz/findings/frame_decoder-oom-b76a71c1` (frame_decoder, `-seed=1`): the
    /// walk stopped at legacy JSON content, and yrs then read a later client's block count
    /// unchecked and reserved about 100 GB for it. The frame: Sync Step 1, then Sync Step 2
    /// whose update is the one refused here.
    #[test]
    fn a_count_after_legacy_json_content_is_checked() {
        let frame = hex(
            "00000401 01a70200 01e3026d 00000000 00000002 02020202 02020202 02020202\
             02020202 02020202 02020202 02290202 02020202 fecefdfd fdc1fdfd 7f020202\
             02020202 02020202 1502636b 6177655b 5f797068 656e735d 7b75726c 7d0a5c75\
             73657061 636b6167 657b0202 02020202 02020202 02020202 02020202 ea020202\
             02020202 02020202 02290202 02020202 02310202 023e0202 7f020202 02020202\
             02020202 1502636b 6177655b 68797068 656e735d 7b75726c 7d0a5c75 73657061\
             636b6167 657b646f 697d0a5c 75739b99 61636b61 67657b68 79706572 7265667d\
             0a5c7573 65706163 6b616764 5b6e756d 62657273 2c736f72 745d7b6e 61746269\
             8101e001 018401e1 0112627d 0a5c6879 7068656e 6174696f 6e7b6461 8101f301\
             028401f5 01012d81 01f60101 8401f701 2f74612d 63656e2d 74657220 64612d74\
             612d6365 6e2d7465 72737d0a 5c667265 72737d0a 5c667265 6e636873 70616369\
             0101043b 01e10101 f40102f7 0101",
        );
        let msgs = crate::decode_frame(&frame.into()).expect("the frame decodes");
        let [_, crate::Message::SyncStep2(update)] = msgs.as_slice() else {
            panic!("expected Sync Step 1 and 2, got {msgs:?}");
        };
        assert!(
            matches!(check_update(update), Err(CountError::Impossible { .. })),
            "{:?}",
            check_update(update)
        );
    }

    /// Legacy JSON content as yrs 0.28 reads it (one string more than its count) is walked to
    /// the end, and the delete set after it is checked.
    #[test]
    fn legacy_json_content_is_walked_through() {
        // One client, one block under root "m": JSON content, count 1, strings "a" and "b";
        // then a delete set of one client whose range count is impossible.
        let mut u = vec![1u8, 1, 7, 0, 2, 1, 1, b'm', 1, 1, b'a', 1, b'b'];
        assert_eq!(walk_update_v1(&[&u[..], &[0]].concat()), Ok(Walked::Whole));
        u.extend([1, 7]);
        u.extend(HUGE);
        assert!(check_update(&u).is_err());
    }

    fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits
            .chunks(2)
            .map(|pair| {
                let pair = std::str::from_utf8(pair).unwrap_or("00");
                u8::from_str_radix(pair, 16).unwrap_or(0)
            })
            .collect()
    }

    /// Nested containers cannot each declare the whole rest of the payload: 60 maps nested
    /// in one another, each declaring half of what is left in entries, with the padding that
    /// makes every count pass on its own.
    #[test]
    fn nested_counts_together_cannot_claim_more_than_the_payload() {
        let mut u = vec![1u8, 1, 7, 0, 8, 1, 1, b'm', 1];
        let mut counts_at = Vec::new();
        for _ in 0..60 {
            u.push(118); // a map
            counts_at.push(u.len());
            u.extend([0u8; 4]); // its count, filled in below
            u.extend([1, b'k']); // the first entry's key
        }
        u.push(126); // null
        u.extend(std::iter::repeat_n(0u8, 4096));
        for &at in counts_at.iter().rev() {
            let left = (u.len() - at - 4) as u64;
            let n = left / 2;
            // A 4-byte varint, padded.
            let bytes = [
                (n & 0x7f) as u8 | 0x80,
                ((n >> 7) & 0x7f) as u8 | 0x80,
                ((n >> 14) & 0x7f) as u8 | 0x80,
                ((n >> 21) & 0x7f) as u8,
            ];
            u[at..at + 4].copy_from_slice(&bytes);
        }
        assert!(
            matches!(check_update(&u), Err(CountError::Impossible { .. })),
            "{:?}",
            check_update(&u)
        );
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
            assert_eq!(walk_update_v1(u), Ok(Walked::Whole), "{u:02x?}");
        }
        let sv = doc.transact().state_vector().encode_v1();
        assert_eq!(check_state_vector(&sv), Ok(()));
    }
}
