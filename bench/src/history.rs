//! `history` (Quire only): the editing trace as sessions of one author each, then the
//! history routes timed.

use super::*;

#[derive(clap::Args, Clone)]
pub(crate) struct HistoryArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    pub(crate) trace: PathBuf,
    /// Sessions (authors) the trace is cut into
    #[arg(long, default_value_t = 100)]
    pub(crate) sessions: usize,
    /// The server's admin key, to issue each author's token
    #[arg(long)]
    pub(crate) admin_key: String,
    /// Pause between sessions: longer than the server's `--version-idle`
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    pub(crate) pause: Duration,
    /// Times each read is repeated
    #[arg(long, default_value_t = 20)]
    pub(crate) repeat: usize,
}

/// The trace as `--sessions` sessions, one author each, each sent over its own connection
/// and committed (durable acknowledgement) before a pause; then the history routes timed.
pub(crate) async fn history(args: HistoryArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let trace = read_trace(&args.trace)?;
    let doc_name = format!("{}-history", c.prefix);
    let http_base = c
        .url
        .replacen("ws://", "http://", 1)
        .replacen("wss://", "https://", 1)
        .trim_end_matches('/')
        .to_owned();
    let http = reqwest::Client::new();
    let api = |path: &str| format!("{http_base}/api/v1/docs/{doc_name}{path}");
    let started = Instant::now();
    let ingest = sessions::replay(
        &sessions::Replay {
            common: c,
            http: &http,
            http_base: &http_base,
            admin_key: &args.admin_key,
            doc: &doc_name,
            pause: args.pause,
        },
        &trace.edits,
        args.sessions,
        |i| format!("author-{i}"),
    )
    .await?;
    let replay = started.elapsed();
    let versions: Vec<serde_json::Value> = http
        .get(api("/versions"))
        .bearer_auth(&args.admin_key)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let timed = |ms: &mut Vec<f64>| {
        ms.sort_by(f64::total_cmp);
        (ms[ms.len() / 2], ms[ms.len() - 1])
    };
    let mut list = Vec::new();
    let mut sessions_listed = 0;
    for _ in 0..args.repeat {
        let t = Instant::now();
        let page: serde_json::Value = http
            .get(api("/history?limit=20"))
            .bearer_auth(&args.admin_key)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        list.push(t.elapsed().as_secs_f64() * 1000.0);
        sessions_listed = page["items"].as_array().map_or(0, Vec::len);
    }
    let last_seq = versions
        .last()
        .and_then(|v| v["seq"].as_i64())
        .unwrap_or(1)
        .max(1);
    let mut at = Vec::new();
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(7);
    for _ in 0..args.repeat {
        let n = rand::Rng::random_range(&mut rng, 1..=last_seq);
        let t = Instant::now();
        http.get(api(&format!("/json?at_position={n}")))
            .bearer_auth(&args.admin_key)
            .send()
            .await?
            .error_for_status()?;
        at.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (from, to) = (
        versions
            .get(versions.len() / 10)
            .and_then(|v| v["id"].as_i64()),
        versions
            .get(versions.len() * 9 / 10)
            .and_then(|v| v["id"].as_i64()),
    );
    let mut diff = Vec::new();
    if let (Some(from), Some(to)) = (from, to) {
        for _ in 0..args.repeat.min(5) {
            let t = Instant::now();
            http.get(api(&format!("/diff?from={from}&to={to}")))
                .bearer_auth(&args.admin_key)
                .send()
                .await?
                .error_for_status()?;
            diff.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let (list_p50, list_max) = timed(&mut list);
    let (at_p50, at_max) = timed(&mut at);
    let (diff_p50, diff_max) = if diff.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        timed(&mut diff)
    };
    let edits = trace.edits.len();
    println!(
        "{} history: {edits} edits as {} sessions in {replay:.2?} ({:.0} updates/s while sending);          {} versions; list 20 sessions p50 {list_p50:.1} ms (max {list_max:.1}); content at a          position p50 {at_p50:.1} ms (max {at_max:.1}); diff of two versions p50 {diff_p50:.1} ms          (max {diff_max:.1})",
        c.label,
        args.sessions,
        edits as f64 / ingest.as_secs_f64(),
        versions.len(),
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "history", "label": c.label, "edits": edits, "sessions": args.sessions,
            "versions": versions.len(), "sessions_listed": sessions_listed,
            "updates_per_s_sending": edits as f64 / ingest.as_secs_f64(),
            "list_ms_p50": list_p50, "list_ms_max": list_max,
            "at_position_ms_p50": at_p50, "at_position_ms_max": at_max,
            "diff_ms_p50": diff_p50, "diff_ms_max": diff_max,
        })
    );
    Ok(())
}
