//! `memory`: what a loaded large document costs a server in RSS, at three moments: once one
//! client has it open (after a restart, the load from storage), after a join storm of
//! `--clients` clients (once they have left), and after a client typed `--typing` updates
//! into it (with a server snapshotting every 50 updates: after a snapshot). The same seeded
//! document as the storm's (`large::seeded_updates`), so every server holds the same content.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::SinkExt;
use quire_protocol as protocol;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::{Doc, ReadTxn, Text, Transact};

use crate::{large, process_rss_kib, wire, Common};

#[derive(clap::Args, Clone)]
pub struct MemoryArgs {
    #[command(flatten)]
    common: Common,
    /// Encoded size of the document, MiB
    #[arg(long, default_value_t = 20.0)]
    doc_mb: f64,
    /// Clients of the join storm
    #[arg(long, default_value_t = 50)]
    clients: usize,
    /// Skip the upload: the document is already stored (after a restart)
    #[arg(long)]
    no_upload: bool,
    /// Updates typed into the document after the storm
    #[arg(long, default_value_t = 60)]
    typing: usize,
    /// How long the server is left alone before each reading
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    settle: Duration,
    /// Instead of the seeded document (`--doc-mb`): a document of many items, most deleted,
    /// the editing trace replayed this many times (`items.rs`; 1,250 make about 10 million
    /// items), uploaded one replay per update
    #[arg(long)]
    trace_replays: Option<usize>,
    /// With `--trace-replays`: every this-many-th replay's text is kept, the others deleted
    #[arg(long, default_value_t = 10)]
    keep_every: usize,
    /// With `--trace-replays`: the whole document uploaded as one update (its encoded state,
    /// as a server loading it from storage takes it in), timed until a client has it
    #[arg(long)]
    as_one: bool,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    trace: std::path::PathBuf,
    /// With `--trace-replays`: also write the document's encoded state (Yjs v1) to this file,
    /// for the floor to load (`QUIRE_FLOOR_LOAD`)
    #[arg(long)]
    save_state: Option<std::path::PathBuf>,
    /// With `--trace-replays`: where the generated replays are kept between runs
    #[arg(long, default_value = "target/bench")]
    items_cache: std::path::PathBuf,
}

#[derive(clap::Args, Clone)]
pub struct RoundtripArgs {
    /// The state (Yjs v1), as `memory --save-state` writes it
    #[arg(long)]
    state: std::path::PathBuf,
    /// Label printed with the result
    #[arg(long, default_value = "floor")]
    label: String,
}

/// `roundtrip`: the state read from its file, decoded and integrated into a fresh document,
/// encoded again; each step timed (the read apart: `quire compact` reads from its store).
pub fn roundtrip(args: &RoundtripArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let state =
        std::fs::read(&args.state).with_context(|| format!("read {}", args.state.display()))?;
    let read_ms = started.elapsed().as_secs_f64() * 1000.0;
    let (yrs_load_ms, yrs_encode_ms, encoded) = yrs_alone(&state)?;
    println!(
        "{}",
        serde_json::json!({
            "scenario": "roundtrip", "label": args.label, "read_ms": read_ms,
            "yrs_load_ms": yrs_load_ms, "yrs_encode_ms": yrs_encode_ms,
            "snapshot_ms": yrs_load_ms + yrs_encode_ms, "encoded": encoded,
        })
    );
    Ok(())
}

/// yrs alone loading `state` (Yjs v1) into a fresh document and encoding it again: the
/// milliseconds of each, and the length encoded.
fn yrs_alone(state: &[u8]) -> anyhow::Result<(f64, f64, usize)> {
    let started = Instant::now();
    let doc = Doc::new();
    {
        let u = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(state)?;
        doc.transact_mut().apply_update(u)?;
    }
    let load_ms = started.elapsed().as_secs_f64() * 1000.0;
    let started = Instant::now();
    let again = doc
        .transact()
        .encode_state_as_update_v1(&yrs::StateVector::default());
    let encode_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok((load_ms, encode_ms, again.len()))
}

