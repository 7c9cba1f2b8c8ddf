//! What travels on the bus: the envelopes, their encoding, and the cluster key that signs
//! them.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::room::PeerAuth;

const OPEN: u8 = 1;
const FRAME: u8 = 2;
const ALIVE: u8 = 3;
const CLOSE: u8 = 4;
const OUT: u8 = 5;
const KILL: u8 = 6;
const BEAT: u8 = 7;
const CHANGED: u8 = 8;
/// (9 was a request that carried the caller's credential: no longer accepted.)
const REQUEST: u8 = 12;
const RESPONSE: u8 = 10;
const REAUTH: u8 = 11;
/// Several envelopes for one subject in one message (see `batch.rs`).
pub(super) const BATCH: u8 = 13;

/// Length of the signature in front of every message.
pub(super) const MAC_LEN: usize = 32;

/// Shortest cluster key accepted, in bytes.
pub const MIN_CLUSTER_KEY: usize = 16;

/// What must reach every node's sockets on a document.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// The document was deleted: close every socket on it (4404) and unload its room.
    Deleted,
    /// A user's role on the document changed: close that user's sockets on it (4403; they
    /// reconnect under the new role). `id` is the change's row in `doc_changes`, so each node
    /// acts on it once whether it learns of it from the bus or from the table.
    Access { user: String, id: i64 },
}

/// One message on the bus.
#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    /// A client of the sending node wants `doc`, which this node owns. `user` to `profile`
    /// are the client's [`Credential`] (see there).
    Open {
        from: NodeName,
        conn: u64,
        doc: String,
        auth: Credential,
    },
    Frame {
        from: NodeName,
        conn: u64,
        seq: u64,
        data: Bytes,
    },
    Alive {
        from: NodeName,
        conn: u64,
        /// The last `Frame` sequence number sent for this connection (0: none yet).
        sent: u64,
    },
    Close {
        from: NodeName,
        conn: u64,
    },
    Out {
        conn: u64,
        seq: u64,
        data: Bytes,
    },
    /// The owner's answer to `Alive`: the last `Out` sequence number it sent.
    Beat {
        conn: u64,
        sent: u64,
    },
    Kill {
        conn: u64,
        code: u16,
        reason: String,
    },
    /// To every node: a change to a document that its sockets must see.
    Changed {
        from: NodeName,
        /// When it was announced (milliseconds since the epoch, the sender's clock): a
        /// replayed announcement older than [`CHANGE_MAX_AGE`](super::CHANGE_MAX_AGE) is ignored.
        at_ms: i64,
        doc: String,
        change: Change,
    },
    /// An HTTP request that must run on the document's owner, answered with `Response`.
    Request(Forwarded),
    /// A relayed client's new credential (a Hocuspocus token refresh): the owner replaces the
    /// remote peer's permission and expiry, as it would a local one's. `user` to
    /// `seen_change` are the client's new [`Credential`] (a refresh carries no flags or
    /// profile).
    Reauth {
        from: NodeName,
        conn: u64,
        /// Its `hocuspocus` and `profile` are not carried (a refresh changes neither).
        auth: Credential,
    },
    /// The owner's answer to `Request` `id`.
    Response(ForwardAnswer),
}

/// An HTTP request that must run on the document's owner (a content write made through
/// another node), to be run through the owner's router (see `crate::http::owner`). It carries
/// the caller as the sending node verified it (`principal`, JSON), never the caller's
/// credential, and is bound to a fresh `nonce` and the time it was sent: the owner refuses
/// one older than `FORWARD_MAX_AGE` or whose nonce it has seen.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Forwarded {
    /// The node that sent it and its id for the exchange (set by [`super::Bus::request`]).
    pub from: NodeName,
    pub id: u64,
    /// A fresh nonce and when it was sent (milliseconds since the epoch, the sender's clock).
    pub nonce: String,
    pub sent_at_ms: i64,
    /// The caller as the sending node verified it (`auth::Principal` as JSON).
    pub principal: String,
    /// The method and URI (path and query).
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// The owner's answer to [`Forwarded`] request `id`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ForwardAnswer {
    pub id: u64,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

