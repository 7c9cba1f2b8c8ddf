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

/// Hocuspocus' message types (`@hocuspocus/common`, provider 3.x and 4.x).
pub mod types {
    pub const SYNC: u64 = 0;
    pub const AWARENESS: u64 = 1;
    pub const AUTH: u64 = 2;
    pub const QUERY_AWARENESS: u64 = 3;
    pub const SYNC_REPLY: u64 = 4;
    pub const STATELESS: u64 = 5;
    pub const BROADCAST_STATELESS: u64 = 6;
    pub const CLOSE: u64 = 7;
    pub const SYNC_STATUS: u64 = 8;
    /// Ping and Pong (provider 4.x only) are bare one-byte frames, without an address.
    pub const PING: u8 = 9;
    pub const PONG: u8 = 10;
}

/// The subtypes of an `Auth` message.
pub mod auth {
    pub const TOKEN: u64 = 0;
    pub const PERMISSION_DENIED: u64 = 1;
    pub const AUTHENTICATED: u64 = 2;
}

/// One Hocuspocus frame: one message (the provider reads exactly one per frame).
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    Addressed(Addressed),
    /// `[9]`: the 4.x provider answers with a Pong.
    Ping,
    /// `[10]`.
    Pong,
}

/// A message for one document of the socket.
#[derive(Debug, Clone, PartialEq)]
pub struct Addressed {
    /// The address exactly as sent (`name`, or `name\0session` from a 4.x provider with
    /// session awareness): replies carry it back unchanged, the provider routes by it.
    pub address: String,
    pub message: HpMessage,
}

impl Addressed {
    /// The document's name: the address up to its first NUL.
    pub fn doc_name(&self) -> &str {
        self.address
            .split_once('\0')
            .map_or(self.address.as_str(), |(name, _)| name)
    }
}

/// The messages of the Hocuspocus protocol. [`HpMessageKind`] names each kind.
#[derive(Debug, Clone, PartialEq, strum::EnumDiscriminants)]
#[strum_discriminants(name(HpMessageKind), derive(strum::EnumIter, strum::IntoStaticStr))]
pub enum HpMessage {
    /// Sync (0): a y-protocols sync message (Step1, Step2 or Update), decoded like
    /// y-websocket's.
    Sync(crate::Message),
    /// SyncReply (4): the same, sent by servers to each other.
    SyncReply(crate::Message),
    /// Awareness (1), decoded; `raw` is the y-websocket form of the message.
    Awareness(crate::Message),
    /// Auth (2) with a token, and (4.x) the provider's version after it.
    Token {
        token: String,
        version: Option<String>,
    },
    /// Auth (2): the server refuses the document.
    PermissionDenied(String),
    /// Auth (2): the server accepts, with the scope `read-write` or `readonly`.
    Authenticated(String),
    /// Auth (2) without a token: the server asks for one.
    TokenRequest,
    QueryAwareness,
    Stateless(String),
    BroadcastStateless(String),
    /// Close (7); the provider sends it without a reason.
    Close(Option<String>),
    /// SyncStatus (8): whether the update the receiver sent was applied.
    SyncStatus(bool),
}

/// The start of an addressed frame, read without decoding its body or copying its address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head<'a> {
    /// The address exactly as sent (see [`Addressed::address`]), borrowed from the frame.
    pub address: &'a str,
    /// The message type ([`types`]).
    pub kind: u64,
    /// Where the message starts (its type): for Sync, Awareness and QueryAwareness, the frame
    /// from here on is the same message in y-websocket's framing.
    pub message_at: usize,
    /// The byte after the type, if any (a Sync message's subtype).
    pub subtype: Option<u8>,
}

impl<'a> Head<'a> {
    /// The document's name: the address up to its first NUL.
    pub fn doc_name(&self) -> &'a str {
        doc_name(self.address)
    }
}

/// The document an address names: the address up to its first NUL (a 4.x provider with
/// session awareness appends `\0` and a session id).
pub fn doc_name(address: &str) -> &str {
    address.split_once('\0').map_or(address, |(name, _)| name)
}

/// Reads a frame's address and type. `Ok(None)` for a bare Ping or Pong.
pub fn head(frame: &Bytes) -> Result<Option<Head<'_>>, crate::DecodeError> {
    match frame.as_ref() {
        [] => return Err(crate::DecodeError::Empty),
        [types::PING] | [types::PONG] => return Ok(None),
        _ => {}
    }
    let mut cur = Cursor::new(frame);
    // The address's bytes (length-prefixed), borrowed from the frame rather than the cursor.
    let len = cur
        .read_buf()
        .map_err(|e| crate::malformed(0, format!("address: {e}")))?
        .len();
    let message_at = cur.next;
    let address = std::str::from_utf8(&frame[message_at - len..message_at])
        .map_err(|e| crate::malformed(0, format!("address: {e}")))?;
    let kind: u64 = cur
        .read_var()
        .map_err(|e| crate::malformed(message_at, e))?;
    Ok(Some(Head {
        address,
        kind,
        message_at,
        subtype: frame.get(cur.next).copied(),
    }))
}

