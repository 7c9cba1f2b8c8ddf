//! The y-websocket wire protocol as pure functions over bytes: no sockets, no tasks.
//!
//! Decoding is zero-copy: every message keeps a [`Bytes`] slice of the frame it came in, so an
//! update is stored in the log exactly as received and an awareness message is relayed without
//! being re-encoded. Encoding of server-originated messages uses `yrs::sync` types so the bytes
//! match what `y-protocols` produces (checked against fixtures from the JavaScript encoder).

pub mod counts;
pub mod hocuspocus;
pub mod state;

use bytes::{BufMut, Bytes, BytesMut};
use yrs::encoding::read::{Cursor, Read};
use yrs::sync::protocol::{
    MSG_AUTH, MSG_AWARENESS, MSG_QUERY_AWARENESS, MSG_SYNC, MSG_SYNC_STEP_1, MSG_SYNC_STEP_2,
    MSG_SYNC_UPDATE,
};
use yrs::sync::AwarenessUpdate;
use yrs::updates::decoder::Decode;
use yrs::updates::encoder::Encode;
use yrs::StateVector;

/// Custom message tag for the durable acknowledgement (y-sweet's "sync status" message): the
/// server echoes the message byte for byte once everything the connection sent before it has been
/// committed to the log.
pub const MSG_DURABLE_ACK: u8 = 102;

/// Server-internal tag: a stateless message for a Hocuspocus peer, `varString(payload)`. A room
/// queues it only for peers of the Hocuspocus endpoint, which rewrite it into Hocuspocus'
/// `Stateless`; y-websocket clients never see it (and one a client sends is ignored).
pub const MSG_STATELESS: u8 = 103;

/// One decoded message of a frame. Byte payloads are slices of the original frame.
/// [`MessageKind`] names each kind (the server's entry-point table has a row per kind).
#[derive(Debug, Clone, PartialEq, strum::EnumDiscriminants)]
#[strum_discriminants(name(MessageKind), derive(strum::EnumIter, strum::IntoStaticStr))]
pub enum Message {
    /// Sync step 1 carrying the sender's state vector.
    SyncStep1(StateVector),
    /// Sync step 2: an update with everything the receiver lacked.
    SyncStep2(Bytes),
    /// An incremental document update (Yjs v1 encoding).
    Update(Bytes),
    /// An awareness update. `raw` is the whole message (tag included) for relaying as is.
    Awareness { update: AwarenessUpdate, raw: Bytes },
    /// Auth message: `None` = granted, `Some(reason)` = permission denied.
    Auth(Option<String>),
    /// A request for the full awareness state.
    QueryAwareness,
    /// Durable acknowledgement request (tag 102). `raw` is the whole message, echoed verbatim.
    DurableAck { raw: Bytes },
    /// Any other tag, parsed like yrs does (a varUint8Array body) and ignored by the server.
    Unknown { tag: u64 },
}

/// Why a frame could not be decoded. The connection that sent it is closed with
/// 1007 (Invalid frame payload data) and this text as the reason.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    #[error("empty frame")]
    Empty,
    #[error("truncated or malformed message at byte {offset}: {detail}")]
    Malformed { offset: usize, detail: String },
    #[error("unknown sync message type {0}")]
    UnknownSyncType(u64),
    #[error("more than {0} messages in one frame")]
    TooManyMessages(usize),
}

pub(crate) fn malformed(offset: usize, e: impl std::fmt::Display) -> DecodeError {
    DecodeError::Malformed {
        offset,
        detail: e.to_string(),
    }
}

/// Decodes every message of one binary frame. Several messages may be concatenated; a frame
/// whose last message is cut short is an error (unlike `yrs::sync::MessageReader`, which stops
/// silently at the end of the buffer and would hide a truncated update).
pub fn decode_frame(frame: &Bytes) -> Result<Vec<Message>, DecodeError> {
    decode_frame_max(frame, usize::MAX)
}

