//! How a connection becomes a room's peer, whichever way it arrives (a WebSocket on this
//! node, or a client relayed from another node): its id, its bounded outbound queue, joining
//! the room (retrying while the room is unloading), and its frames decoded into what the room
//! consumes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tracing::debug;
use yrs::updates::decoder::Decode;
use yrs::Update;

use super::queue::{self, Bounds, QueueRx};
use super::{CloseReason, DocName, JoinError, PeerAuth, PeerLink, PeerMsg, Registry, RoomHandle};
use crate::close;
use crate::protocol::{self, Message};

/// Attempts at joining when the room was unloading at that very moment.
const JOIN_ATTEMPTS: usize = 8;

static NEXT_PEER: AtomicU64 = AtomicU64::new(1);

/// A fresh connection id, unique in this process.
pub fn next_peer_id() -> u64 {
    NEXT_PEER.fetch_add(1, Ordering::Relaxed)
}

/// The bounds of a peer's outbound queue (`peer_queue`, `peer_queue_bytes`).
pub fn peer_bounds(registry: &Registry) -> Bounds {
    Bounds {
        frames: registry.config.peer_queue,
        bytes: registry.config.peer_queue_bytes,
        gauge: registry.metrics.peer_queue_bytes.clone(),
    }
}

/// [`join`], with the refusal as the close reason the connection gets.
pub async fn join_room(
    registry: &Arc<Registry>,
    name: &DocName,
    peer: u64,
    auth: PeerAuth,
) -> Result<(RoomHandle, QueueRx), CloseReason> {
    Box::pin(join(registry, name, peer, auth))
        .await
        .map_err(join_close)
}

