//! Large documents: a seeded document of a given encoded size, uploaded through one client, and
//! the join storm (many clients opening it at the same moment).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::SinkExt;
use quire_protocol as protocol;
use rand::{Rng, SeedableRng};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::{Doc, GetString, ReadTxn, Text, Transact};

use crate::wire;
use crate::{histogram, ms, process_rss_kib, Common};

/// Characters per insert of the seeded document: typed words and pasted sentences.
const INSERT_CHARS: usize = 48;
/// A deletion of a few characters every this many inserts, so the delete set is not empty.
const DELETE_EVERY: usize = 8;
/// The cursor jumps to a random position every this many inserts.
const JUMP_EVERY: usize = 64;

/// The updates that build a document of about `bytes` encoded bytes (Yjs v1) in the text root
/// `text`, one update of about `chunk` bytes each. Each update is one client's typing, made
/// without seeing the others (they merge as concurrent edits): runs of inserts of
/// [`INSERT_CHARS`] characters at a cursor that jumps to a random position now and then, and
/// small deletions. A fixed seed, so every server gets the same document. (Building one
/// 20 MB text in a single `Doc` insert by insert takes yrs minutes.) Returns the updates and
/// the document's text and encoded size.
pub fn seeded_updates(bytes: usize, chunk: usize, seed: u64) -> (Vec<Vec<u8>>, String, usize) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut updates: Vec<Vec<u8>> = Vec::new();
    let mut total = 0;
    while total < bytes {
        // Client ids of their own (above 2^40), apart from the typing clients' (1,000,000 + i):
        // a typing client that reused a seeded id would send clocks the document already has,
        // and its updates would change nothing.
        let doc =
            Doc::with_client_id((1 << 40) + seed % 1000 * 1_000_000 + updates.len() as u64 + 1);
        let text = doc.get_or_insert_text("text");
        let mut txn = doc.transact_mut();
        let (mut len, mut cursor, mut in_chunk): (u32, u32, usize) = (0, 0, 0);
        let mut i = 0;
        // A chunk's encoded size is roughly its inserted text plus a few bytes per item.
        while in_chunk < chunk {
            let word: String = (0..INSERT_CHARS)
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect();
            if i % JUMP_EVERY == 0 {
                cursor = if len == 0 {
                    0
                } else {
                    rng.random_range(0..=len)
                };
            }
            text.insert(&mut txn, cursor, &word);
            len += INSERT_CHARS as u32;
            cursor += INSERT_CHARS as u32;
            in_chunk += INSERT_CHARS + 12;
            i += 1;
            if i % DELETE_EVERY == 0 && cursor > 16 {
                text.remove_range(&mut txn, cursor - 12, 4);
                len -= 4;
                cursor -= 4;
            }
        }
        drop(txn);
        // The whole (committed, so squashed) state of this client's document.
        let update = doc
            .transact()
            .encode_state_as_update_v1(&yrs::StateVector::default());
        total += update.len();
        updates.push(update);
    }
    let doc = Doc::new();
    let text = doc.get_or_insert_text("text");
    let mut txn = doc.transact_mut();
    for u in &updates {
        if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u) {
            let _ = txn.apply_update(u);
        }
    }
    drop(txn);
    let txn = doc.transact();
    let content = text.get_string(&txn);
    let encoded = txn
        .encode_state_as_update_v1(&yrs::StateVector::default())
        .len();
    (updates, content, encoded)
}