/// Decodes one frame: an addressed message with nothing after it, or a Ping or Pong.
pub fn decode(frame: &Bytes) -> Result<Frame, crate::DecodeError> {
    let Some(Head {
        address,
        kind,
        message_at: at,
        ..
    }) = head(frame)?
    else {
        return Ok(if frame.as_ref() == [types::PING] {
            Frame::Ping
        } else {
            Frame::Pong
        });
    };
    // Past the type `head` read.
    let mut cur = Cursor::new(frame);
    cur.next = at;
    let _kind: u64 = cur.read_var().map_err(|e| crate::malformed(at, e))?;
    let body = frame.slice(cur.next..);
    let string = |cur: &mut Cursor<'_>| -> Result<String, crate::DecodeError> {
        let at = cur.next;
        Ok(cur
            .read_string()
            .map_err(|e| crate::malformed(at, e))?
            .to_owned())
    };
    // A y-websocket message: the sync and awareness bodies are the same after the address.
    let y_message = |tag: u64| -> Result<crate::Message, crate::DecodeError> {
        let mut buf = BytesMut::with_capacity(body.len() + 1);
        crate::put_var(&mut buf, tag);
        buf.extend_from_slice(&body);
        let mut messages = crate::decode_frame_max(&buf.freeze(), 1)?;
        messages.pop().ok_or(crate::DecodeError::Empty)
    };
    let message = match kind {
        types::SYNC => HpMessage::Sync(y_message(0)?),
        types::SYNC_REPLY => HpMessage::SyncReply(y_message(0)?),
        types::AWARENESS => HpMessage::Awareness(y_message(1)?),
        types::QUERY_AWARENESS => HpMessage::QueryAwareness,
        types::AUTH => {
            let at = cur.next;
            let sub: u64 = cur.read_var().map_err(|e| crate::malformed(at, e))?;
            match sub {
                auth::TOKEN if cur.next == frame.len() => HpMessage::TokenRequest,
                auth::TOKEN => {
                    let token = string(&mut cur)?;
                    let version = if cur.next < frame.len() {
                        Some(string(&mut cur)?)
                    } else {
                        None
                    };
                    HpMessage::Token { token, version }
                }
                auth::PERMISSION_DENIED => HpMessage::PermissionDenied(string(&mut cur)?),
                auth::AUTHENTICATED => HpMessage::Authenticated(string(&mut cur)?),
                other => return Err(crate::malformed(at, format!("unknown auth type {other}"))),
            }
        }
        types::STATELESS => HpMessage::Stateless(string(&mut cur)?),
        types::BROADCAST_STATELESS => HpMessage::BroadcastStateless(string(&mut cur)?),
        types::CLOSE if cur.next == frame.len() => HpMessage::Close(None),
        types::CLOSE => HpMessage::Close(Some(string(&mut cur)?)),
        types::SYNC_STATUS => {
            let at = cur.next;
            let applied: u64 = cur.read_var().map_err(|e| crate::malformed(at, e))?;
            HpMessage::SyncStatus(applied == 1)
        }
        other => {
            return Err(crate::malformed(
                at,
                format!("unknown message type {other}"),
            ));
        }
    };
    // Sync and awareness bodies were checked whole by the y-websocket decoder.
    let whole = matches!(
        message,
        HpMessage::Sync(_) | HpMessage::SyncReply(_) | HpMessage::Awareness(_)
    );
    if !whole && cur.next != frame.len() {
        return Err(crate::malformed(
            cur.next,
            "bytes after the message (one message per frame)",
        ));
    }
    Ok(Frame::Addressed(Addressed {
        address: address.to_owned(),
        message,
    }))
}

fn addressed(address: &str, kind: u64) -> BytesMut {
    let mut buf = BytesMut::with_capacity(address.len() + 16);
    put_str(&mut buf, address);
    put_var(&mut buf, kind);
    buf
}

/// `Authenticated` with `scope` (`read-write` or `readonly`).
pub fn encode_authenticated(address: &str, scope: &str) -> Bytes {
    let mut buf = addressed(address, types::AUTH);
    put_var(&mut buf, auth::AUTHENTICATED);
    put_str(&mut buf, scope);
    buf.freeze()
}

/// `PermissionDenied` with `reason`.
pub fn encode_permission_denied(address: &str, reason: &str) -> Bytes {
    let mut buf = addressed(address, types::AUTH);
    put_var(&mut buf, auth::PERMISSION_DENIED);
    put_str(&mut buf, reason);
    buf.freeze()
}

/// An `Auth` asking the provider for a (new) token.
pub fn encode_token_request(address: &str) -> Bytes {
    let mut buf = addressed(address, types::AUTH);
    put_var(&mut buf, auth::TOKEN);
    buf.freeze()
}

