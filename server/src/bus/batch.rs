//! Several envelopes for one node in one message: how a link (`link.rs`) writes them and how
//! the receiver reads them back.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hmac::Mac;

use super::envelope::{BATCH, MAC_LEN};
use super::{ClusterKey, Envelope, Names};

/// Most envelopes in one message.
pub const BATCH_ENVELOPES: usize = 1024;

/// A batch's head: its kind and how many envelopes it holds.
const BATCH_HEAD: usize = 1 + 8;
/// The length in front of each envelope of a batch.
const LEN: usize = 4;
/// Room a message keeps in front of its first envelope: the signature, a batch's head and
/// the first envelope's length (a message of one envelope leaves the last two out).
const FRONT: usize = MAC_LEN + BATCH_HEAD + LEN;

/// Envelopes for one subject written into one message as they are added, in one buffer per
/// message: one envelope travels alone, as [`Envelope::encode`] writes it; several travel as
/// a batch (`BATCH`, their count as u64, then each after its length as u32). [`seal`](Self::seal)
/// puts the signature in front.
pub struct BatchWriter {
    buf: BytesMut,
    count: usize,
}

impl BatchWriter {
    /// A writer whose buffer starts with room for `bytes` of envelopes.
    pub fn with_capacity(bytes: usize) -> BatchWriter {
        let mut buf = BytesMut::with_capacity(FRONT + bytes);
        buf.put_bytes(0, FRONT);
        BatchWriter { buf, count: 0 }
    }

    /// Envelopes written so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Adds `env`. The first is always taken; a later one that would make the message longer
    /// than `limit` bytes (or exceed [`BATCH_ENVELOPES`]) is not, and `false` says so.
    pub fn push(&mut self, env: &Envelope, limit: usize) -> bool {
        if self.count >= BATCH_ENVELOPES {
            return false;
        }
        let mark = self.buf.len();
        if self.count > 0 {
            self.buf.put_u32(0);
        }
        let start = self.buf.len();
        env.encode_into(&mut self.buf);
        let len = u32::try_from(self.buf.len() - start);
        if self.count > 0 && (self.buf.len() - MAC_LEN > limit || len.is_err()) {
            self.buf.truncate(mark);
            return false;
        }
        let at = if self.count == 0 { FRONT - LEN } else { mark };
        let len = len.unwrap_or(u32::MAX).to_be_bytes();
        self.buf[at..at + LEN].copy_from_slice(&len);
        self.count += 1;
        true
    }

    /// The message: `MAC_LEN` bytes of room for the signature, then the body.
    fn finish(mut self) -> BytesMut {
        if self.count == 1 {
            // Alone: the envelope right after the signature.
            let _ = self.buf.split_to(BATCH_HEAD + LEN);
        } else {
            self.buf[MAC_LEN] = BATCH;
            let count = (self.count as u64).to_be_bytes();
            self.buf[MAC_LEN + 1..MAC_LEN + BATCH_HEAD].copy_from_slice(&count);
        }
        self.buf
    }

    /// The message without a signature (what [`decode_message`] reads).
    pub fn body(self) -> Bytes {
        self.finish().split_off(MAC_LEN).freeze()
    }

    /// The message signed for `subject` (what [`ClusterKey::open`] reads).
    pub fn seal(self, key: &ClusterKey, subject: &str) -> Bytes {
        let mut buf = self.finish();
        let tag = key.mac(subject, &buf[MAC_LEN..]).finalize().into_bytes();
        buf[..MAC_LEN].copy_from_slice(&tag);
        buf.freeze()
    }
}