/// [`decode_frame`], refusing a frame of more than `max` messages before decoding past them
/// (a frame of one-byte messages would otherwise decode into a list many times its size).
pub fn decode_frame_max(frame: &Bytes, max: usize) -> Result<Vec<Message>, DecodeError> {
    if frame.is_empty() {
        return Err(DecodeError::Empty);
    }
    let mut out = Vec::with_capacity(1);
    let mut cur = Cursor::new(frame);
    while cur.next < frame.len() {
        if out.len() >= max {
            return Err(DecodeError::TooManyMessages(max));
        }
        let start = cur.next;
        let tag: u64 = cur.read_var().map_err(|e| malformed(start, e))?;
        let msg = match tag {
            t if t == MSG_SYNC as u64 => {
                let sync_type: u64 = cur.read_var().map_err(|e| malformed(cur.next, e))?;
                let payload = read_slice(frame, &mut cur)?;
                match sync_type {
                    t if t == MSG_SYNC_STEP_1 as u64 => {
                        counts::check_state_vector(&payload)
                            .map_err(|e| malformed(start, format!("state vector: {e}")))?;
                        let sv = StateVector::decode_v1(&payload)
                            .map_err(|e| malformed(start, format!("state vector: {e}")))?;
                        Message::SyncStep1(sv)
                    }
                    t if t == MSG_SYNC_STEP_2 as u64 => Message::SyncStep2(payload),
                    t if t == MSG_SYNC_UPDATE as u64 => Message::Update(payload),
                    other => return Err(DecodeError::UnknownSyncType(other)),
                }
            }
            t if t == MSG_AWARENESS as u64 => {
                let payload = read_slice(frame, &mut cur)?;
                counts::check_awareness(&payload)
                    .map_err(|e| malformed(start, format!("awareness: {e}")))?;
                let update = AwarenessUpdate::decode_v1(&payload)
                    .map_err(|e| malformed(start, format!("awareness: {e}")))?;
                Message::Awareness {
                    update,
                    raw: frame.slice(start..cur.next),
                }
            }
            t if t == MSG_AUTH as u64 => {
                let auth_type: u64 = cur.read_var().map_err(|e| malformed(cur.next, e))?;
                if auth_type == 0 {
                    let at = cur.next;
                    let reason = cur.read_string().map_err(|e| malformed(at, e))?.to_owned();
                    Message::Auth(Some(reason))
                } else {
                    Message::Auth(None)
                }
            }
            t if t == MSG_QUERY_AWARENESS as u64 => Message::QueryAwareness,
            t if t == MSG_DURABLE_ACK as u64 => {
                read_slice(frame, &mut cur)?;
                Message::DurableAck {
                    raw: frame.slice(start..cur.next),
                }
            }
            other => {
                read_slice(frame, &mut cur)?;
                Message::Unknown { tag: other }
            }
        };
        out.push(msg);
    }
    Ok(out)
}

/// Reads a varUint8Array and returns it as a zero-copy slice of `frame`.
fn read_slice(frame: &Bytes, cur: &mut Cursor<'_>) -> Result<Bytes, DecodeError> {
    let at = cur.next;
    let len: u64 = cur.read_var().map_err(|e| malformed(at, e))?;
    let start = cur.next;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| start.checked_add(l))
        .filter(|&end| end <= frame.len())
        .ok_or_else(|| malformed(at, format!("length {len} runs past the end of the frame")))?;
    cur.next = end;
    Ok(frame.slice(start..end))
}