/// Which kind of message (for [`Faults`], and the entry-point table's rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::EnumIter, strum::IntoStaticStr)]
pub enum Kind {
    Open,
    Frame,
    Alive,
    Close,
    Out,
    Beat,
    Kill,
    Changed,
    Request,
    Response,
    Reauth,
    /// Several envelopes in one message: the wire's container, never an [`Envelope`] itself.
    Batch,
}

fn put_str(b: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    b.put_u16(s.len() as u16);
    b.put_slice(s);
}

/// A node's name as envelopes carry it: shared, so that the envelopes of one message (every
/// relayed frame names the node it comes from) share one allocation rather than one each.
pub type NodeName = std::sync::Arc<str>;

/// The node names met while decoding one message, each read once.
#[derive(Default)]
pub struct Names(Vec<NodeName>);

/// Most names a [`Names`] keeps (a message names its sender, rarely another node).
const NAMES: usize = 4;

fn get_name(b: &mut Bytes, names: &mut Names) -> Option<NodeName> {
    if b.remaining() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    if b.remaining() < n {
        return None;
    }
    let raw = b.split_to(n);
    if let Some(known) = names.0.iter().find(|name| name.as_bytes() == &raw[..]) {
        return Some(known.clone());
    }
    let name: NodeName = std::str::from_utf8(&raw).ok()?.into();
    if names.0.len() < NAMES {
        names.0.push(name.clone());
    }
    Some(name)
}

fn get_str(b: &mut Bytes) -> Option<String> {
    if b.remaining() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    if b.remaining() < n {
        return None;
    }
    String::from_utf8(b.split_to(n).to_vec()).ok()
}

fn put_headers(b: &mut BytesMut, headers: &[(String, String)]) {
    let n = headers.len().min(u16::MAX as usize);
    b.put_u16(n as u16);
    for (name, value) in &headers[..n] {
        put_str(b, name);
        put_str(b, value);
    }
}

fn get_headers(b: &mut Bytes) -> Option<Vec<(String, String)>> {
    if b.remaining() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    // Each pair takes at least 4 bytes: a count past that is not honoured before reading.
    let mut headers = Vec::with_capacity(n.min(b.remaining() / 4));
    for _ in 0..n {
        headers.push((get_str(b)?, get_str(b)?));
    }
    Some(headers)
}

fn get_u64(b: &mut Bytes) -> Option<u64> {
    (b.remaining() >= 8).then(|| b.get_u64())
}

/// A relayed client's credential, as `Open` and `Reauth` carry it: what the owner makes the
/// remote peer's [`PeerAuth`] of. (The token's id and issue time stay on the relaying node.)
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Credential {
    pub user: Option<String>,
    pub can_write: bool,
    /// When the client's token expires (seconds since the epoch): the owner closes the
    /// remote peer then, as it would a local one.
    pub expires_at: Option<i64>,
    /// The newest role change the client's permission reflects (`PeerAuth::seen_change`).
    pub seen_change: i64,
    /// A document of a Hocuspocus socket (`PeerAuth::hocuspocus`). Not in a `Reauth`.
    pub hocuspocus: bool,
    /// The user's profile name and colour (`PeerAuth::profile`), for the identity the owner
    /// stamps into the client's awareness states. Not in a `Reauth`.
    pub profile: Option<(String, String)>,
}

impl From<&PeerAuth> for Credential {
    /// What a relayed client's permission says, for its owner.
    fn from(auth: &PeerAuth) -> Credential {
        Credential {
            user: auth.user.as_deref().map(str::to_owned),
            can_write: auth.can_write,
            expires_at: auth.expires_at,
            seen_change: auth.seen_change,
            hocuspocus: auth.hocuspocus,
            profile: auth
                .profile
                .as_ref()
                .map(|(name, color)| (name.to_string(), color.to_string())),
        }
    }
}

/// How a message lays out the credential after its expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// `Open`: the change id, a flags byte and the profile, each left out when it and all
    /// after it are unset, as a node of an earlier version leaves them out; anything after
    /// the profile is a later version's and ignored.
    Open,
    /// `Reauth`: the change id, always, and nothing after it.
    Reauth,
}

