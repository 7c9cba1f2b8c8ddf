//! The editing trace replayed as editing sessions (the `history` and `branches` scenarios):
//! each session its own connection with a fresh client id and its author's own token,
//! committed with a durable acknowledgement, then a pause longer than the server's
//! `--version-idle`, so the server ends the session there.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use quire_protocol as protocol;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::updates::decoder::Decode;
use yrs::{Doc, ReadTxn, StateVector, Text, Transact};

use crate::{wire, Common};

/// Where the sessions go and how.
pub struct Replay<'a> {
    pub common: &'a Common,
    pub http: &'a reqwest::Client,
    /// `http://host:port`
    pub http_base: &'a str,
    pub admin_key: &'a str,
    pub doc: &'a str,
    /// Pause after each session
    pub pause: Duration,
}

/// A token for `user` on `doc`, issued with the admin key.
pub async fn token(
    http: &reqwest::Client,
    http_base: &str,
    admin_key: &str,
    user: &str,
    doc: &str,
    permission: &str,
) -> anyhow::Result<String> {
    let token: serde_json::Value = http
        .post(format!("{http_base}/api/v1/tokens"))
        .bearer_auth(admin_key)
        .json(&serde_json::json!({"user": user, "doc": doc, "permission": permission}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(token["token"]
        .as_str()
        .context("no token issued")?
        .to_owned())
}

/// Replays `edits` as `sessions` sessions in order, session i by `author(i)`, starting from an
/// empty text. Returns the time spent sending and waiting for the acknowledgements (pauses
/// and token requests left out).
pub async fn replay(
    r: &Replay<'_>,
    edits: &[(u32, u32, String)],
    sessions: usize,
    author: impl Fn(usize) -> String,
) -> anyhow::Result<Duration> {
    let c = r.common;
    let doc = Doc::with_client_id(424_242);
    let per_session = edits.len().div_ceil(sessions.max(1));
    let mut ingest = Duration::ZERO;
    for (i, chunk) in edits.chunks(per_session.max(1)).enumerate() {
        let token = token(r.http, r.http_base, r.admin_key, &author(i), r.doc, "write").await?;
        // A fresh client id per session, as a new editor tab would have.
        let author_doc = Doc::with_client_id(1000 + i as u64);
        author_doc
            .transact_mut()
            .apply_update(yrs::Update::decode_v1(
                &doc.transact()
                    .encode_state_as_update_v1(&StateVector::default()),
            )?)?;
        let author_text = author_doc.get_or_insert_text("text");
        let frames: Vec<WsMessage> = chunk
            .iter()
            .map(|(pos, del, ins)| {
                let mut txn = author_doc.transact_mut();
                if *del > 0 {
                    author_text.remove_range(&mut txn, *pos, *del);
                }
                if !ins.is_empty() {
                    author_text.insert(&mut txn, *pos, ins);
                }
                WsMessage::Binary(protocol::encode_update(&txn.encode_update_v1()))
            })
            .collect();
        let mut ws = wire::connect(&c.url, &format!("{}?token={token}", r.doc), c.flavor).await?;
        wire::wait_synced(&mut ws, c.flavor, r.doc, &[0, 0]).await?;
        let sent = Instant::now();
        let mut msgs = futures_util::stream::iter(frames.into_iter().map(Ok));
        ws.send_all(&mut msgs).await?;
        ws.send(WsMessage::Binary(protocol::encode_durable_ack(
            i as u64 + 1,
        )))
        .await?;
        loop {
            match tokio::time::timeout(Duration::from_secs(60), ws.next()).await {
                Ok(Some(Ok(WsMessage::Binary(data)))) => {
                    if protocol::read_durable_ack(&data) == Some(i as u64 + 1) {
                        break;
                    }
                }
                Ok(Some(Ok(_))) => {}
                other => anyhow::bail!("session {i}: no durable acknowledgement ({other:?})"),
            }
        }
        ingest += sent.elapsed();
        let _ = ws.close(None).await;
        // The server's document now holds the session: the next author starts from it.
        doc.transact_mut().apply_update(yrs::Update::decode_v1(
            &author_doc
                .transact()
                .encode_state_as_update_v1(&StateVector::default()),
        )?)?;
        tokio::time::sleep(r.pause).await;
    }
    Ok(ingest)
}