/// `SyncStatus`: the update the provider sent was applied (`true`) or refused.
pub fn encode_sync_status(address: &str, applied: bool) -> Bytes {
    let mut buf = addressed(address, types::SYNC_STATUS);
    put_var(&mut buf, u64::from(applied));
    buf.freeze()
}

/// `Close` of one document on the socket, with a reason.
pub fn encode_close(address: &str, reason: &str) -> Bytes {
    let mut buf = addressed(address, types::CLOSE);
    put_str(&mut buf, reason);
    buf.freeze()
}

/// `Stateless` with `payload`.
pub fn encode_stateless(address: &str, payload: &str) -> Bytes {
    let mut buf = addressed(address, types::STATELESS);
    put_str(&mut buf, payload);
    buf.freeze()
}

/// The `Auth` a 4.x provider opens a document with: the token, then its version.
pub fn encode_auth_with_version(address: &str, token: &str, version: &str) -> Bytes {
    let mut buf = addressed(address, types::AUTH);
    put_var(&mut buf, auth::TOKEN);
    put_str(&mut buf, token);
    put_str(&mut buf, version);
    buf.freeze()
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

    fn addressed_message(frame: &Bytes) -> Addressed {
        match decode(frame).expect("decodes") {
            Frame::Addressed(a) => a,
            other => panic!("not addressed: {other:?}"),
        }
    }

    #[test]
    fn auth_of_both_provider_majors_and_the_answers() {
        // 3.x: the token alone; 4.x: the token and the provider's version.
        let v3 = encode_auth("notes", "tok");
        assert_eq!(
            addressed_message(&v3).message,
            HpMessage::Token {
                token: "tok".into(),
                version: None
            }
        );
        let v4 = encode_auth_with_version("notes", "tok", "4.8.0");
        assert_eq!(
            addressed_message(&v4).message,
            HpMessage::Token {
                token: "tok".into(),
                version: Some("4.8.0".into())
            }
        );
        let ok = encode_authenticated("notes", "read-write");
        assert_eq!(ok.as_ref()[..8], [5, b'n', b'o', b't', b'e', b's', 2, 2]);
        assert_eq!(
            addressed_message(&ok).message,
            HpMessage::Authenticated("read-write".into())
        );
        assert_eq!(
            addressed_message(&encode_permission_denied("notes", "no")).message,
            HpMessage::PermissionDenied("no".into())
        );
        assert_eq!(
            addressed_message(&encode_token_request("notes")).message,
            HpMessage::TokenRequest
        );
    }

    #[test]
    fn a_session_address_is_echoed_whole_and_names_its_document() {
        let frame = wrap("notes\0k2j3h", &crate::encode_update(&[0, 0]));
        let a = addressed_message(&frame);
        assert_eq!(a.address, "notes\0k2j3h");
        assert_eq!(a.doc_name(), "notes");
        assert_eq!(
            a.message,
            HpMessage::Sync(crate::Message::Update(Bytes::from_static(&[0, 0])))
        );
    }

    #[test]
    fn status_close_stateless_ping_and_pong() {
        assert_eq!(encode_sync_status("d", true).as_ref(), [1, b'd', 8, 1]);
        assert_eq!(
            addressed_message(&encode_sync_status("d", false)).message,
            HpMessage::SyncStatus(false)
        );
        // The provider closes a document with an empty body; the server answers with a reason.
        assert_eq!(
            addressed_message(&Bytes::from_static(&[1, b'd', 7])).message,
            HpMessage::Close(None)
        );
        assert_eq!(
            addressed_message(&encode_close("d", "provider_initiated")).message,
            HpMessage::Close(Some("provider_initiated".into()))
        );
        assert_eq!(
            addressed_message(&encode_stateless("d", "{\"a\":1}")).message,
            HpMessage::Stateless("{\"a\":1}".into())
        );
        assert_eq!(decode(&Bytes::from_static(&[9])), Ok(Frame::Ping));
        assert_eq!(decode(&Bytes::from_static(&[10])), Ok(Frame::Pong));
    }

    #[test]
    fn malformed_frames_are_errors() {
        for bad in [
            &[][..],
            &[5, b'a'][..],             // address cut short
            &[1, b'd'][..],             // no type
            &[1, b'd', 99][..],         // unknown type
            &[1, b'd', 2, 7, 0][..],    // unknown auth type
            &[1, b'd', 5, 4, b'x'][..], // stateless cut short
            &[1, b'd', 8, 1, 0][..],    // a second message in the frame
            &[1, b'd', 0, 9, 0][..],    // unknown sync type
            &[1, b'd', 0, 2, 5, 0][..], // update cut short
        ] {
            assert!(decode(&Bytes::copy_from_slice(bad)).is_err(), "{bad:?}");
        }
    }
}
