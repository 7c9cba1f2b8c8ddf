//! The two wire flavours the load generator speaks: the y-websocket protocol (Quire, the
//! reference server) and Hocuspocus' (every message prefixed with the document name, and an
//! Auth message first).

use std::collections::HashSet;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use quire_protocol::{self as protocol, hocuspocus, Message};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::encoding::read::{Cursor, Read};
use yrs::updates::decoder::Decode;
use yrs::StateVector;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flavor {
    /// y-websocket: one socket per document, named by the URL path.
    YWebsocket,
    /// Hocuspocus: the document name prefixes every message; Auth comes first.
    Hocuspocus,
}

pub type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// What the generator cares about in a server message.
pub enum Incoming {
    Step1,
    Step2(Bytes),
    Update(Bytes),
    Ack(Bytes),
    Other,
}

/// Bytes read from a socket at most per read. tungstenite zeroes this much of its read buffer
/// before every read; at its default (128 KiB) that memset was half of the generator's CPU in
/// the fan-out scenario (one read per delivery), which made the generator the bottleneck.
const READ_BUFFER: usize = 8 * 1024;

/// How long a server may take to accept a WebSocket or to answer the sync handshake before the
/// scenario fails (with 10,000 connections opening at once, a slow server takes seconds).
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Bytes read from a socket at most per read by a client that receives a large document: the
/// memset matters less than the number of reads there.
pub const BULK_READ_BUFFER: usize = 256 * 1024;

fn client_config(read_buffer: usize) -> WebSocketConfig {
    // No size limit on what a server sends (a large document's Step 2 is one message), as in
    // a browser.
    WebSocketConfig::default()
        .read_buffer_size(read_buffer)
        .max_message_size(None)
        .max_frame_size(None)
}

/// Opens a socket to `doc` and sends the opening messages (Auth for Hocuspocus, Sync step 1).
pub async fn connect(base: &str, doc: &str, flavor: Flavor) -> anyhow::Result<Ws> {
    connect_with(base, doc, flavor, READ_BUFFER).await
}

/// [`connect`] with a read buffer of `read_buffer` bytes.
pub async fn connect_with(
    base: &str,
    doc: &str,
    flavor: Flavor,
    read_buffer: usize,
) -> anyhow::Result<Ws> {
    let base = base.trim_end_matches('/');
    let url = match flavor {
        Flavor::YWebsocket => format!("{base}/{doc}"),
        Flavor::Hocuspocus => base.to_owned(),
    };
    let mut ws = handshake(&url, read_buffer).await?;
    open_doc(&mut ws, doc, flavor).await?;
    Ok(ws)
}

/// A Hocuspocus socket (the base URL, as [`connect`] opens for that flavour) with no document
/// opened yet: [`open_doc`] opens each.
pub async fn connect_hocuspocus(base: &str) -> anyhow::Result<Ws> {
    handshake(base.trim_end_matches('/'), READ_BUFFER).await
}

/// The WebSocket handshake to `url`.
async fn handshake(url: &str, read_buffer: usize) -> anyhow::Result<Ws> {
    // TCP_NODELAY, as browsers do for WebSockets.
    let (ws, _) = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        tokio_tungstenite::connect_async_with_config(url, Some(client_config(read_buffer)), true),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{url}: no WebSocket handshake within {HANDSHAKE_TIMEOUT:?}"))??;
    Ok(ws)
}

/// Sends the opening messages of `doc` on an open socket: Auth for Hocuspocus (a Hocuspocus
/// socket may carry several documents, each opened so), then Sync step 1.
pub async fn open_doc(ws: &mut Ws, doc: &str, flavor: Flavor) -> anyhow::Result<()> {
    if flavor == Flavor::Hocuspocus {
        let auth = hocuspocus::encode_auth(doc, "");
        ws.send(WsMessage::Binary(auth)).await?;
    }
    let step1 = protocol::encode_step1(&StateVector::default());
    ws.send(WsMessage::Binary(wrap(flavor, doc, step1))).await?;
    Ok(())
}

/// A y-websocket message as the flavour sends it.
pub fn wrap(flavor: Flavor, doc: &str, msg: Bytes) -> Bytes {
    match flavor {
        Flavor::YWebsocket => msg,
        Flavor::Hocuspocus => hocuspocus::wrap(doc, &msg),
    }
}

/// The messages of one server frame.
pub fn parse(flavor: Flavor, frame: &Bytes) -> Vec<Incoming> {
    match flavor {
        Flavor::YWebsocket => protocol::decode_frame(frame)
            .map(|msgs| msgs.into_iter().map(incoming).collect())
            .unwrap_or_default(),
        Flavor::Hocuspocus => parse_hocuspocus(frame)
            .map(|(_doc, msgs)| msgs)
            .unwrap_or_default(),
    }
}

/// A Hocuspocus frame's address (the document's name) and its messages; `None` for a frame
/// without a readable address (a bare Ping or Pong).
pub fn parse_hocuspocus(frame: &Bytes) -> Option<(String, Vec<Incoming>)> {
    // varString(doc), varUint(type), body; one message per frame.
    let (doc, rest) = hocuspocus::unwrap(frame)?;
    let msgs = match rest.first() {
        Some(0) => protocol::decode_frame(&rest)
            .map(|msgs| msgs.into_iter().map(incoming).collect())
            .unwrap_or_default(),
        _ => vec![Incoming::Other],
    };
    Some((doc, msgs))
}