impl Credential {
    /// Writes the credential, laid out as `layout` says.
    fn encode_into(&self, b: &mut BytesMut, layout: Layout) {
        b.put_u8(u8::from(self.can_write));
        match &self.user {
            Some(u) => {
                b.put_u8(1);
                put_str(b, u);
            }
            None => b.put_u8(0),
        }
        match self.expires_at {
            Some(exp) => {
                b.put_u8(1);
                b.put_i64(exp);
            }
            None => b.put_u8(0),
        }
        match layout {
            Layout::Reauth => b.put_i64(self.seen_change),
            Layout::Open => {
                let flagged = self.hocuspocus || self.profile.is_some();
                if self.seen_change != 0 || flagged {
                    b.put_i64(self.seen_change);
                }
                if flagged {
                    b.put_u8(u8::from(self.hocuspocus));
                }
                if let Some((name, color)) = &self.profile {
                    b.put_u8(1);
                    put_str(b, name);
                    put_str(b, color);
                }
            }
        }
    }

    /// Reads a credential laid out as `layout` says; `None` if it is malformed.
    fn decode_from(b: &mut Bytes, layout: Layout) -> Option<Credential> {
        if b.remaining() < 2 {
            return None;
        }
        let can_write = b.get_u8() == 1;
        let user = match b.get_u8() {
            1 => Some(get_str(b)?),
            _ => None,
        };
        if b.remaining() < 1 {
            return None;
        }
        let expires_at = match b.get_u8() {
            1 if b.remaining() >= 8 => Some(b.get_i64()),
            1 => return None,
            _ => None,
        };
        let mut credential = Credential {
            user,
            can_write,
            expires_at,
            ..Credential::default()
        };
        match layout {
            Layout::Reauth => {
                if b.remaining() != 8 {
                    return None;
                }
                credential.seen_change = b.get_i64();
            }
            Layout::Open => {
                // (Absent from an earlier version's message: every role change then applies.)
                credential.seen_change = match b.remaining() {
                    0 => 0,
                    8.. => b.get_i64(),
                    _ => return None,
                };
                // Flags, after the change id (absent: a y-websocket client).
                credential.hocuspocus = b.remaining() > 0 && b.get_u8() & 1 == 1;
                // The profile, after the flags.
                credential.profile = match b.remaining() > 0 && b.get_u8() == 1 {
                    true => Some((get_str(b)?, get_str(b)?)),
                    false => None,
                };
            }
        }
        Some(credential)
    }
}

impl From<Credential> for PeerAuth {
    /// The remote peer's credential on the owner.
    fn from(c: Credential) -> PeerAuth {
        PeerAuth {
            user: c.user.map(Into::into),
            token_id: None,
            issued_at: 0,
            can_write: c.can_write,
            expires_at: c.expires_at,
            seen_change: c.seen_change,
            hocuspocus: c.hocuspocus,
            profile: c.profile.map(|(name, color)| (name.into(), color.into())),
        }
    }
}

/// The kind byte and the header's u64 (a connection id, or a request's or change's id).
fn put_head(b: &mut BytesMut, kind: u8, id: u64) {
    b.put_u8(kind);
    b.put_u64(id);
}

impl Envelope {
    pub fn kind(&self) -> Kind {
        match self {
            Envelope::Open { .. } => Kind::Open,
            Envelope::Frame { .. } => Kind::Frame,
            Envelope::Alive { .. } => Kind::Alive,
            Envelope::Close { .. } => Kind::Close,
            Envelope::Out { .. } => Kind::Out,
            Envelope::Beat { .. } => Kind::Beat,
            Envelope::Kill { .. } => Kind::Kill,
            Envelope::Changed { .. } => Kind::Changed,
            Envelope::Request(_) => Kind::Request,
            Envelope::Response(_) => Kind::Response,
            Envelope::Reauth { .. } => Kind::Reauth,
        }
    }

