//! Reading a Yjs v1 update's blocks as yrs reads them: the items each inserts, the items it
//! refers to (origins and parent), and its delete set.

use yrs::encoding::read::{Cursor, Read};
use yrs::updates::decoder::{Decode, Decoder, DecoderV1};
use yrs::IdSet;

/// One block of an update: the items it inserts and what it refers to.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) client: u64,
    pub(super) start: u32,
    pub(super) len: u32,
    /// Items it refers to: its origins and its parent item.
    pub(super) refs: Vec<(u64, u32)>,
    /// Its parent, when named: a root.
    pub(super) root: Option<String>,
}

/// An update's blocks and deletions.
#[derive(Debug, Default)]
pub(super) struct Parsed {
    pub(super) blocks: Vec<Block>,
    pub(super) deletes: Vec<(u64, u32, u32)>,
}

const HAS_ORIGIN: u8 = 0b1000_0000;
const HAS_RIGHT_ORIGIN: u8 = 0b0100_0000;
const HAS_PARENT_SUB: u8 = 0b0010_0000;
const GC: u8 = 0;
const SKIP: u8 = 10;

pub(super) fn err(e: impl std::fmt::Display) -> String {
    format!("stored update: {e}")
}

/// The blocks and delete set of a Yjs v1 update, read as yrs reads them.
pub(super) fn parse_v1(data: &[u8]) -> Result<Parsed, String> {
    let mut d = DecoderV1::new(Cursor::new(data));
    let mut parsed = Parsed::default();
    let clients: u32 = d.read_var().map_err(err)?;
    for _ in 0..clients {
        let blocks: u32 = d.read_var().map_err(err)?;
        let client = d.read_client().map_err(err)?.get();
        let mut clock: u32 = d.read_var().map_err(err)?;
        for _ in 0..blocks {
            let info = d.read_info().map_err(err)?;
            let (len, refs, root) = match info {
                SKIP => (d.read_var::<u32>().map_err(err)?, Vec::new(), None),
                GC => (d.read_len().map_err(err)?, Vec::new(), None),
                info => {
                    let mut refs = Vec::new();
                    if info & HAS_ORIGIN != 0 {
                        let id = d.read_left_id().map_err(err)?;
                        refs.push((id.client.get(), id.clock));
                    }
                    if info & HAS_RIGHT_ORIGIN != 0 {
                        let id = d.read_right_id().map_err(err)?;
                        refs.push((id.client.get(), id.clock));
                    }
                    let mut root = None;
                    if info & (HAS_ORIGIN | HAS_RIGHT_ORIGIN) == 0 {
                        if d.read_parent_info().map_err(err)? {
                            root = Some(d.read_string().map_err(err)?.to_owned());
                        } else {
                            let id = d.read_left_id().map_err(err)?;
                            refs.push((id.client.get(), id.clock));
                        }
                        if info & HAS_PARENT_SUB != 0 {
                            d.read_string().map_err(err)?;
                        }
                    }
                    (content_len(&mut d, info)?, refs, root)
                }
            };
            if info != SKIP {
                parsed.blocks.push(Block {
                    client,
                    start: clock,
                    len,
                    refs,
                    root,
                });
            }
            clock = clock.saturating_add(len);
        }
    }
    let deletes = IdSet::decode(&mut d).map_err(err)?;
    for (client, ranges) in deletes.iter() {
        for range in ranges.iter() {
            parsed.deletes.push((client.get(), range.start, range.end));
        }
    }
    Ok(parsed)
}

/// Reads an item's content, answering its length in clock units (UTF-16 code units of a
/// string, values of a list, one for anything else).
fn content_len(d: &mut DecoderV1, info: u8) -> Result<u32, String> {
    Ok(match info & 0b1111 {
        1 => d.read_len().map_err(err)?,
        2 => {
            let n = d.read_len().map_err(err)?;
            for _ in 0..n {
                d.read_string().map_err(err)?;
            }
            n
        }
        3 => {
            d.read_buf().map_err(err)?;
            1
        }
        4 => d.read_string().map_err(err)?.encode_utf16().count() as u32,
        5 => {
            d.read_json().map_err(err)?;
            1
        }
        6 => {
            d.read_key().map_err(err)?;
            d.read_json().map_err(err)?;
            1
        }
        7 => {
            // A nested type: an XML element carries its name.
            if d.read_type_ref().map_err(err)? == 3 {
                d.read_key().map_err(err)?;
            }
            1
        }
        8 => {
            let n = d.read_len().map_err(err)?;
            for _ in 0..n {
                d.read_any().map_err(err)?;
            }
            n
        }
        9 => {
            d.read_string().map_err(err)?;
            d.read_any().map_err(err)?;
            1
        }
        other => return Err(format!("stored update: unknown content {other}")),
    })
}