/// The document to measure: its updates, encoded size and item count, with what yrs alone
/// takes here to load it (decode and integrate its encoded state) and to encode it.
struct Measured {
    updates: Vec<Vec<u8>>,
    encoded: usize,
    items: Option<u64>,
    yrs_load_ms: Option<f64>,
    yrs_encode_ms: Option<f64>,
}

fn document(args: &MemoryArgs) -> anyhow::Result<Measured> {
    let Some(replays) = args.trace_replays else {
        let (updates, _, encoded) = large::seeded_updates(
            (args.doc_mb * 1048576.0) as usize,
            large::CHUNK,
            large::SEED,
        );
        return Ok(Measured {
            updates,
            encoded,
            items: None,
            yrs_load_ms: None,
            yrs_encode_ms: None,
        });
    };
    let trace = crate::read_trace(&args.trace)?;
    let cache = args.items_cache.join(format!(
        "items-{replays}-{}-{}.bin",
        args.keep_every,
        trace.edits.len()
    ));
    let generated = Instant::now();
    let doc = crate::items::trace_replays(&trace, replays, args.keep_every, &cache)?;
    eprintln!(
        "{} replays, {} items, ready in {:.1?}",
        replays,
        doc.items,
        generated.elapsed()
    );
    // The whole state, and yrs alone loading it and encoding it again.
    let state = {
        let merged = Doc::new();
        let mut txn = merged.transact_mut();
        for u in &doc.updates {
            let u = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u)?;
            txn.apply_update(u)?;
        }
        drop(txn);
        let txn = merged.transact();
        txn.encode_state_as_update_v1(&yrs::StateVector::default())
    };
    if let Some(path) = &args.save_state {
        std::fs::write(path, &state).with_context(|| format!("write {}", path.display()))?;
    }
    let (yrs_load_ms, yrs_encode_ms, encoded) = yrs_alone(&state)?;
    let updates = if args.as_one {
        vec![state]
    } else {
        doc.updates
    };
    Ok(Measured {
        updates,
        encoded,
        items: Some(doc.items),
        yrs_load_ms: Some(yrs_load_ms),
        yrs_encode_ms: Some(yrs_encode_ms),
    })
}

/// Quire's count of snapshots written (`quire_snapshots_total` on /metrics); `None` for a
/// server without it.
async fn snapshots_written(url: &str) -> Option<f64> {
    let base = crate::heavy::http_base(url);
    let body = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    body.lines()
        .find_map(|l| l.strip_prefix("quire_snapshots_total "))
        .and_then(|v| v.trim().parse().ok())
}

fn rss_mb(pid: Option<u32>) -> Option<f64> {
    pid.and_then(process_rss_kib).map(|k| k as f64 / 1024.0)
}