    /// The credential an `Open` or a `Reauth` carries.
    pub fn credential(&self) -> Option<&Credential> {
        match self {
            Envelope::Open { auth, .. } | Envelope::Reauth { auth, .. } => Some(auth),
            _ => None,
        }
    }

    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode_into(&mut b);
        b.freeze()
    }

    /// Appends this envelope's encoding to `b`.
    pub fn encode_into(&self, b: &mut BytesMut) {
        match self {
            Envelope::Open {
                from, conn, doc, ..
            } => {
                put_head(b, OPEN, *conn);
                put_str(b, from);
                put_str(b, doc);
            }
            Envelope::Frame {
                from,
                conn,
                seq,
                data,
            } => {
                put_head(b, FRAME, *conn);
                b.put_u64(*seq);
                put_str(b, from);
                b.put_slice(data);
            }
            Envelope::Alive { from, conn, sent } => {
                put_head(b, ALIVE, *conn);
                b.put_u64(*sent);
                put_str(b, from);
            }
            Envelope::Close { from, conn } => {
                put_head(b, CLOSE, *conn);
                put_str(b, from);
            }
            Envelope::Out { conn, seq, data } => {
                put_head(b, OUT, *conn);
                b.put_u64(*seq);
                b.put_slice(data);
            }
            Envelope::Beat { conn, sent } => {
                put_head(b, BEAT, *conn);
                b.put_u64(*sent);
            }
            Envelope::Kill { conn, code, reason } => {
                put_head(b, KILL, *conn);
                b.put_u16(*code);
                put_str(b, reason);
            }
            Envelope::Changed {
                from,
                at_ms,
                doc,
                change,
            } => encode_changed(b, from, *at_ms, doc, change),
            Envelope::Request(Forwarded {
                from,
                id,
                nonce,
                sent_at_ms,
                principal,
                method,
                uri,
                headers,
                body,
            }) => {
                put_head(b, REQUEST, *id);
                put_str(b, from);
                put_str(b, nonce);
                b.put_i64(*sent_at_ms);
                put_str(b, principal);
                put_str(b, method);
                put_str(b, uri);
                put_headers(b, headers);
                b.put_slice(body);
            }
            Envelope::Reauth { from, conn, .. } => {
                put_head(b, REAUTH, *conn);
                put_str(b, from);
            }
            Envelope::Response(ForwardAnswer {
                id,
                status,
                headers,
                body,
            }) => {
                put_head(b, RESPONSE, *id);
                b.put_u16(*status);
                put_headers(b, headers);
                b.put_slice(body);
            }
        }
        // An `Open` and a `Reauth` end with the client's credential.
        if let Some(credential) = self.credential() {
            let layout = match self.kind() {
                Kind::Reauth => Layout::Reauth,
                _ => Layout::Open,
            };
            credential.encode_into(b, layout);
        }
    }

    /// Decodes a bus message (without its signature); `None` if it is malformed.
    pub fn decode(b: Bytes) -> Option<Envelope> {
        Envelope::decode_with(b, &mut Names::default())
    }

    /// [`Envelope::decode`], taking the node names it carries from `names` when they are
    /// there (the envelopes of one message).
    pub fn decode_with(mut b: Bytes, names: &mut Names) -> Option<Envelope> {
        if b.remaining() < 9 {
            return None;
        }
        let kind = b.get_u8();
        // A connection id, or a request's or change's id.
        let conn = b.get_u64();
        let b = &mut b;
        Some(match kind {
            OPEN => decode_open(conn, b, names)?,
            FRAME => {
                let seq = get_u64(b)?;
                let from = get_name(b, names)?;
                Envelope::Frame {
                    from,
                    conn,
                    seq,
                    data: std::mem::take(b),
                }
            }
            ALIVE => {
                let sent = get_u64(b)?;
                Envelope::Alive {
                    from: get_name(b, names)?,
                    conn,
                    sent,
                }
            }
            CLOSE => Envelope::Close {
                from: get_name(b, names)?,
                conn,
            },
            OUT => {
                let seq = get_u64(b)?;
                let data = std::mem::take(b);
                Envelope::Out { conn, seq, data }
            }
            BEAT => Envelope::Beat {
                conn,
                sent: get_u64(b)?,
            },
            KILL => {
                if b.remaining() < 2 {
                    return None;
                }
                let code = b.get_u16();
                Envelope::Kill {
                    conn,
                    code,
                    reason: get_str(b)?,
                }
            }
            CHANGED => decode_changed(conn, b, names)?,
            REQUEST => Envelope::Request(Forwarded {
                from: get_name(b, names)?,
                id: conn,
                nonce: get_str(b)?,
                sent_at_ms: (b.remaining() >= 8).then(|| b.get_i64())?,
                principal: get_str(b)?,
                method: get_str(b)?,
                uri: get_str(b)?,
                headers: get_headers(b)?,
                body: std::mem::take(b),
            }),
            REAUTH => decode_reauth(conn, b, names)?,
            RESPONSE => {
                if b.remaining() < 2 {
                    return None;
                }
                let status = b.get_u16();
                Envelope::Response(ForwardAnswer {
                    id: conn,
                    status,
                    headers: get_headers(b)?,
                    body: std::mem::take(b),
                })
            }
            _ => return None,
        })
    }
}

