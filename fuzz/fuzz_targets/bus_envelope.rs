//! Messages from the bus between nodes: `bus::Envelope::decode` on arbitrary bytes (what a
//! node does with every NATS message addressed to it). A message that decodes must encode
//! and decode back to an equal value, and a second encoding must be byte-identical.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use quire_server::bus::Envelope;

fuzz_target!(|data: &[u8]| {
    let Some(envelope) = Envelope::decode(Bytes::copy_from_slice(data)) else {
        return;
    };
    let encoded = envelope.encode();
    let again = Envelope::decode(encoded.clone())
        .unwrap_or_else(|| panic!("{envelope:?} encodes as {encoded:02x?}, which does not decode"));
    assert_eq!(again, envelope, "round trip through {encoded:02x?}");
    assert_eq!(again.encode(), encoded, "encoding is not stable");
    assert!(
        encoded.len() <= data.len(),
        "{envelope:?} encodes longer ({}) than the bytes it came from ({})",
        encoded.len(),
        data.len()
    );
});