/// Writes `n` as a lib0 varUint.
pub fn put_var(buf: &mut BytesMut, mut n: u64) {
    while n >= 0x80 {
        buf.put_u8((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    buf.put_u8(n as u8);
}

fn sync_message(sync_type: u8, payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(payload.len() + 12);
    put_var(&mut buf, MSG_SYNC as u64);
    put_var(&mut buf, sync_type as u64);
    put_var(&mut buf, payload.len() as u64);
    buf.extend_from_slice(payload);
    buf.freeze()
}

/// `Sync/Step1` with the given state vector.
pub fn encode_step1(sv: &StateVector) -> Bytes {
    sync_message(MSG_SYNC_STEP_1, &sv.encode_v1())
}

/// `Sync/Step2` carrying `update`.
pub fn encode_step2(update: &[u8]) -> Bytes {
    sync_message(MSG_SYNC_STEP_2, update)
}

/// `Sync/Update` carrying `update`. Broadcasts encode this once and share the bytes.
pub fn encode_update(update: &[u8]) -> Bytes {
    sync_message(MSG_SYNC_UPDATE, update)
}

/// An `Awareness` message carrying `update`.
pub fn encode_awareness(update: &AwarenessUpdate) -> Bytes {
    let payload = update.encode_v1();
    let mut buf = BytesMut::with_capacity(payload.len() + 6);
    put_var(&mut buf, MSG_AWARENESS as u64);
    put_var(&mut buf, payload.len() as u64);
    buf.extend_from_slice(&payload);
    buf.freeze()
}

/// `Auth/PermissionDenied` with a reason.
pub fn encode_permission_denied(reason: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(reason.len() + 8);
    put_var(&mut buf, MSG_AUTH as u64);
    put_var(&mut buf, 0);
    put_var(&mut buf, reason.len() as u64);
    buf.extend_from_slice(reason.as_bytes());
    buf.freeze()
}

/// A durable acknowledgement request (tag 102) with a client-chosen counter, as y-sweet's client
/// sends it: varUint8Array(varUint(n)).
pub fn encode_durable_ack(n: u64) -> Bytes {
    let mut inner = BytesMut::new();
    put_var(&mut inner, n);
    let mut buf = BytesMut::with_capacity(inner.len() + 3);
    put_var(&mut buf, MSG_DURABLE_ACK as u64);
    put_var(&mut buf, inner.len() as u64);
    buf.extend_from_slice(&inner);
    buf.freeze()
}

/// A [`MSG_STATELESS`] message carrying `payload`.
pub fn encode_stateless(payload: &str) -> Bytes {
    let mut buf = BytesMut::with_capacity(payload.len() + 6);
    put_var(&mut buf, MSG_STATELESS as u64);
    put_var(&mut buf, payload.len() as u64);
    buf.extend_from_slice(payload.as_bytes());
    buf.freeze()
}

/// The payload of a [`MSG_STATELESS`] message (`raw`: the whole message, tag included).
pub fn read_stateless(raw: &[u8]) -> Option<String> {
    let mut cur = Cursor::new(raw);
    let _tag: u64 = cur.read_var().ok()?;
    cur.read_string().ok().map(str::to_owned)
}

/// Splits a frame into its messages, each a slice of the frame with its tag, without decoding
/// their bodies: for frames this server encoded itself, on their way to a connection that
/// sends each message in a frame of its own (Hocuspocus). Byte arrays are skipped by their
/// length prefix; an error means the frame is cut short.
pub fn split_frame(frame: &Bytes) -> Result<Vec<(u64, Bytes)>, DecodeError> {
    let mut out = Vec::with_capacity(1);
    let mut cur = Cursor::new(frame);
    while cur.next < frame.len() {
        let start = cur.next;
        let tag: u64 = cur.read_var().map_err(|e| malformed(start, e))?;
        match tag {
            t if t == MSG_SYNC as u64 => {
                let _sync_type: u64 = cur.read_var().map_err(|e| malformed(cur.next, e))?;
                read_slice(frame, &mut cur)?;
            }
            t if t == MSG_AUTH as u64 => {
                let auth_type: u64 = cur.read_var().map_err(|e| malformed(cur.next, e))?;
                if auth_type == 0 {
                    read_slice(frame, &mut cur)?;
                }
            }
            t if t == MSG_QUERY_AWARENESS as u64 => {}
            _ => {
                read_slice(frame, &mut cur)?;
            }
        }
        out.push((tag, frame.slice(start..cur.next)));
    }
    Ok(out)
}

/// The counter a durable acknowledgement (`raw`: the whole message, tag included, as
/// [`Message::DurableAck`] keeps it) carries; `None` if its body is not a varUint.
pub fn read_durable_ack(raw: &[u8]) -> Option<u64> {
    let mut cur = Cursor::new(raw);
    let _tag: u64 = cur.read_var().ok()?;
    let body = cur.read_buf().ok()?;
    Cursor::new(body).read_var().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Arc;
    use yrs::sync::awareness::AwarenessUpdateEntry;
    use yrs::{ClientID, Doc, ReadTxn, Text, Transact};

    fn doc_with_text(client: u64, s: &str) -> Doc {
        let doc = Doc::with_client_id(client);
        let text = doc.get_or_insert_text("t");
        text.insert(&mut doc.transact_mut(), 0, s);
        doc
    }

    #[test]
    fn sync_messages_round_trip_and_match_yrs() {
        let doc = doc_with_text(7, "hello");
        let sv = doc.transact().state_vector();
        let update = doc.transact().encode_diff_v1(&StateVector::default());

        let step1 = encode_step1(&sv);
        let yrs_step1 =
            yrs::sync::Message::Sync(yrs::sync::SyncMessage::SyncStep1(sv.clone())).encode_v1();
        assert_eq!(step1.as_ref(), yrs_step1.as_slice());

        let step2 = encode_step2(&update);
        let upd = encode_update(&update);
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&step1);
        frame.extend_from_slice(&step2);
        frame.extend_from_slice(&upd);
        let msgs = decode_frame(&frame.freeze()).expect("valid frame");
        assert_eq!(
            msgs,
            vec![
                Message::SyncStep1(sv),
                Message::SyncStep2(Bytes::from(update.clone())),
                Message::Update(Bytes::from(update)),
            ]
        );
    }

    #[test]
    fn awareness_and_custom_messages_round_trip() {
        let mut clients = HashMap::new();
        clients.insert(
            ClientID::new(42),
            AwarenessUpdateEntry {
                clock: 3,
                json: Arc::from(r#"{"user":"ann"}"#),
            },
        );
        let update = AwarenessUpdate { clients };
        let aw = encode_awareness(&update);
        let ack = encode_durable_ack(300);
        let denied = encode_permission_denied("read-only");
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&aw);
        frame.extend_from_slice(&ack);
        frame.extend_from_slice(&denied);
        frame.extend_from_slice(&[3]); // query awareness
        frame.extend_from_slice(&[77, 2, 1, 2]); // unknown tag with a 2-byte body
        let msgs = decode_frame(&frame.freeze()).expect("valid frame");
        assert_eq!(msgs.len(), 5);
        assert_eq!(
            msgs[0],
            Message::Awareness {
                update,
                raw: aw.clone()
            }
        );
        assert_eq!(msgs[1], Message::DurableAck { raw: ack.clone() });
        assert_eq!(ack.as_ref(), &[102, 2, 0xAC, 0x02]);
        assert_eq!(msgs[2], Message::Auth(Some("read-only".into())));
        assert_eq!(msgs[3], Message::QueryAwareness);
        assert_eq!(msgs[4], Message::Unknown { tag: 77 });
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert_eq!(decode_frame(&Bytes::new()), Err(DecodeError::Empty));
        // Update whose declared length runs past the end.
        assert!(matches!(
            decode_frame(&Bytes::from_static(&[0, 2, 10, 1, 2])),
            Err(DecodeError::Malformed { .. })
        ));
        // Unknown sync type.
        assert_eq!(
            decode_frame(&Bytes::from_static(&[0, 9, 0])),
            Err(DecodeError::UnknownSyncType(9))
        );
        // A valid message followed by a truncated one.
        assert!(decode_frame(&Bytes::from_static(&[3, 0, 2])).is_err());
        // varUint that never ends.
        assert!(decode_frame(&Bytes::from_static(&[0xff, 0xff, 0xff])).is_err());
        // Garbage state vector.
        assert!(decode_frame(&Bytes::from_static(&[0, 0, 2, 0xff, 0xff])).is_err());
    }
}
