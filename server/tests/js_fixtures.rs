//! Codec round trips on bytes produced by the JavaScript `y-protocols` encoders
//! (`tests/js/make-fixtures.mjs` writes `tests/fixtures/y-protocols.json`).

use bytes::{Bytes, BytesMut};
use quire_server::protocol::{self, Message};
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, Transact, Update};

fn unhex(s: &str) -> Bytes {
    let bytes: Vec<u8> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect();
    Bytes::from(bytes)
}

/// Re-encodes one decoded message with Quire's encoders.
fn reencode(msg: &Message) -> Bytes {
    match msg {
        Message::SyncStep1(sv) => protocol::encode_step1(sv),
        Message::SyncStep2(u) => protocol::encode_step2(u),
        Message::Update(u) => protocol::encode_update(u),
        Message::Awareness { update, .. } => protocol::encode_awareness(update),
        Message::Auth(Some(reason)) => protocol::encode_permission_denied(reason),
        Message::QueryAwareness => Bytes::from_static(&[3]),
        Message::DurableAck { raw } => raw.clone(),
        other => panic!("unexpected message in fixtures: {other:?}"),
    }
}

#[test]
fn javascript_fixtures_decode_and_reencode_to_the_same_bytes() {
    let json: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/y-protocols.json")).expect("fixtures json");
    let fixtures = json["fixtures"].as_array().expect("fixtures array");
    assert!(fixtures.len() >= 8);
    for f in fixtures {
        let name = f["name"].as_str().expect("name");
        let kind = f["kind"].as_str().expect("kind");
        let bytes = unhex(f["bytes"].as_str().expect("bytes"));
        let msgs = protocol::decode_frame(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut again = BytesMut::new();
        for m in &msgs {
            again.extend_from_slice(&reencode(m));
        }
        assert_eq!(
            again.freeze(),
            bytes,
            "{name}: re-encoding gives the same bytes"
        );

        match (kind, &msgs[..]) {
            ("step1", [Message::SyncStep1(_)]) => {}
            ("step2", [Message::SyncStep2(u)]) => {
                let doc = Doc::new();
                doc.transact_mut()
                    .apply_update(Update::decode_v1(u).expect("update"))
                    .expect("apply");
                let text = doc.get_or_insert_text("text").get_string(&doc.transact());
                assert_eq!(Some(text.as_str()), f["text"].as_str(), "{name}");
            }
            ("update", [Message::Update(u)]) => {
                Update::decode_v1(u).expect("a valid Yjs update");
            }
            ("awareness", [Message::Awareness { update, .. }]) => {
                let entry = update.clients.values().next().expect("one client");
                assert_eq!(Some(&*entry.json), f["text"].as_str(), "{name}");
            }
            ("query-awareness", [Message::QueryAwareness]) => {}
            ("auth-denied", [Message::Auth(Some(reason))]) => {
                assert_eq!(Some(reason.as_str()), f["text"].as_str());
            }
            ("batch", [Message::SyncStep1(_), Message::Update(_), Message::Awareness { .. }]) => {}
            _ => panic!("{name}: decoded as {msgs:?}, expected {kind}"),
        }
    }
}