fn encode_changed(b: &mut BytesMut, from: &str, at_ms: i64, doc: &str, change: &Change) {
    // The change's id (0 for a delete, which needs none).
    let id = match change {
        Change::Access { id, .. } => *id as u64,
        Change::Deleted => 0,
    };
    put_head(b, CHANGED, id);
    b.put_i64(at_ms);
    put_str(b, from);
    put_str(b, doc);
    match change {
        Change::Deleted => b.put_u8(1),
        Change::Access { user, .. } => {
            b.put_u8(2);
            put_str(b, user);
        }
    }
}

/// An `Open` after its header.
fn decode_open(conn: u64, b: &mut Bytes, names: &mut Names) -> Option<Envelope> {
    let from = get_name(b, names)?;
    let doc = get_str(b)?;
    let auth = Credential::decode_from(b, Layout::Open)?;
    Some(Envelope::Open {
        from,
        conn,
        doc,
        auth,
    })
}

/// A `Reauth` after its header.
fn decode_reauth(conn: u64, b: &mut Bytes, names: &mut Names) -> Option<Envelope> {
    let from = get_name(b, names)?;
    let auth = Credential::decode_from(b, Layout::Reauth)?;
    Some(Envelope::Reauth { from, conn, auth })
}

/// A `Changed` after its header (`id`: the change's id, 0 for a delete).
fn decode_changed(id: u64, b: &mut Bytes, names: &mut Names) -> Option<Envelope> {
    let at_ms = get_u64(b)? as i64;
    let from = get_name(b, names)?;
    let doc = get_str(b)?;
    let change = match (b.remaining() >= 1).then(|| b.get_u8())? {
        1 => Change::Deleted,
        2 => Change::Access {
            user: get_str(b)?,
            id: id as i64,
        },
        _ => return None,
    };
    Some(Envelope::Changed {
        from,
        at_ms,
        doc,
        change,
    })
}

/// The cluster key: every message on the bus is signed with it, and only messages signed
/// with it are read.
#[derive(Clone)]
pub struct ClusterKey(Hmac<Sha256>);

impl ClusterKey {
    /// A key from the configured secret (at least [`MIN_CLUSTER_KEY`] bytes).
    pub fn new(secret: &str) -> anyhow::Result<ClusterKey> {
        if secret.len() < MIN_CLUSTER_KEY {
            anyhow::bail!(
                "the cluster key must be at least {MIN_CLUSTER_KEY} bytes (use a long random \
                 string, the same on every node)"
            );
        }
        Hmac::<Sha256>::new_from_slice(secret.as_bytes())
            .map(ClusterKey)
            .map_err(|e| anyhow::anyhow!("invalid cluster key: {e}"))
    }

    pub(super) fn mac(&self, subject: &str, body: &[u8]) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(subject.as_bytes());
        mac.update(&[0]);
        mac.update(body);
        mac
    }

    /// `body` with its signature for `subject` in front.
    pub fn seal(&self, subject: &str, body: &[u8]) -> Bytes {
        let tag = self.mac(subject, body).finalize().into_bytes();
        let mut b = BytesMut::with_capacity(MAC_LEN + body.len());
        b.put_slice(&tag);
        b.put_slice(body);
        b.freeze()
    }

    /// The body of a message received on `subject`, if its signature is good.
    pub fn open(&self, subject: &str, mut msg: Bytes) -> Option<Bytes> {
        if msg.len() < MAC_LEN {
            return None;
        }
        let body = msg.split_off(MAC_LEN);
        self.mac(subject, &body).verify_slice(&msg).ok()?;
        Some(body)
    }
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey([redacted])")
    }
}

#[cfg(test)]
mod tests;
