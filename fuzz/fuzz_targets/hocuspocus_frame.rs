//! Frames of the Hocuspocus endpoint from a client: `protocol::hocuspocus::head` (what the
//! socket reads of every frame to route it) and `decode`, and, for the messages a document's
//! session hands its room, `room::join::to_peer_msgs` on the y-websocket message after the
//! address; and `protocol::split_frame`, which the sessions use on what the room queues.
//!
//! Checks, besides "no panic": `head` and `decode` agree (a frame `head` refuses, `decode`
//! refuses; a decoded message has the address and type `head` read; Ping and Pong alike); every
//! message the server has an encoder for re-encodes into a frame that decodes to the same
//! message; a frame `split_frame` accepts is exactly the concatenation of its parts.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use quire_server::protocol::hocuspocus::{self as hp, types, Frame, HpMessage};
use quire_server::protocol::split_frame;
use quire_server::room::join::to_peer_msgs;

fn round_trips(address: &str, msg: &HpMessage, encoded: Bytes) {
    match hp::decode(&encoded) {
        Ok(Frame::Addressed(a)) => {
            assert_eq!(a.address, address, "re-encoded as {:02x?}", encoded.as_ref());
            assert_eq!(&a.message, msg, "re-encoded as {:02x?}", encoded.as_ref());
        }
        other => panic!("{msg:?} re-encodes as {:02x?}: {other:?}", encoded.as_ref()),
    }
}

fuzz_target!(|data: &[u8]| {
    let frame = Bytes::copy_from_slice(data);
    let head = hp::head(&frame);
    let decoded = hp::decode(&frame);
    match (&head, &decoded) {
        (Err(_), Ok(d)) => panic!("head refused a frame decode accepted: {d:?}"),
        (Ok(None), Ok(Frame::Ping | Frame::Pong)) => {}
        (Ok(None), other) => panic!("a bare Ping or Pong decoded as {other:?}"),
        (Ok(Some(h)), Ok(Frame::Addressed(a))) => assert_eq!(h.address, a.address),
        (Ok(Some(_)), Ok(other)) => panic!("an addressed head decoded as {other:?}"),
        (_, Err(_)) => {}
    }
    if let Ok(Some(h)) = &head {
        // What a session hands its room: the message after the address.
        if matches!(h.kind, types::SYNC | types::AWARENESS | types::QUERY_AWARENESS) {
            let msgs = to_peer_msgs(&frame.slice(h.message_at..));
            if let (Ok(msgs), Ok(_)) = (&msgs, &decoded) {
                assert!(msgs.len() <= 1, "one message per frame: {}", msgs.len());
            }
        }
    }
    if let Ok(Frame::Addressed(a)) = &decoded {
        let addr = a.address.as_str();
        let again = match &a.message {
            HpMessage::Token { token, version: Some(v) } => {
                Some(hp::encode_auth_with_version(addr, token, v))
            }
            HpMessage::Token { token, version: None } => Some(hp::encode_auth(addr, token)),
            HpMessage::PermissionDenied(r) => Some(hp::encode_permission_denied(addr, r)),
            HpMessage::Authenticated(s) => Some(hp::encode_authenticated(addr, s)),
            HpMessage::TokenRequest => Some(hp::encode_token_request(addr)),
            HpMessage::SyncStatus(ok) => Some(hp::encode_sync_status(addr, *ok)),
            HpMessage::Close(Some(r)) => Some(hp::encode_close(addr, r)),
            HpMessage::Stateless(p) => Some(hp::encode_stateless(addr, p)),
            _ => None,
        };
        if let Some(again) = again {
            round_trips(addr, &a.message, again);
        }
    }
    if let Ok(parts) = split_frame(&frame) {
        let joined: Vec<u8> = parts.iter().flat_map(|(_, m)| m.iter().copied()).collect();
        assert_eq!(joined, data, "split_frame's parts are the frame");
    }
});