/// Joins `name`'s room on this node as `peer`, starting the room if needed and trying
/// again while the room found was unloading at that very moment.
pub(crate) async fn join(
    registry: &Arc<Registry>,
    name: &DocName,
    peer: u64,
    auth: PeerAuth,
) -> Result<(RoomHandle, QueueRx), JoinError> {
    for _ in 0..JOIN_ATTEMPTS {
        let room = registry.get_or_start(name)?;
        let (tx, rx) = queue::queue(peer_bounds(registry));
        let link = PeerLink {
            id: peer,
            auth: auth.clone(),
            tx,
        };
        match room.join(link).await {
            Ok(()) => return Ok((room, rx)),
            Err(JoinError::Gone) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(JoinError::Gone)
}

pub(crate) fn join_close(e: JoinError) -> CloseReason {
    match e {
        JoinError::LoadFailed => {
            CloseReason::new(close::INTERNAL, "document failed to load, retry later")
        }
        JoinError::Full => CloseReason::new(
            close::TRY_AGAIN_LATER,
            "too many connections to this document",
        ),
        JoinError::ShuttingDown => CloseReason::new(close::RESTART, "server restarting"),
        JoinError::Gone => CloseReason::new(close::TRY_AGAIN_LATER, "document busy, retry"),
        JoinError::Deleted => CloseReason::new(close::DELETED, "document deleted"),
        JoinError::Elsewhere => CloseReason::new(
            close::TRY_AGAIN_LATER,
            "document is served by another node, retry",
        ),
    }
}

/// Most messages one frame may carry (y-websocket clients send one or two; the WASM client at
/// most three: an update, an awareness state and an acknowledgement request). More closes
/// the connection with 1007.
pub const MAX_MESSAGES_PER_FRAME: usize = 64;

/// Decodes a frame into what the room consumes; updates are decoded here (off the room task)
/// so a malformed one is refused before it reaches the document.
///
/// `Err` carries the close reason's text: the connection closes with 1007
/// ([`crate::close::MALFORMED`]). Auth messages, messages of unknown types and empty updates
/// are dropped, so the result may be empty. Public for the fuzz targets (`fuzz/`).
///
/// The payloads kept (an update, an awareness message, an acknowledgement request) are
/// slices of the frame. A slice keeps the whole frame alive, so one that is less than half of
/// it is copied out: queues and the log count a payload's length, and a small message padded
/// with a large unknown one must not hold the padding in memory behind that count.
pub fn to_peer_msgs(frame: &Bytes) -> Result<Vec<PeerMsg>, String> {
    to_peer_msgs_with(frame, 0)
}

/// [`to_peer_msgs`], with room for `spare` more messages (one allocation where the caller
/// appends, as the Hocuspocus endpoint appends an acknowledgement request).
pub fn to_peer_msgs_with(frame: &Bytes, spare: usize) -> Result<Vec<PeerMsg>, String> {
    let msgs =
        protocol::decode_frame_max(frame, MAX_MESSAGES_PER_FRAME).map_err(|e| e.to_string())?;
    let own = |raw: Bytes| {
        if raw.len() * 2 < frame.len() {
            Bytes::copy_from_slice(&raw)
        } else {
            raw
        }
    };
    let mut out = Vec::with_capacity(msgs.len() + spare);
    for msg in msgs {
        match msg {
            Message::SyncStep1(sv) => out.push(PeerMsg::Step1(sv)),
            // An empty update (no structs, empty delete set) is what a client in sync sends as
            // its Step2; it changes nothing, so it never reaches the room.
            Message::SyncStep2(raw) | Message::Update(raw) if raw.as_ref() == [0, 0] => {}
            Message::SyncStep2(raw) | Message::Update(raw) => {
                crate::counts::check_update(&raw).map_err(|e| format!("invalid update: {e}"))?;
                let update = Update::decode_v1(&raw).map_err(|e| format!("invalid update: {e}"))?;
                out.push(PeerMsg::Update {
                    raw: own(raw),
                    update,
                });
            }
            Message::Awareness { update, raw } => {
                // Other clients parse every state as JSON (y-protocols calls JSON.parse): a
                // state that is not JSON would break their awareness handling, so it is
                // refused here instead of relayed.
                for (client, entry) in &update.clients {
                    if serde_json::from_str::<serde::de::IgnoredAny>(&entry.json).is_err() {
                        return Err(format!("awareness state of client {client} is not JSON"));
                    }
                }
                out.push(PeerMsg::Awareness {
                    update,
                    raw: own(raw),
                })
            }
            Message::QueryAwareness => out.push(PeerMsg::QueryAwareness),
            Message::DurableAck { raw } => out.push(PeerMsg::DurableAck(own(raw))),
            Message::Auth(_) => debug!("ignoring an auth message from a client"),
            Message::Unknown { tag } => debug!(tag, "ignoring a message of unknown type"),
        }
    }
    Ok(out)
}

/// Hostile frames through [`to_peer_msgs`], as a connection decodes them.
#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` and returns how far it raised this process's peak resident memory, in KiB
    /// (Linux: the peak is reset first through /proc/self/clear_refs). `None` where that is
    /// not available.
    fn peak_rss_growth_kib(f: impl FnOnce()) -> Option<u64> {
        fn kib(field: &str) -> Option<u64> {
            let status = std::fs::read_to_string("/proc/self/status").ok()?;
            let line = status.lines().find(|l| l.starts_with(field))?;
            line[field.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        }
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        let before = kib("VmHWM:")?;
        f();
        Some(kib("VmHWM:")?.saturating_sub(before))
    }

    /// Fixed by [`quire_protocol::counts`]. Fuzz finding (fuzz/: frame_decoder, room_update; minimized): a count declared in a few
    /// bytes makes yrs reserve a hash table for that many entries before it reads any of them
    /// (`HashMap::try_reserve` in `AwarenessUpdate::decode`, `StateVector::decode` and
    /// `Update::decode`). 104,857,558 clients here: a 2 to 5 GB allocation whose 134 MB of
    /// control bytes are written at once, for a 7-byte frame, on every such frame. The decode
    /// then fails (the entries are not there), so only the memory shows it. Other unit tests
    /// running meanwhile raise the peak by far less than the bound.
    #[test]
    fn declared_counts_do_not_allocate_before_their_entries_arrive() {
        const BOUND_KIB: u64 = 32 << 10;
        let count = [0xd6, 0xff, 0xff, 0x31]; // varUint 104,857,558
        let frames: [(&str, Vec<u8>); 3] = [
            ("awareness", [&[1, 4][..], &count].concat()),
            ("sync step 1", [&[0, 0, 4][..], &count].concat()),
            ("sync update", [&[0, 2, 4][..], &count].concat()),
        ];
        for (what, frame) in frames {
            let frame = Bytes::from(frame);
            let grew = peak_rss_growth_kib(|| {
                // What a connection does with a frame (updates are decoded there).
                assert!(to_peer_msgs(&frame).is_err(), "{what}: accepted");
            });
            if let Some(grew) = grew {
                assert!(
                    grew < BOUND_KIB,
                    "{what} ({frame:02x?}): decoding raised the peak memory by {grew} KiB"
                );
            }
        }
    }

    /// Fuzz finding (fuzz/: frame_decoder, with debug assertions): a client id of 2^53 or more
    /// in a state vector, an awareness update or an update panics in debug builds, in yrs's
    /// `ClientID::new` (`debug_assert!(value & MASK == 0)`), on the connection's task; release
    /// builds keep the low 53 bits (2^53 + 5 is client 5). JavaScript clients cannot send such
    /// ids (their numbers have 53 bits), so only a hostile client does. Fixed by
    /// [`quire_protocol::counts`], which refuses such ids before yrs reads them (1007).
    #[test]
    fn client_ids_of_54_bits_do_not_panic() {
        let id = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10]; // varUint 2^53
        let frames: [(&str, Vec<u8>); 3] = [
            // Step 1: one client, clock 1.
            ("sync step 1", [&[0, 0, 10, 1][..], &id, &[1]].concat()),
            // Awareness: one client, clock 1, state "{}".
            (
                "awareness",
                [&[1, 13, 1][..], &id, &[1, 2, b'{', b'}']].concat(),
            ),
            // Update: one client with no blocks, clock 0, empty delete set.
            (
                "sync update",
                [&[0, 2, 12, 1, 0][..], &id, &[0, 0]].concat(),
            ),
        ];
        for (what, frame) in frames {
            let frame = Bytes::from(frame);
            let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                to_peer_msgs(&frame).is_ok()
            }));
            assert!(decoded.is_ok(), "{what} ({frame:02x?}) panicked");
        }
    }

    /// Fuzz finding (fuzz/: frame_decoder, with overflow checks in yrs): an update whose delete
    /// set holds a range at clock u32::MAX panics in debug builds (tests, `cargo run`), on the
    /// connection's task, in yrs's `Range::decode` (`id_set.rs`: clock + length, "attempt to
    /// add with overflow"); release builds wrap the range's end around to 0.
    #[test]
    fn deleted_ranges_past_u32_max_do_not_panic() {
        // Sync Update: no blocks; deletes client 1's range at clock u32::MAX, length 1.
        let frame = Bytes::from_static(&[0, 2, 10, 0, 1, 1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f, 1]);
        let decoded = std::panic::catch_unwind(|| to_peer_msgs(&frame).is_ok());
        assert!(decoded.is_ok(), "{frame:02x?} panicked");
    }

    /// Fuzz finding (fuzz/: frame_decoder, through `room::join::to_peer_msgs`): an update whose block
    /// holds legacy JSON content (`ItemContent::JSON`, info 0x02) declaring 266,338,303 strings
    /// makes yrs reserve a `Vec<String>` for them before reading any (`block.rs`:
    /// `buf.try_reserve(remaining)`): 6.4 GB for a 15-byte frame. A `Vec` is not written when
    /// reserved, so this costs address space rather than resident memory, but it fails under
    /// `vm.overcommit_memory=2` or an address-space limit. Fixed by [`quire_protocol::counts`], whose
    /// walk now checks legacy JSON content's count too. Checked on the peak virtual size
    /// (`VmPeak`, which only grows): a bound of 1 GiB.
    #[test]
    fn a_legacy_json_count_does_not_reserve_gigabytes() {
        fn vm_peak_kib() -> Option<u64> {
            let status = std::fs::read_to_string("/proc/self/status").ok()?;
            let line = status.lines().find(|l| l.starts_with("VmPeak:"))?;
            line["VmPeak:".len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        }
        // Sync Update: one client with 9 blocks, client 44, clock 0; the first block: info 0x02
        // (JSON content, no origins), parent a root type (1) named "" (length 0 as the overlong
        // varUint 0x80 0x00), then the string count 266,338,303 and nothing else.
        let frame = Bytes::from_static(&[
            0, 2, 12, 1, 9, 0x2c, 0, 2, 1, 0x80, 0, 0xff, 0xff, 0xff, 0x7e,
        ]);
        let before = vm_peak_kib();
        assert!(to_peer_msgs(&frame).is_err(), "accepted");
        if let (Some(before), Some(after)) = (before, vm_peak_kib()) {
            assert!(
                after.saturating_sub(before) < 1 << 20,
                "decoding raised the peak address space by {} KiB",
                after - before
            );
        }
    }
}