pub async fn memory(args: MemoryArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let pid = c.server_pid;
    let doc = format!("{}-large", c.prefix);
    let Measured {
        updates,
        encoded,
        items,
        yrs_load_ms,
        yrs_encode_ms,
    } = document(&args)?;
    let expect = encoded * 95 / 100;
    let rss_fresh = rss_mb(pid);
    let mut upload_ms = None;
    if !args.no_upload {
        if let Some(pid) = pid {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
        let started = Instant::now();
        large::upload(c, &doc, &updates, expect, Duration::from_secs(1800))
            .await
            .context("upload")?;
        upload_ms = Some(started.elapsed().as_secs_f64() * 1000.0);
    }
    drop(updates);
    let upload_peak = pid
        .and_then(|pid| crate::proc_status_kib(pid, "VmHWM:"))
        .map(|k| k as f64 / 1024.0);
    // One client opens it: after a restart, the server loads it from storage now.
    let opened = Instant::now();
    let mut first = wire::connect_with(&c.url, &doc, c.flavor, wire::BULK_READ_BUFFER).await?;
    let state = wire::wait_synced(&mut first, c.flavor, &doc, &[0, 0]).await?;
    let open_ms = opened.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        state.len() >= expect,
        "the first client got {} bytes",
        state.len()
    );
    drop(state);
    tokio::time::sleep(args.settle).await;
    let rss_loaded = rss_mb(pid);
    // The join storm, the peak reset first (Linux, as root or the server's user).
    if let Some(pid) = pid {
        let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(args.clients));
    let tasks: Vec<_> = (0..args.clients)
        .map(|_| {
            let (url, flavor, name) = (c.url.clone(), c.flavor, doc.clone());
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                let mut ws =
                    wire::connect_with(&url, &name, flavor, wire::BULK_READ_BUFFER).await?;
                let state = wire::wait_synced(&mut ws, flavor, &name, &[0, 0]).await?;
                anyhow::Ok((state.len(), ws))
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(args.clients);
    for t in tasks {
        let (len, ws) = t.await??;
        anyhow::ensure!(len >= expect, "a storm client got {len} bytes");
        sockets.push(ws);
    }
    let storm_peak = pid
        .and_then(|pid| crate::proc_status_kib(pid, "VmHWM:"))
        .map(|k| k as f64 / 1024.0);
    drop(sockets);
    tokio::time::sleep(args.settle).await;
    let rss_after_storm = rss_mb(pid);
    // Typing: small inserts from a client of its own (at the start of the text), a new one
    // each run (a restarted server already holds the last run's: its inserts would change
    // nothing, and nothing would be logged or snapshotted).
    let snapshots_before = snapshots_written(&c.url).await;
    let typist_id = 7_000_000
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::from(d.subsec_micros()));
    let typist = Doc::with_client_id(typist_id);
    let text = typist.get_or_insert_text("text");
    for _ in 0..args.typing {
        let update = {
            let mut txn = typist.transact_mut();
            text.insert(&mut txn, 0, "x");
            txn.encode_update_v1()
        };
        let frame = wire::wrap(c.flavor, &doc, protocol::encode_update(&update));
        first.send(WsMessage::Binary(frame)).await?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(args.settle * 2).await;
    let rss_after_typing = rss_mb(pid);
    drop(first);
    // Snapshots written while it was typed into.
    let snapshots = snapshots_written(&c.url)
        .await
        .zip(snapshots_before)
        .map(|(after, before)| after - before);
    let of = |rss: Option<f64>| rss.map(|r| r * 1048576.0 / encoded as f64);
    println!(
        "{} memory: a {:.1} MiB document: RSS fresh {:.0} MB, loaded {:.0} MB ({:.1}x its size; opened in {open_ms:.0} ms), storm of {} peak {:.0} MB, after {:.0} MB, after typing {:.0} MB (snapshots written meanwhile: {snapshots:?})",
        c.label,
        encoded as f64 / 1048576.0,
        rss_fresh.unwrap_or(0.0),
        rss_loaded.unwrap_or(0.0),
        of(rss_loaded).unwrap_or(0.0),
        args.clients,
        storm_peak.unwrap_or(0.0),
        rss_after_storm.unwrap_or(0.0),
        rss_after_typing.unwrap_or(0.0),
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "memory", "label": c.label, "doc_bytes": encoded,
            "uploaded": !args.no_upload, "clients": args.clients, "open_ms": open_ms,
            "rss_fresh_mb": rss_fresh, "rss_loaded_mb": rss_loaded,
            "storm_peak_mb": storm_peak, "rss_after_storm_mb": rss_after_storm,
            "rss_after_typing_mb": rss_after_typing, "loaded_x_size": of(rss_loaded),
            "snapshots_written": snapshots, "items": items, "as_one": args.as_one,
            "upload_ms": upload_ms, "upload_peak_mb": upload_peak,
            "yrs_load_ms": yrs_load_ms, "yrs_encode_ms": yrs_encode_ms,
        })
    );
    Ok(())
}
