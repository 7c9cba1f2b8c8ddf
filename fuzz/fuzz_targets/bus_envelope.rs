//! Messages from the bus between nodes: `bus::decode_message` on arbitrary bytes (what a node
//! does with every NATS message addressed to it, one envelope or a batch of them). What
//! decodes must encode and decode back to equal envelopes, and a second encoding must be
//! byte-identical.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use quire_server::bus::{decode_message, BatchWriter, Envelope, BATCH_ENVELOPES};

fn encode(envelopes: &[Envelope]) -> Bytes {
    let mut writer = BatchWriter::with_capacity(0);
    for env in envelopes {
        assert!(writer.push(env, usize::MAX), "{} envelopes fit in one message", envelopes.len());
    }
    writer.body()
}

fuzz_target!(|data: &[u8]| {
    let Some(envelopes) = decode_message(Bytes::copy_from_slice(data), usize::MAX) else {
        return;
    };
    assert!(!envelopes.is_empty() && envelopes.len() <= BATCH_ENVELOPES);
    let encoded = encode(&envelopes);
    let again = decode_message(encoded.clone(), usize::MAX)
        .unwrap_or_else(|| panic!("{envelopes:?} encode as {encoded:02x?}, which does not decode"));
    assert_eq!(again, envelopes, "round trip through {encoded:02x?}");
    assert_eq!(encode(&again), encoded, "encoding is not stable");
    assert!(
        encoded.len() <= data.len(),
        "{envelopes:?} encode longer ({}) than the bytes they came from ({})",
        encoded.len(),
        data.len()
    );
});
