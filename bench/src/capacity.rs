//! `capacity` (Quire only; issue 50): what a JSON edit costs on a large document beside the
//! same edit on an empty one, how many clients an agent's edits add to the document, and
//! whether clients that never read their whole-document answers hold up anyone else.
//!
//! 1. Edits: `--edits` one-character JSON edits, one at a time, into an empty document and
//!    into the seeded document of `--doc-mb` (at its start, at its end, and into a small root
//!    of its own): latency p50/p99 and server CPU per edit.
//! 2. Clients: the large document's state vector (its number of clients) before the first
//!    edit and after `--agent-edits` more, all by the same caller.
//! 3. Stuck readers: for each count in `--stuck`, that many connections with a 4 KiB receive
//!    window ask for the large document's JSON and never read; meanwhile a reader of another
//!    document's JSON and an editor of the large one are timed (status and latency).

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::io::AsyncWriteExt;
use yrs::updates::decoder::Decode;
use yrs::{ReadTxn, Transact};

use crate::heavy::http_base;
use crate::{large, Common};

#[derive(clap::Args, Clone)]
pub struct CapacityArgs {
    #[command(flatten)]
    common: Common,
    /// Encoded size of the large document, MiB
    #[arg(long, default_value_t = 20.0)]
    doc_mb: f64,
    /// Timed edits per target
    #[arg(long, default_value_t = 200)]
    edits: usize,
    /// Further edits by the same caller before the state vector is read again
    #[arg(long, default_value_t = 1000)]
    agent_edits: usize,
    /// Counts of never-reading connections to try, comma-separated
    #[arg(long, default_value = "0,2,3")]
    stuck: String,
    /// Timed requests of each kind per stuck count
    #[arg(long, default_value_t = 20)]
    probes: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The number of clients in the document's state (its state vector's length).
async fn clients(http: &reqwest::Client, base: &str, doc: &str) -> anyhow::Result<usize> {
    let resp = http
        .get(format!("{base}/api/v1/docs/{doc}/update"))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "update: {}", resp.status());
    let bytes = resp.bytes().await?;
    let ydoc = yrs::Doc::new();
    ydoc.transact_mut()
        .apply_update(yrs::Update::decode_v1(&bytes)?)?;
    let n = ydoc.transact().state_vector().len();
    Ok(n)
}

async fn edit(
    http: &reqwest::Client,
    base: &str,
    doc: &str,
    op: &serde_json::Value,
) -> anyhow::Result<(u16, f64)> {
    let started = Instant::now();
    let resp = http
        .post(format!("{base}/api/v1/docs/{doc}/edits"))
        .json(&serde_json::json!({ "ops": [op] }))
        .send()
        .await?;
    let status = resp.status().as_u16();
    let _ = resp.bytes().await?;
    Ok((status, started.elapsed().as_secs_f64() * 1000.0))
}

/// The floor of an edit: yrs alone making the same one-character insert (a transaction and
/// its update encoded, as the room does) into the seeded document and into an empty one, in
/// this process: what no server can go below.
fn yrs_alone(c: &Common, updates: &[Vec<u8>], n: usize) {
    use yrs::{Text, TransactionMut};
    let doc = || {
        yrs::Doc::with_options(yrs::Options {
            client_id: yrs::ClientID::new(77),
            offset_kind: yrs::OffsetKind::Utf16,
            ..yrs::Options::default()
        })
    };
    let (large, empty) = (doc(), doc());
    {
        let mut txn = large.transact_mut();
        for u in updates {
            if let Ok(u) = yrs::Update::decode_v1(u) {
                let _ = txn.apply_update(u);
            }
        }
    }
    let time = |d: &yrs::Doc, at_end: bool| {
        let text = d.get_or_insert_text("text");
        let started = Instant::now();
        for _ in 0..n {
            let mut txn: TransactionMut = d.transact_mut();
            let at = if at_end { text.len(&txn) } else { 0 };
            text.insert(&mut txn, at, "x");
            std::hint::black_box(txn.encode_update_v1());
        }
        started.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
    };
    for (target, d, at_end) in [
        ("empty", &empty, false),
        ("large-start", &large, false),
        ("large-end", &large, true),
    ] {
        let us = time(d, at_end);
        println!(
            "{} capacity yrs alone {target}: {us:.1} us per insert",
            c.label
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "capacity", "part": "yrs-alone", "label": c.label,
                "target": target, "us_per_insert": us,
            })
        );
    }
}