/// Sends `updates` to `doc` through one client, then waits until a new client's initial sync
/// carries at least `expect_bytes` (the server has taken them all), at most `timeout`.
pub async fn upload(
    c: &Common,
    doc: &str,
    updates: &[Vec<u8>],
    expect_bytes: usize,
    timeout: Duration,
) -> anyhow::Result<()> {
    let mut ws = wire::connect(&c.url, doc, c.flavor).await?;
    wire::wait_synced(&mut ws, c.flavor, doc, &[0, 0]).await?;
    for u in updates {
        let frame = wire::wrap(c.flavor, doc, protocol::encode_update(u));
        ws.send(WsMessage::Binary(frame)).await?;
    }
    let deadline = Instant::now() + timeout;
    loop {
        let mut probe = wire::connect_with(&c.url, doc, c.flavor, wire::BULK_READ_BUFFER).await?;
        // A probe that joins while the upload commits may also be sent the updates and
        // overflow its outbound queue (the server closes it to resync): try again.
        let held = wire::wait_synced(&mut probe, c.flavor, doc, &[0, 0])
            .await
            .map(|state| state.len())
            .unwrap_or(0);
        drop(probe);
        if held >= expect_bytes {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{doc}: the server holds {held} of {expect_bytes} bytes after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(ws);
    Ok(())
}

#[derive(clap::Args, Clone)]
pub struct StormArgs {
    #[command(flatten)]
    pub common: Common,
    /// Clients that open the document at the same moment
    #[arg(long, default_value_t = 150)]
    pub clients: usize,
    /// Encoded size of the document, MiB
    #[arg(long, default_value_t = 20.0)]
    pub doc_mb: f64,
    /// Skip the upload: the document is already stored (after a restart, say)
    #[arg(long)]
    pub no_upload: bool,
    /// Give up on an upload the server has not taken by then
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Bytes per update of the seeded document.
pub const CHUNK: usize = 512 * 1024;
/// The seed of the seeded document (the same document for every server and run).
pub const SEED: u64 = 20_261_202;

/// The join storm: uploads the seeded document (unless `--no-upload`), then opens `clients`
/// sockets to it at the same moment, each sending Sync Step 1 with an empty state vector, and
/// times each until its Step 2 arrives (checked to hold the whole document), with the
/// server's RSS before and its peak during the storm.
pub async fn storm(args: StormArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let doc_name = format!("{}-large", c.prefix);
    let (updates, content, encoded) =
        seeded_updates((args.doc_mb * 1048576.0) as usize, CHUNK, SEED);
    // The server may encode the same content slightly differently (merged deletions).
    let expect = encoded * 95 / 100;
    eprintln!(
        "{}: the seeded document: {} updates, {encoded} bytes",
        c.label,
        updates.len()
    );
    let rss_fresh = c.server_pid.and_then(process_rss_kib);
    let upload_started = Instant::now();
    if !args.no_upload {
        upload(c, &doc_name, &updates, expect, args.timeout)
            .await
            .context("upload")?;
    }
    let upload_s = upload_started.elapsed().as_secs_f64();
    eprintln!("{}: uploaded in {upload_s:.1} s", c.label);
    let rss_before = c.server_pid.and_then(process_rss_kib);
    // Reset the peak (VmHWM) to the current RSS, so the peak is the storm's (Linux, as root
    // or the server's user; without it the peak may be the upload's).
    let peak_reset = c
        .server_pid
        .is_some_and(|pid| std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok());
    let (cpu0, server_cpu0) = (
        crate::own_cpu_seconds(),
        c.server_pid.and_then(crate::process_cpu_seconds),
    );
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(args.clients));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (url, flavor, name) = (c.url.clone(), c.flavor, doc_name.clone());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let started = Instant::now();
                let mut ws =
                    wire::connect_with(&url, &name, flavor, wire::BULK_READ_BUFFER).await?;
                let state = wire::wait_synced(&mut ws, flavor, &name, &[0, 0]).await?;
                let took = started.elapsed();
                anyhow::Ok((took, state.len(), ws))
            })
        })
        .collect();
    let mut lat = histogram();
    let mut sockets = Vec::with_capacity(args.clients);
    let mut short = 0;
    for t in tasks {
        let (took, len, ws) = t.await??;
        if len < expect {
            short += 1;
        }
        let _ = lat.record(took.as_micros().max(1) as u64);
        sockets.push(ws);
    }
    let peak = c
        .server_pid
        .and_then(|pid| crate::proc_status_kib(pid, "VmHWM:"));
    let bench_cpu = crate::own_cpu_seconds() - cpu0;
    let server_cpu = c
        .server_pid
        .and_then(crate::process_cpu_seconds)
        .zip(server_cpu0)
        .map(|(b, a)| b - a);
    drop(sockets);
    // The text the clients got: one more client, applied in full.
    let mut check = wire::connect_with(&c.url, &doc_name, c.flavor, wire::BULK_READ_BUFFER).await?;
    let state = wire::wait_synced(&mut check, c.flavor, &doc_name, &[0, 0]).await?;
    let got = {
        let doc = Doc::new();
        let text = doc.get_or_insert_text("text");
        let mut txn = doc.transact_mut();
        txn.apply_update(<yrs::Update as yrs::updates::decoder::Decode>::decode_v1(
            &state,
        )?)?;
        text.get_string(&txn)
    };
    let text_ok = got == content;
    let p = |q: f64| ms(lat.value_at_quantile(q));
    println!(
        "{} storm: {} clients opened a {:.1} MiB document: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; server RSS {} KiB before, peak {} KiB; text {}",
        c.label,
        args.clients,
        encoded as f64 / 1048576.0,
        p(0.5),
        p(0.99),
        ms(lat.max()),
        rss_before.unwrap_or(0),
        peak.unwrap_or(0),
        if text_ok && short == 0 { "complete" } else { "INCOMPLETE" },
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "storm", "label": c.label, "clients": args.clients,
            "doc_bytes": encoded, "uploaded": !args.no_upload, "upload_s": upload_s,
            "p50_ms": p(0.5), "p99_ms": p(0.99), "max_ms": ms(lat.max()),
            "rss_fresh_kib": rss_fresh, "rss_before_kib": rss_before, "peak_rss_kib": peak,
            "peak_reset": peak_reset, "bench_cpu_s": bench_cpu, "server_cpu_s": server_cpu, "short_syncs": short, "text_ok": text_ok,
        })
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeded_document_has_the_size_asked_and_is_the_same_every_time() {
        let (a, text_a, size) = seeded_updates(200_000, 50_000, 7);
        let (b, text_b, _) = seeded_updates(200_000, 50_000, 7);
        assert_eq!(a, b);
        assert_eq!(text_a, text_b);
        let total: usize = a.iter().map(Vec::len).sum();
        assert!((200_000..300_000).contains(&total), "{total}");
        assert!(a.len() >= 4, "{} updates", a.len());
        let doc = Doc::new();
        let text = doc.get_or_insert_text("text");
        let mut txn = doc.transact_mut();
        for u in &a {
            let u = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u).expect("update");
            txn.apply_update(u).expect("applies");
        }
        assert_eq!(text.get_string(&txn), text_a);
        drop(txn);
        let state = doc
            .transact()
            .encode_state_as_update_v1(&yrs::StateVector::default());
        assert_eq!(state.len(), size);
        assert!(text_a.len() > 150_000, "{}", text_a.len());
    }
}