fn incoming(m: Message) -> Incoming {
    match m {
        Message::SyncStep1(_) => Incoming::Step1,
        Message::SyncStep2(u) => Incoming::Step2(u),
        Message::Update(u) => Incoming::Update(u),
        Message::DurableAck { raw } => Incoming::Ack(raw),
        _ => Incoming::Other,
    }
}

/// Reads frames until the initial Step 2 arrives (answering the server's Step 1 with `answer`).
/// Returns the Step 2 payload.
pub async fn wait_synced(
    ws: &mut Ws,
    flavor: Flavor,
    doc: &str,
    answer: &[u8],
) -> anyhow::Result<Bytes> {
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    while let Some(frame) = tokio::time::timeout_at(deadline, ws.next())
        .await
        .map_err(|_| anyhow::anyhow!("{doc}: not synced within {HANDSHAKE_TIMEOUT:?}"))?
    {
        let WsMessage::Binary(data) = frame? else {
            continue;
        };
        for m in parse(flavor, &data) {
            match m {
                Incoming::Step1 => {
                    let reply = wrap(flavor, doc, protocol::encode_step2(answer));
                    ws.send(WsMessage::Binary(reply)).await?;
                }
                Incoming::Step2(u) => return Ok(u),
                _ => {}
            }
        }
    }
    anyhow::bail!("closed before sync")
}

/// [`wait_synced`] for the Hocuspocus documents `docs` of one socket: reads frames until each
/// has had its initial Step 2, answering each Step 1 with `answer` for its document. What
/// else arrives (for a document already synced, or for none of `docs`) is dropped: nobody
/// types before every socket is synced.
pub async fn wait_synced_all(ws: &mut Ws, docs: &[String], answer: &[u8]) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    let mut waiting: HashSet<&str> = docs.iter().map(String::as_str).collect();
    while !waiting.is_empty() {
        let frame = tokio::time::timeout_at(deadline, ws.next())
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{} of {} documents not synced within {HANDSHAKE_TIMEOUT:?}",
                    waiting.len(),
                    docs.len()
                )
            })?;
        let Some(frame) = frame else {
            anyhow::bail!("closed before sync")
        };
        let WsMessage::Binary(data) = frame? else {
            continue;
        };
        let Some((address, msgs)) = parse_hocuspocus(&data) else {
            continue;
        };
        let name = hocuspocus::doc_name(&address);
        let Some(doc) = docs.iter().find(|d| d.as_str() == name) else {
            continue;
        };
        for m in msgs {
            match m {
                Incoming::Step1 => {
                    let reply = wrap(Flavor::Hocuspocus, doc, protocol::encode_step2(answer));
                    ws.send(WsMessage::Binary(reply)).await?;
                }
                Incoming::Step2(_) => {
                    waiting.remove(doc.as_str());
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The (client, start clock) pairs of the structs in an update.
///
/// An update from one client (every send of the typing scenario, relayed as is) is read from
/// its header alone: clients count 1, then the group's struct count, client and clock. Others
/// are decoded in full (a full decode allocates the blocks, for every delivery).
pub fn update_ids(update: &[u8]) -> Vec<(u64, u32)> {
    let mut cur = Cursor::new(update);
    let header = (|| -> Option<(u32, u64, u32)> {
        let clients: u32 = cur.read_var().ok()?;
        let _structs: u32 = cur.read_var().ok()?;
        let client: u64 = cur.read_var().ok()?;
        let clock: u32 = cur.read_var().ok()?;
        Some((clients, client, clock))
    })();
    if let Some((1, client, clock)) = header {
        return vec![(client, clock)];
    }
    match yrs::Update::decode_v1(update) {
        Ok(u) => u
            .state_vector_lower()
            .iter()
            .map(|(c, clock)| (c.get(), *clock))
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use yrs::{Doc, Text, Transact};

    use super::*;

    fn typed(client: u64, times: usize) -> Vec<Vec<u8>> {
        let doc = Doc::with_client_id(client);
        let text = doc.get_or_insert_text("text");
        (0..times)
            .map(|_| {
                let mut txn = doc.transact_mut();
                text.insert(&mut txn, 0, "x");
                txn.encode_update_v1()
            })
            .collect()
    }

    fn decoded(update: &[u8]) -> Vec<(u64, u32)> {
        let u = yrs::Update::decode_v1(update).expect("valid update");
        let mut ids: Vec<_> = u
            .state_vector_lower()
            .iter()
            .map(|(c, clock)| (c.get(), *clock))
            .collect();
        ids.sort();
        ids
    }

    #[test]
    fn one_client_updates_are_read_from_the_header() {
        // A large client id (several varint bytes) and a clock past one byte.
        let updates = typed(9_007_199_254_740_000, 200);
        for (i, update) in updates.iter().enumerate() {
            assert_eq!(update_ids(update), vec![(9_007_199_254_740_000, i as u32)]);
            assert_eq!(update_ids(update), decoded(update));
        }
    }

    #[test]
    fn updates_of_several_clients_are_decoded_in_full() {
        let a = typed(7, 3).pop().expect("three updates");
        let b = typed(1_000_001, 1).pop().expect("one update");
        let merged = yrs::merge_updates_v1([a.as_slice(), b.as_slice()]).expect("mergeable");
        let mut ids = update_ids(&merged);
        ids.sort();
        assert_eq!(ids, vec![(7, 2), (1_000_001, 0)]);
        assert_eq!(ids, decoded(&merged));
        // Not an update at all: nothing, rather than a panic.
        assert_eq!(update_ids(&[0xff]), Vec::new());
    }
}
