//! Hocuspocus' framing of the same messages: every message is prefixed with the document's
//! name (a varString), so one socket can carry several documents; a connection starts with an
//! `Auth` message carrying a token.

use bytes::{Bytes, BytesMut};
use yrs::encoding::read::{Cursor, Read};

use crate::put_var;

/// Hocuspocus' `Auth` message type, and its `Token` subtype.
pub const MSG_AUTH: u64 = 2;
pub const AUTH_TOKEN: u64 = 0;

/// Writes `s` as a lib0 varString.
pub fn put_str(buf: &mut BytesMut, s: &str) {
    put_var(buf, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// `msg` (a y-websocket message) prefixed with `doc`.
pub fn wrap(doc: &str, msg: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(msg.len() + doc.len() + 2);
    put_str(&mut buf, doc);
    buf.extend_from_slice(msg);
    buf.freeze()
}

/// The `Auth` message a client opens `doc` with, carrying `token`.
pub fn encode_auth(doc: &str, token: &str) -> Bytes {
    let mut buf = BytesMut::new();
    put_str(&mut buf, doc);
    put_var(&mut buf, MSG_AUTH);
    put_var(&mut buf, AUTH_TOKEN);
    put_str(&mut buf, token);
    buf.freeze()
}

/// A frame split into its document name and the message after it; `None` if the name is cut
/// short or not UTF-8.
pub fn unwrap(frame: &Bytes) -> Option<(String, Bytes)> {
    let mut cur = Cursor::new(frame);
    let doc = cur.read_string().ok()?.to_owned();
    Some((doc, frame.slice(cur.next..)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_message_unwraps_to_its_document_and_bytes() {
        let msg = crate::encode_update(&[0, 0]);
        let frame = wrap("notes/é", &msg);
        assert_eq!(unwrap(&frame), Some(("notes/é".to_owned(), msg)));
        assert_eq!(unwrap(&Bytes::from_static(&[5, b'a'])), None);
        let auth = encode_auth("d", "t");
        assert_eq!(auth.as_ref(), [1, b'd', 2, 0, 1, b't']);
    }
}