/// The envelopes of a bus message (without its signature): the one it holds, or a batch's
/// in order, and how many of the batch's were refused (malformed, or longer than
/// `max_envelope` bytes: skipped, so one bad envelope does not take its neighbours' frames
/// with it; their connections see the hole in their numbering). `None` if the message itself
/// is malformed, or is one envelope that would be refused.
pub fn decode_message(mut b: Bytes, max_envelope: usize) -> Option<(Vec<Envelope>, usize)> {
    if b.first() != Some(&BATCH) {
        if b.len() > max_envelope {
            return None;
        }
        return Envelope::decode(b).map(|env| (vec![env], 0));
    }
    if b.remaining() < BATCH_HEAD {
        return None;
    }
    b.advance(1);
    let count = b.get_u64();
    if count == 0 || count > BATCH_ENVELOPES as u64 {
        return None;
    }
    let mut envelopes = Vec::with_capacity(count as usize);
    let mut refused = 0;
    // The sending node's name is read once, however many envelopes carry it.
    let mut names = Names::default();
    for _ in 0..count {
        if b.remaining() < LEN {
            return None;
        }
        let len = b.get_u32() as usize;
        if len > b.remaining() {
            return None;
        }
        let one = b.split_to(len);
        match (len <= max_envelope)
            .then(|| Envelope::decode_with(one, &mut names))
            .flatten()
        {
            Some(env) => envelopes.push(env),
            None => refused += 1,
        }
    }
    b.is_empty().then_some((envelopes, refused))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(conn: u64, seq: u64, len: usize) -> Envelope {
        Envelope::Out {
            conn,
            seq,
            data: Bytes::from(vec![seq as u8; len]),
        }
    }

    #[test]
    fn the_envelopes_of_one_message_share_their_node_name() {
        let frame = |seq| Envelope::Frame {
            from: "node-a".into(),
            conn: 1,
            seq,
            data: Bytes::from_static(b"x"),
        };
        let mut writer = BatchWriter::with_capacity(0);
        for seq in 1..=3 {
            assert!(writer.push(&frame(seq), 1 << 16));
        }
        let (envelopes, refused) = decode_message(writer.body(), 1 << 16).expect("a batch");
        assert_eq!(refused, 0);
        let names: Vec<super::super::NodeName> = envelopes
            .iter()
            .filter_map(|env| match env {
                Envelope::Frame { from, .. } => Some(from.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(names.len(), 3);
        assert!(names.iter().all(|name| &**name == "node-a"));
        assert!(
            names
                .windows(2)
                .all(|pair| std::sync::Arc::ptr_eq(&pair[0], &pair[1])),
            "one allocation for the message's name, not one per frame"
        );
    }

    #[test]
    fn a_batch_carries_its_envelopes_in_order_within_its_bounds() {
        let key = ClusterKey::new("a-cluster-key-of-some-length").expect("key");
        // One envelope travels alone, exactly as it encodes by itself.
        let mut one = BatchWriter::with_capacity(0);
        assert!(one.push(&out(1, 1, 10), 100));
        assert_eq!(one.body(), out(1, 1, 10).encode());
        let mut one = BatchWriter::with_capacity(0);
        one.push(&out(1, 1, 10), 100);
        let sealed = one.seal(&key, "quire.node.n2");
        assert_eq!(
            key.open("quire.node.n2", sealed),
            Some(out(1, 1, 10).encode())
        );

        // Several: in order, signed once; one that would pass the limit is left for the next
        // message, but the first is always taken, however long.
        let mut writer = BatchWriter::with_capacity(0);
        assert!(
            writer.push(&out(1, 1, 500), 100),
            "the first is always taken"
        );
        assert!(!writer.push(&out(1, 2, 10), 100), "past the limit");
        let envelopes: Vec<Envelope> = (1..=5).map(|seq| out(seq % 2, seq, 20)).collect();
        let mut writer = BatchWriter::with_capacity(0);
        for env in &envelopes {
            assert!(writer.push(env, 1000));
        }
        assert_eq!(writer.count(), 5);
        let sealed = writer.seal(&key, "quire.node.n2");
        assert_eq!(key.open("quire.node.n3", sealed.clone()), None);
        let body = key.open("quire.node.n2", sealed).expect("signed for n2");
        assert_eq!(
            decode_message(body.clone(), 1024),
            Some((envelopes.clone(), 0))
        );
        // An envelope longer than the receiver takes, or malformed, is skipped and counted;
        // its neighbours are handed on. Alone, it is refused.
        let mut writer = BatchWriter::with_capacity(0);
        for env in [out(1, 1, 10), out(1, 2, 30), out(1, 3, 10)] {
            writer.push(&env, 1000);
        }
        let kept = vec![out(1, 1, 10), out(1, 3, 10)];
        assert_eq!(decode_message(writer.body(), 40), Some((kept, 1)));
        assert_eq!(decode_message(out(1, 1, 30).encode(), 20), None);
        let mut garbled = vec![BATCH];
        garbled.extend_from_slice(&2u64.to_be_bytes());
        for one in [&[99u8; 12][..], &out(1, 1, 10).encode()] {
            garbled.extend_from_slice(&(one.len() as u32).to_be_bytes());
            garbled.extend_from_slice(one);
        }
        assert_eq!(
            decode_message(Bytes::from(garbled), 1024),
            Some((vec![out(1, 1, 10)], 1))
        );

        // At most BATCH_ENVELOPES in one message.
        let mut writer = BatchWriter::with_capacity(0);
        let taken = (0..BATCH_ENVELOPES as u64 + 5)
            .take_while(|&seq| writer.push(&out(1, seq, 1), usize::MAX))
            .count();
        assert_eq!(taken, BATCH_ENVELOPES);

        // Malformed: cut short, bytes after the last, no envelopes, a count past the bound;
        // and a batch inside a batch, refused as an envelope.
        let cut = body.slice(..body.len() - 1);
        assert_eq!(decode_message(cut, 1024), None);
        let mut longer = body.to_vec();
        longer.push(0);
        assert_eq!(decode_message(Bytes::from(longer), 1024), None);
        let mut empty = vec![BATCH];
        empty.extend_from_slice(&0u64.to_be_bytes());
        assert_eq!(decode_message(Bytes::from(empty), 1024), None);
        let mut huge = vec![BATCH];
        huge.extend_from_slice(&(BATCH_ENVELOPES as u64 + 1).to_be_bytes());
        assert_eq!(decode_message(Bytes::from(huge), 1024), None);
        let mut nested = vec![BATCH];
        nested.extend_from_slice(&1u64.to_be_bytes());
        nested.extend_from_slice(&(body.len() as u32).to_be_bytes());
        nested.extend_from_slice(&body);
        assert_eq!(
            decode_message(Bytes::from(nested), 1024),
            Some((vec![], 1)),
            "a batch is never an envelope of a batch"
        );
    }
}