pub async fn capacity(args: CapacityArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let pid = c.server_pid;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    let base = http_base(&c.url);
    let (big, empty, small) = (
        format!("{}-big", c.prefix),
        format!("{}-empty", c.prefix),
        format!("{}-small", c.prefix),
    );
    let (updates, _, encoded) = large::seeded_updates(
        (args.doc_mb * 1048576.0) as usize,
        large::CHUNK,
        large::SEED,
    );
    large::upload(
        c,
        &big,
        &updates,
        encoded * 95 / 100,
        Duration::from_secs(300),
    )
    .await
    .context("upload")?;
    yrs_alone(c, &updates, args.edits);
    drop(updates);
    for doc in [&empty, &small] {
        let _ = http
            .post(format!("{base}/api/v1/docs"))
            .json(&serde_json::json!({ "name": doc }))
            .send()
            .await?;
    }
    let small_op = serde_json::json!({"text": "text", "insert": "small document"});
    edit(&http, &base, &small, &small_op).await?;
    let clients_before = clients(&http, &base, &big).await?;

    // 1. Edits.
    let targets = [
        (
            "empty",
            &empty,
            serde_json::json!({"text": "text", "insert": "x", "at": 0}),
        ),
        (
            "large-start",
            &big,
            serde_json::json!({"text": "text", "insert": "x", "at": 0}),
        ),
        (
            "large-end",
            &big,
            serde_json::json!({"text": "text", "insert": "x"}),
        ),
        (
            "large-other-root",
            &big,
            serde_json::json!({"text": "note", "insert": "x", "at": 0}),
        ),
    ];
    let mut made = 0;
    for (target, doc, op) in &targets {
        for _ in 0..10 {
            edit(&http, &base, doc, op).await?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let cpu0 = pid.and_then(crate::process_cpu_seconds);
        let mut times = Vec::with_capacity(args.edits);
        for _ in 0..args.edits {
            let (status, ms) = edit(&http, &base, doc, op).await?;
            anyhow::ensure!(status == 200, "{target}: edit answered {status}");
            times.push(ms);
        }
        let cpu1 = pid.and_then(crate::process_cpu_seconds);
        made += args.edits + 10;
        times.sort_by(f64::total_cmp);
        let cpu_ms = cpu0
            .zip(cpu1)
            .map(|(a, b)| (b - a) * 1000.0 / args.edits.max(1) as f64);
        let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
        println!(
            "{} capacity edit {target}: p50 {p50:.2} ms, p99 {p99:.2} ms, server CPU {:.3} ms per edit",
            c.label,
            cpu_ms.unwrap_or(0.0)
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "capacity", "part": "edit", "label": c.label, "target": target,
                "doc_bytes": encoded, "edits": args.edits, "p50_ms": p50, "p99_ms": p99,
                "cpu_ms_per_edit": cpu_ms,
            })
        );
    }

    // 2. Clients an agent's edits add.
    let op = serde_json::json!({"text": "text", "insert": "a", "at": 0});
    for _ in 0..args.agent_edits {
        edit(&http, &base, &big, &op).await?;
    }
    made += args.agent_edits;
    let clients_after = clients(&http, &base, &big).await?;
    println!(
        "{} capacity clients: {clients_before} before {made} edits, {clients_after} after",
        c.label
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "capacity", "part": "clients", "label": c.label, "edits": made,
            "clients_before": clients_before, "clients_after": clients_after,
        })
    );

    // 3. Stuck readers.
    let addr: std::net::SocketAddr = base
        .trim_start_matches("http://")
        .parse()
        .context("the server's address")?;
    for count in args
        .stuck
        .split(',')
        .filter_map(|s| s.trim().parse::<usize>().ok())
    {
        let mut stuck = Vec::new();
        for _ in 0..count {
            let socket = tokio::net::TcpSocket::new_v4()?;
            socket.set_recv_buffer_size(4096)?;
            let mut tcp = socket.connect(addr).await?;
            let request = format!("GET /api/v1/docs/{big}/json HTTP/1.1\r\nHost: quire\r\n\r\n");
            tcp.write_all(request.as_bytes()).await?;
            stuck.push(tcp);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut reads = Vec::new();
        let mut edits = Vec::new();
        let mut refused = 0;
        for _ in 0..args.probes {
            let started = Instant::now();
            let resp = http
                .get(format!("{base}/api/v1/docs/{small}/json"))
                .send()
                .await?;
            let ok = resp.status().is_success();
            let _ = resp.bytes().await?;
            reads.push(started.elapsed().as_secs_f64() * 1000.0);
            let (status, ms) = edit(&http, &base, &big, &op).await?;
            edits.push(ms);
            refused += usize::from(!ok) + usize::from(status != 200);
        }
        drop(stuck);
        reads.sort_by(f64::total_cmp);
        edits.sort_by(f64::total_cmp);
        let (read_p50, read_max) = (percentile(&reads, 0.5), percentile(&reads, 1.0));
        let (edit_p50, edit_max) = (percentile(&edits, 0.5), percentile(&edits, 1.0));
        println!(
            "{} capacity stuck {count}: other document's JSON p50 {read_p50:.1} ms max {read_max:.0} ms; edit p50 {edit_p50:.1} ms max {edit_max:.0} ms; {refused} refused of {}",
            c.label,
            2 * args.probes
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "capacity", "part": "stuck", "label": c.label, "stuck": count,
                "read_p50_ms": read_p50, "read_max_ms": read_max, "edit_p50_ms": edit_p50,
                "edit_max_ms": edit_max, "refused": refused, "probes": 2 * args.probes,
            })
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}
