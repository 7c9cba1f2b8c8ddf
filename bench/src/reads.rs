//! `reads` (Quire only): what reading a large document's content costs the server, now, at a
//! version and at an older log position: the first read of each (time, server CPU, RSS
//! before, after and at its peak) and the same read repeated (server CPU per read), one
//! reader at a time so the CPU is the read's own.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::SinkExt;
use quire_protocol as protocol;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::{Doc, Text, Transact};

use crate::heavy::{http_base, record_version};
use crate::{large, wire, Common};

#[derive(clap::Args, Clone)]
pub struct ReadsArgs {
    #[command(flatten)]
    common: Common,
    /// Encoded size of the document, MiB
    #[arg(long, default_value_t = 20.0)]
    doc_mb: f64,
    /// Times each read is repeated after the first
    #[arg(long, default_value_t = 10)]
    repeat: usize,
}

fn kib(pid: Option<u32>, field: &str) -> Option<u64> {
    pid.and_then(|pid| crate::proc_status_kib(pid, field))
}

pub async fn reads(args: ReadsArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let pid = c.server_pid;
    let http = reqwest::Client::new();
    let base = http_base(&c.url);
    let doc = format!("{}-big", c.prefix);
    let (updates, _, encoded) = large::seeded_updates(
        (args.doc_mb * 1048576.0) as usize,
        large::CHUNK,
        large::SEED,
    );
    large::upload(
        c,
        &doc,
        &updates,
        encoded * 95 / 100,
        Duration::from_secs(300),
    )
    .await
    .context("upload")?;
    drop(updates);
    // A version of it, then a few edits after it, so "now" is a later position than the
    // version's.
    let (id, seq) = record_version(&http, &base, &doc).await?;
    let mut ws = wire::connect_with(&c.url, &doc, c.flavor, wire::BULK_READ_BUFFER).await?;
    wire::wait_synced(&mut ws, c.flavor, &doc, &[0, 0]).await?;
    let typist = Doc::with_client_id(8_888_888);
    let text = typist.get_or_insert_text("text");
    for _ in 0..20 {
        let update = {
            let mut txn = typist.transact_mut();
            text.insert(&mut txn, 0, "y");
            txn.encode_update_v1()
        };
        ws.send(WsMessage::Binary(wire::wrap(
            c.flavor,
            &doc,
            protocol::encode_update(&update),
        )))
        .await?;
    }
    ws.send(WsMessage::Binary(wire::wrap(
        c.flavor,
        &doc,
        protocol::encode_durable_ack(1),
    )))
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(ws);
    let kinds = [
        ("now", format!("/api/v1/docs/{doc}/json")),
        ("version", format!("/api/v1/docs/{doc}/versions/{id}/json")),
        (
            "position",
            format!("/api/v1/docs/{doc}/json?at_position={seq}"),
        ),
    ];
    for (kind, path) in kinds {
        let url = format!("{base}{path}");
        let get = || async {
            let resp = http.get(&url).send().await?;
            anyhow::ensure!(resp.status().is_success(), "{path}: {}", resp.status());
            anyhow::Ok(resp.bytes().await?.len())
        };
        if let Some(pid) = pid {
            let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
        }
        let rss_before = kib(pid, "VmRSS:");
        let cpu0 = pid.and_then(crate::process_cpu_seconds);
        let started = Instant::now();
        let body = get().await?;
        let first_ms = started.elapsed().as_secs_f64() * 1000.0;
        let cpu_first = pid.and_then(crate::process_cpu_seconds);
        let (rss_after, peak) = (kib(pid, "VmRSS:"), kib(pid, "VmHWM:"));
        // The first read's garbage handed back (the allocator's background thread) before the
        // repeats are measured, so they do not pay for it.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let cpu1 = pid.and_then(crate::process_cpu_seconds);
        let mut times = Vec::with_capacity(args.repeat);
        for _ in 0..args.repeat {
            let started = Instant::now();
            get().await?;
            times.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let cpu2 = pid.and_then(crate::process_cpu_seconds);
        times.sort_by(f64::total_cmp);
        let first_cpu_ms = cpu0.zip(cpu_first).map(|(a, b)| (b - a) * 1000.0);
        let repeat_cpu_ms = cpu1
            .zip(cpu2)
            .map(|(a, b)| (b - a) * 1000.0 / args.repeat.max(1) as f64);
        let p50 = times.get(times.len() / 2).copied().unwrap_or(0.0);
        println!(
            "{} reads {kind}: {body} bytes; first {first_ms:.0} ms, server CPU {:.0} ms, RSS {} -> {} KiB (peak {}); again: p50 {p50:.0} ms, server CPU {:.1} ms per read",
            c.label,
            first_cpu_ms.unwrap_or(0.0),
            rss_before.unwrap_or(0),
            rss_after.unwrap_or(0),
            peak.unwrap_or(0),
            repeat_cpu_ms.unwrap_or(0.0),
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "reads", "label": c.label, "read": kind, "doc_bytes": encoded,
                "body_bytes": body, "first_ms": first_ms, "first_cpu_ms": first_cpu_ms,
                "rss_before_kib": rss_before, "rss_after_kib": rss_after, "peak_rss_kib": peak,
                "repeat": args.repeat, "repeat_p50_ms": p50, "repeat_cpu_ms_per_read": repeat_cpu_ms,
            })
        );
    }
    Ok(())
}
