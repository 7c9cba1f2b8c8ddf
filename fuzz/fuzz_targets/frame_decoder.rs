//! y-websocket frames from a client: `protocol::decode_frame` and `room::join::to_peer_msgs` (what a
//! connection does with every binary frame), and, past the server's count checks
//! (`counts::check_update`), yrs's decoding of each update in them.
//!
//! Checks, besides "no panic": every decoded message re-encodes with Quire's encoders into a
//! frame that decodes to the same message; a frame `decode_frame` refuses is refused by
//! `to_peer_msgs` too; and `to_peer_msgs` hands the room exactly the messages it consumes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use quire_server::counts;
use quire_server::protocol::{self, decode_frame, Message};
use quire_server::room::join::{to_peer_msgs, MAX_MESSAGES_PER_FRAME};
use yrs::updates::decoder::Decode;
use yrs::{Doc, Transact, Update};

/// `encoded` must decode to exactly `[msg]`.
fn round_trips(msg: &Message, encoded: &Bytes) {
    match decode_frame(encoded) {
        Ok(again) => assert_eq!(
            again.as_slice(),
            std::slice::from_ref(msg),
            "re-encoded as {:02x?}",
            encoded.as_ref()
        ),
        Err(e) => panic!(
            "{msg:?} re-encodes as {:02x?}, which does not decode: {e}",
            encoded.as_ref()
        ),
    }
}

/// An update must be refused by the server's count checks or decode or be refused by yrs,
/// and a decoded one must apply to an empty document or be refused (what the room does with
/// it), without panicking. True if it decodes. (yrs alone is not fuzzed here: the server never
/// hands it a payload `counts::check_update` refuses.) The count walk may stop early only
/// where yrs's decoder fails too: past that point yrs would read counts nobody checked.
fn check_update(raw: &Bytes) -> bool {
    let walked = match counts::walk_update_v1(raw) {
        Ok(walked) => walked,
        Err(_) => return false,
    };
    let decoded = Update::decode_v1(raw);
    assert!(
        walked == counts::Walked::Whole || decoded.is_err(),
        "the count walk stopped early on an update yrs decodes: {:02x?}",
        raw.as_ref()
    );
    match decoded {
        Ok(update) => {
            let doc = Doc::new();
            let _ = doc.transact_mut().apply_update(update);
            true
        }
        Err(_) => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let frame = Bytes::copy_from_slice(data);
    let decoded = decode_frame(&frame);
    let for_room = to_peer_msgs(&frame);
    let msgs = match decoded {
        Ok(msgs) => msgs,
        Err(e) => {
            assert!(
                for_room.is_err(),
                "decode_frame refuses the frame ({e}) but to_peer_msgs takes it"
            );
            return;
        }
    };
    assert!(!msgs.is_empty(), "a non-empty frame decodes to no message");

    // What to_peer_msgs must hand the room, and whether every update in the frame decodes.
    let mut consumed = 0;
    let mut updates_decode = true;
    let mut has_awareness = false;
    for msg in &msgs {
        match msg {
            Message::SyncStep1(sv) => {
                round_trips(msg, &protocol::encode_step1(sv));
                consumed += 1;
            }
            Message::SyncStep2(u) | Message::Update(u) => {
                let encoded = match msg {
                    Message::SyncStep2(_) => protocol::encode_step2(u),
                    _ => protocol::encode_update(u),
                };
                round_trips(msg, &encoded);
                // An empty update ([0, 0]) is dropped before the room.
                if u.as_ref() != [0, 0] {
                    consumed += 1;
                    updates_decode &= check_update(u);
                }
            }
            Message::Awareness { update, raw } => {
                has_awareness = true;
                round_trips(msg, raw);
                let encoded = protocol::encode_awareness(update);
                match decode_frame(&encoded).as_deref() {
                    Ok([Message::Awareness { update: again, .. }]) => {
                        assert_eq!(again, update, "awareness re-encoded as {encoded:02x?}")
                    }
                    other => panic!("awareness re-encodes as {encoded:02x?}: {other:?}"),
                }
                consumed += 1;
            }
            Message::Auth(Some(reason)) => {
                round_trips(msg, &protocol::encode_permission_denied(reason));
            }
            Message::Auth(None) | Message::Unknown { .. } => {}
            Message::QueryAwareness => {
                round_trips(msg, &Bytes::from_static(&[3]));
                consumed += 1;
            }
            Message::DurableAck { raw } => {
                round_trips(msg, raw);
                consumed += 1;
            }
        }
    }
    match for_room {
        Ok(peer_msgs) => {
            assert!(
                updates_decode,
                "to_peer_msgs takes a frame with an update yrs cannot decode"
            );
            assert_eq!(
                peer_msgs.len(),
                consumed,
                "to_peer_msgs hands the room a different number of messages"
            );
        }
        // Refused for an update that does not decode, by a rule on awareness states, or for
        // carrying more messages than a connection may send in one frame.
        Err(e) => assert!(
            !updates_decode || has_awareness || msgs.len() > MAX_MESSAGES_PER_FRAME,
            "to_peer_msgs refuses a frame whose every message decodes: {e}"
        ),
    }
});
