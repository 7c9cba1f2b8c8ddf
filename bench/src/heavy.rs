//! Heavy readers beside typists (Quire only: it needs the history routes): a seeded document
//! of a given size is uploaded and recorded as a named version, then `readers` loops fetch a
//! whole-document answer of it (the version's JSON, the content at its latest position, or
//! a diff of the whole document) as fast as the server answers, while clients type into
//! another, small document. Reported: the typists' delivery latency (the runtime's health),
//! the reads answered and refused, and the server's peak RSS and CPU during the run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::{large, ms, Common, TypingArgs};

/// What the readers fetch.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Read {
    /// `GET /versions/{id}/json`
    VersionJson,
    /// `GET /json?at_position=N`, N the latest position
    Latest,
    /// `GET /diff?from={id}`: the version against the current content
    Diff,
}

#[derive(clap::Args, Clone)]
pub struct HeavyArgs {
    #[command(flatten)]
    pub common: Common,
    /// Encoded size of the document the readers read, MiB
    #[arg(long, default_value_t = 20.0)]
    pub doc_mb: f64,
    /// Reader loops (0: the typists alone, the baseline)
    #[arg(long, default_value_t = 16)]
    pub readers: usize,
    #[arg(long, value_enum, default_value = "version-json")]
    pub read: Read,
    /// Typing clients in the small document
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Updates per second per typing client
    #[arg(long, default_value_t = 10.0)]
    pub rate: f64,
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// A refused reader (429, 503) waits this long before its next request
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub backoff: Duration,
}

/// Records a named version of `doc` (retried while the server is busy, 429 or 503, as it is
/// with a large upload's snapshot); its id and log position.
pub(crate) async fn record_version(
    http: &reqwest::Client,
    base: &str,
    doc: &str,
) -> anyhow::Result<(i64, i64)> {
    let version: serde_json::Value = loop {
        let resp = http
            .post(format!("{base}/api/v1/docs/{doc}/versions"))
            .json(&serde_json::json!({"label": "bench"}))
            .send()
            .await?;
        if resp.status().is_success() {
            break resp.json().await?;
        }
        anyhow::ensure!(
            resp.status() == 429 || resp.status() == 503,
            "cannot record a version: {}",
            resp.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    Ok((
        version["id"].as_i64().context("version id")?,
        version["seq"].as_i64().context("version seq")?,
    ))
}

/// `ws://host:port` as `http://host:port`.
pub(crate) fn http_base(url: &str) -> String {
    let first = url.split(',').next().unwrap_or(url);
    first
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1)
        .trim_end_matches('/')
        .to_owned()
}

pub async fn heavy(args: HeavyArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let http = reqwest::Client::new();
    let base = http_base(&c.url);
    let big = format!("{}-big", c.prefix);
    let (updates, _, encoded) =
        large::seeded_updates((args.doc_mb * 1048576.0) as usize, 512 * 1024, 1);
    large::upload(
        c,
        &big,
        &updates,
        encoded * 95 / 100,
        Duration::from_secs(300),
    )
    .await
    .context("upload")?;
    // A named version of it.
    let (id, seq) = record_version(&http, &base, &big).await?;
    let path = match args.read {
        Read::VersionJson => format!("/api/v1/docs/{big}/versions/{id}/json"),
        Read::Latest => format!("/api/v1/docs/{big}/json?at_position={seq}"),
        Read::Diff => format!("/api/v1/docs/{big}/diff?from={id}"),
    };
    let url = format!("{base}{path}");
    // One read, timed, before the load: what one costs alone.
    let started = Instant::now();
    let first = http.get(&url).send().await?;
    anyhow::ensure!(first.status().is_success(), "{path}: {}", first.status());
    let body = first.bytes().await?.len();
    let alone = started.elapsed();

    let peak_reset = c
        .server_pid
        .is_some_and(|pid| std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok());
    let rss_before = c.server_pid.and_then(crate::process_rss_kib);
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, refused, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let readers: Vec<_> = (0..args.readers)
        .map(|_| {
            let (http, url, stop) = (http.clone(), url.clone(), stop.clone());
            let (ok, refused, failed) = (ok.clone(), refused.clone(), failed.clone());
            let backoff = args.backoff;
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match http.get(&url).send().await {
                        Ok(resp) if resp.status().is_success() => {
                            let _ = resp.bytes().await;
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(resp) if resp.status() == 429 || resp.status() == 503 => {
                            refused.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(backoff).await;
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(backoff).await;
                        }
                    }
                }
            })
        })
        .collect();
    let typing = TypingArgs {
        common: Common {
            prefix: format!("{}-small", c.prefix),
            ..c.clone()
        },
        rooms: 1,
        clients: args.clients,
        writers: None,
        rate: args.rate,
        duration: args.duration,
        warmup: Duration::from_secs(2),
        ack: false,
        sample_every: None,
        samples: "soak.jsonl".into(),
        seed_mb: None,
        by_document: false,
        docs_per_socket: 1,
    };
    let typed = crate::typing(&typing).await;
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.await;
    }
    let typed = typed?;
    let peak = c
        .server_pid
        .and_then(|pid| crate::proc_status_kib(pid, "VmHWM:"));
    let (ok, refused, failed) = (
        ok.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    let p = |q: f64| ms(typed.lat.value_at_quantile(q));
    println!(
        "{} heavy {:?}: {} readers of a {:.0} MiB document ({} bytes, {:.0} ms alone) beside {} typists at {}/s: delivery p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; reads {ok} answered, {refused} refused, {failed} failed; server RSS {} KiB before, peak {} KiB; server CPU {:.1} s",
        c.label,
        args.read,
        args.readers,
        args.doc_mb,
        body,
        alone.as_secs_f64() * 1000.0,
        args.clients,
        args.rate,
        p(0.5),
        p(0.99),
        ms(typed.lat.max()),
        rss_before.unwrap_or(0),
        peak.unwrap_or(0),
        typed.server_cpu.unwrap_or(0.0),
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "heavy", "label": c.label, "read": format!("{:?}", args.read),
            "readers": args.readers, "doc_mb": args.doc_mb, "body_bytes": body,
            "read_alone_ms": alone.as_secs_f64() * 1000.0, "typists": args.clients,
            "rate": args.rate, "p50_ms": p(0.5), "p99_ms": p(0.99), "max_ms": ms(typed.lat.max()),
            "delivered": typed.delivered, "expected": typed.expected,
            "reads_ok": ok, "reads_refused": refused, "reads_failed": failed,
            "rss_before_kib": rss_before, "peak_rss_kib": peak, "peak_reset": peak_reset,
            "server_cpu_s": typed.server_cpu,
        })
    );
    Ok(())
}
