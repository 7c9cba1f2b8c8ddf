//! Messages from the bus between nodes: `bus::decode_message` on arbitrary bytes (what a node
//! does with every NATS message addressed to it, one envelope or a batch of them, whose bad
//! envelopes are skipped). What decodes must encode and decode back to equal envelopes with
//! none refused, and a second encoding must be byte-identical.
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
    let Some((envelopes, _refused)) = decode_message(Bytes::copy_from_slice(data), usize::MAX)
    else {
        return;
    };
    assert!(envelopes.len() <= BATCH_ENVELOPES);
    if envelopes.is_empty() {
        return;
    }
    let encoded = encode(&envelopes);
    let again = decode_message(encoded.clone(), usize::MAX)
        .unwrap_or_else(|| panic!("{envelopes:?} encode as {encoded:02x?}, which does not decode"));
    assert_eq!(again, (envelopes.clone(), 0), "round trip through {encoded:02x?}");
    let again = again.0;
    assert_eq!(encode(&again), encoded, "encoding is not stable");
    assert!(
        encoded.len() <= data.len(),
        "{envelopes:?} encode longer ({}) than the bytes they came from ({})",
        encoded.len(),
        data.len()
    );
});
