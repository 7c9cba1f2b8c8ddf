//! Branches (Quire only, docs/branches.md): per round, a parent document and a branch of it;
//! the editing trace replayed into the branch as sessions by a few authors (each session one
//! change of the branch); then timed: listing the branch's changes, merging one author's
//! changes (with the changes they depend on, added as the server names them), and merging
//! every remaining change, while typists type into the parent: their delivery latency during
//! each merge is compared with the same typists' for as long just before it. Each round ends
//! by checking that a fresh client of the parent reads the trace's final text plus every
//! typist's marker, each once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use quire_protocol as protocol;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, Text, Transact};

use crate::heavy::http_base;
use crate::wire::{self, Flavor, Incoming};
use crate::{histogram, ms, read_trace, sessions, Common, Trace};

#[derive(clap::Args, Clone)]
pub struct BranchesArgs {
    #[command(flatten)]
    pub common: Common,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    pub trace: PathBuf,
    /// Rounds, each on a new parent and branch
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Sessions the trace is cut into (each one change of the branch)
    #[arg(long, default_value_t = 100)]
    pub sessions: usize,
    /// Authors: session i is by `author-{i mod authors}`
    #[arg(long, default_value_t = 5)]
    pub authors: usize,
    /// The server's admin key: creates the documents, issues the tokens, merges
    #[arg(long)]
    pub admin_key: String,
    /// Pause between sessions: longer than the server's `--version-idle`
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    pub pause: Duration,
    /// Times the change list is read
    #[arg(long, default_value_t = 20)]
    pub repeat: usize,
    /// Live typists on the parent, typing through both merges
    #[arg(long, default_value_t = 4)]
    pub typists: usize,
    /// Each typist inserts a marker at the start this often
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub type_every: Duration,
    /// Typing with no merge running before each merge (after a 1 s warm-up), at least;
    /// longer when an earlier round's merge of the remaining changes took longer, so its
    /// baseline window can be as long as the merge
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub lead: Duration,
}

/// Typing before any latency counts (connections settle).
const WARMUP: Duration = Duration::from_secs(1);

/// How long the observer may take, once the typists stop, to receive their last markers.
const DRAIN: Duration = Duration::from_secs(10);

pub async fn branches(args: BranchesArgs) -> anyhow::Result<()> {
    let c = &args.common;
    anyhow::ensure!(
        c.flavor == Flavor::YWebsocket,
        "the branches scenario speaks y-websocket (Quire's own endpoint)"
    );
    anyhow::ensure!(args.authors > 0 && args.typists > 0, "authors and typists");
    let trace = read_trace(&args.trace)?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let base = http_base(&c.url);
    let mut rounds: Vec<Value> = Vec::new();
    let mut lead = args.lead;
    for round in 1..=args.rounds {
        let r = one_round(&args, &trace, &http, &base, round, lead)
            .await
            .with_context(|| format!("round {round}"))?;
        // The next round types long enough before its merge for a baseline as long as this
        // round's merge.
        let merge_s = r["merge_all_ms"].as_f64().unwrap_or(0.0) / 1000.0;
        lead = lead.max(Duration::from_secs_f64(merge_s * 1.5));
        rounds.push(r);
    }
    summary(c, &rounds);
    Ok(())
}

/// A request's status and JSON body (`null` if the body is not JSON).
async fn call(req: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Value)> {
    let resp = req.send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
}

/// The body of a request that must succeed.
async fn ok(what: &str, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let (status, body) = call(req).await?;
    anyhow::ensure!(status.is_success(), "{what}: {status} {body}");
    Ok(body)
}

fn median_max(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

fn load_average() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

async fn one_round(
    args: &BranchesArgs,
    trace: &Trace,
    http: &reqwest::Client,
    base: &str,
    round: usize,
    lead: Duration,
) -> anyhow::Result<Value> {
    let c = &args.common;
    let admin = args.admin_key.as_str();
    let load_before = load_average();
    let parent = format!("{}-r{round}", c.prefix);
    let branch = format!("{}-r{round}-branch", c.prefix);
    let api = |doc: &str, path: &str| format!("{base}/api/v1/docs/{doc}{path}");
    ok(
        "create the parent",
        http.post(format!("{base}/api/v1/docs"))
            .bearer_auth(admin)
            .json(&json!({ "name": parent })),
    )
    .await?;
    ok(
        "create the branch",
        http.post(api(&parent, "/branches"))
            .bearer_auth(admin)
            .json(&json!({ "name": branch })),
    )
    .await?;

    // The trace into the branch, session i by author i mod authors.
    let started = Instant::now();
    let authors = args.authors;
    let ingest = sessions::replay(
        &sessions::Replay {
            common: c,
            http,
            http_base: base,
            admin_key: admin,
            doc: &branch,
            pause: args.pause,
        },
        &trace.edits,
        args.sessions,
        |i| format!("author-{}", i % authors),
    )
    .await?;
    let replay = started.elapsed();
    let branch_text = fresh_text(c, http, base, admin, &branch).await?;
    anyhow::ensure!(
        branch_text == trace.final_text,
        "the branch's text after the replay differs from the trace's final text ({} against \
         {} characters)",
        branch_text.len(),
        trace.final_text.len()
    );

    // The change list, timed.
    let mut list = Vec::new();
    let mut listed = Value::Null;
    let mut list_bytes = 0;
    for _ in 0..args.repeat.max(1) {
        let t = Instant::now();
        let resp = http
            .get(api(&branch, "/changes"))
            .bearer_auth(admin)
            .send()
            .await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        list.push(t.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            status.is_success(),
            "list the changes: {status} {}",
            String::from_utf8_lossy(&body)
        );
        list_bytes = body.len();
        listed = serde_json::from_slice(&body)?;
    }
    let (list_p50, list_max) = median_max(&mut list);
    let changes = listed["changes"].as_array().context("changes")?;
    let open_changes = changes.iter().filter(|ch| ch["state"] == "open").count();

    // The typists start on the parent; they type through both merges, so the one-author
    // merge (which carries most of the text when the changes depend on each other) is
    // measured beside them too.
    let typing = Typing::start(args, http, base, &parent).await?;
    let warm = typing.started + WARMUP;
    tokio::time::sleep_until((warm + lead).into()).await;

    // One author's changes: the ids, plus whatever the server says they need.
    let mut asked: BTreeSet<i64> = changes
        .iter()
        .filter(|ch| ch["author"] == "author-0" && ch["state"] == "open")
        .filter_map(|ch| ch["id"].as_i64())
        .collect();
    let own = asked.len();
    anyhow::ensure!(own > 0, "author-0 has no change in the list");
    let mut refusals = 0;
    let first_attempt = Instant::now();
    let (t0_one, t1_one, merge_one_changes) = loop {
        let t = Instant::now();
        let (status, body) = call(
            http.post(api(&branch, "/merge"))
                .bearer_auth(admin)
                .json(&json!({ "changes": asked })),
        )
        .await?;
        let done = Instant::now();
        if status == StatusCode::CONFLICT
            && body["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("/missing-dependencies"))
        {
            let missing: Vec<i64> = body["current"]["missing"]
                .as_array()
                .context("409 without current.missing")?
                .iter()
                .filter_map(Value::as_i64)
                .collect();
            let before = asked.len();
            asked.extend(missing);
            anyhow::ensure!(
                asked.len() > before,
                "409 missing-dependencies names nothing not already asked for: {body}"
            );
            refusals += 1;
            continue;
        }
        anyhow::ensure!(
            status.is_success(),
            "merge author-0's changes: {status} {body}"
        );
        let merged = body["merged"].as_array().map_or(0, Vec::len);
        anyhow::ensure!(
            merged == asked.len(),
            "merge author-0's changes: asked for {}, merged {merged}: {body}",
            asked.len()
        );
        break (t, done, merged);
    };
    let merge_one_ms = (t1_one - t0_one).as_secs_f64() * 1000.0;

    // The remaining changes, merged while the typists type on.
    tokio::time::sleep_until((t1_one + lead).into()).await;
    let cpu_before = c.server_pid.and_then(crate::process_cpu_seconds);
    let t0 = Instant::now();
    let merged_all = call(http.post(api(&branch, "/merge")).bearer_auth(admin)).await;
    let t1 = Instant::now();
    let server_cpu = match (
        c.server_pid.and_then(crate::process_cpu_seconds),
        cpu_before,
    ) {
        (Some(after), Some(before)) => Some(after - before),
        _ => None,
    };
    // Typing goes on a little, so the markers sent at the merge's end are not the last.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (sent, delivered) = typing.stop().await?;
    let (status, body) = merged_all?;
    anyhow::ensure!(status.is_success(), "merge all: {status} {body}");
    let merge_all_changes = body["merged"].as_array().map_or(0, Vec::len);
    let merge_all_ms = (t1 - t0).as_secs_f64() * 1000.0;
    anyhow::ensure!(
        merge_one_changes + merge_all_changes == open_changes,
        "the two merges merged {merge_one_changes} + {merge_all_changes} changes of \
         {open_changes}: {body}"
    );

    // Delivery by send time: during each merge, and as long just before it (at most back
    // to the warm-up's end, or to the previous merge's end).
    let d = t1 - t0;
    let base_from = t0.checked_sub(d).unwrap_or(t1_one).max(t1_one);
    let d_one = t1_one - t0_one;
    let one_from = first_attempt.checked_sub(d_one).unwrap_or(warm).max(warm);
    let window = |from: Instant, to: Instant| {
        let mut h = histogram();
        for (at, lat) in &delivered {
            if *at >= from && *at < to {
                let _ = h.record(lat.as_micros().max(1) as u64);
            }
        }
        h
    };
    let during = window(t0, t1);
    let before = window(base_from, t0);
    let during_one = window(t0_one, t1_one);
    let before_one = window(one_from, first_attempt);

    // A fresh client of the parent: the trace's final text and every marker, once.
    let text = fresh_text(c, http, base, admin, &parent).await?;
    check_parent(&text, &trace.final_text, &sent)?;
    let state: Value = ok(
        "the branch's record",
        http.get(api(&branch, "/branch")).bearer_auth(admin),
    )
    .await?;
    anyhow::ensure!(
        state["ahead"] == 0 && state["state"] == "merged",
        "after merging every change the branch is {state}"
    );

    let q = |h: &Histogram<u64>, q: f64| (!h.is_empty()).then(|| ms(h.value_at_quantile(q)));
    let mx = |h: &Histogram<u64>| (!h.is_empty()).then(|| ms(h.max()));
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let edits = trace.edits.len();
    println!(
        "{} branches round {round}: {edits} edits as {} sessions by {authors} authors in \
         {replay:.1?} ({:.0} updates/s while sending), {} changes; list the changes p50 \
         {list_p50:.1} ms (max {list_max:.1}, {list_bytes} bytes); merge author-0's {own} \
         changes: {merge_one_changes} merged after {refusals} refusals (409) in \
         {merge_one_ms:.1} ms, typists' delivery p99 {} ms, max {} ms ({} markers) against \
         p99 {} ms ({} markers in {:.2} s) before its first request; merge the remaining {merge_all_changes} in {merge_all_ms:.1} ms \
         beside {} typists: delivery p50 {} ms, p99 {} ms, max {} ms ({} markers) against p50 \
         {} ms, p99 {} ms, max {} ms ({} markers in {:.2} s) just before; parent checked: \
         final text plus {} markers",
        c.label,
        args.sessions,
        edits as f64 / ingest.as_secs_f64(),
        changes.len(),
        f(q(&during_one, 0.99)),
        f(mx(&during_one)),
        during_one.len(),
        f(q(&before_one, 0.99)),
        before_one.len(),
        (first_attempt - one_from).as_secs_f64(),
        args.typists,
        f(q(&during, 0.5)),
        f(q(&during, 0.99)),
        f(mx(&during)),
        during.len(),
        f(q(&before, 0.5)),
        f(q(&before, 0.99)),
        f(mx(&before)),
        before.len(),
        (t0 - base_from).as_secs_f64(),
        sent.len(),
    );
    let mut r = json!({
        "scenario": "branches", "label": c.label, "round": round, "edits": edits,
        "sessions": args.sessions, "authors": authors, "changes": changes.len(),
        "updates_per_s_sending": edits as f64 / ingest.as_secs_f64(),
        "list_ms_p50": list_p50, "list_ms_max": list_max, "list_bytes": list_bytes,
        "list_repeat": list.len(),
        "merge_one_author_changes": own, "merge_one_refusals": refusals,
        "merge_one_changes": merge_one_changes, "merge_one_ms": merge_one_ms,
        "merge_all_changes": merge_all_changes, "merge_all_ms": merge_all_ms,
        "merge_all_server_cpu_s": server_cpu,
        "typists": args.typists, "type_every_ms": args.type_every.as_secs_f64() * 1000.0,
        "merge_p50_ms": q(&during, 0.5), "merge_p99_ms": q(&during, 0.99),
        "merge_max_ms": mx(&during), "merge_markers": during.len(),
        "baseline_p50_ms": q(&before, 0.5), "baseline_p99_ms": q(&before, 0.99),
        "baseline_max_ms": mx(&before), "baseline_markers": before.len(),
        "baseline_s": (t0 - base_from).as_secs_f64(), "merge_s": d.as_secs_f64(),
        "markers": sent.len(), "text_ok": true,
        "load_before": load_before, "load_after": load_average(),
    });
    // The typists during the one-author merge (one macro call would be too deep).
    for (key, value) in [
        ("merge_one_p50_ms", json!(q(&during_one, 0.5))),
        ("merge_one_p99_ms", json!(q(&during_one, 0.99))),
        ("merge_one_max_ms", json!(mx(&during_one))),
        ("merge_one_markers", json!(during_one.len())),
        ("merge_one_baseline_p50_ms", json!(q(&before_one, 0.5))),
        ("merge_one_baseline_p99_ms", json!(q(&before_one, 0.99))),
        ("merge_one_baseline_max_ms", json!(mx(&before_one))),
        ("merge_one_baseline_markers", json!(before_one.len())),
        (
            "merge_one_baseline_s",
            json!((first_attempt - one_from).as_secs_f64()),
        ),
    ] {
        r[key] = value;
    }
    println!("{r}");
    Ok(r)
}

/// The median and the largest of each figure over the rounds.
fn summary(c: &Common, rounds: &[Value]) {
    let mut out = json!({"scenario": "branches-summary", "label": c.label, "rounds": rounds.len()});
    let mut human = Vec::new();
    for key in [
        "list_ms_p50",
        "list_ms_max",
        "merge_one_ms",
        "merge_one_changes",
        "merge_all_ms",
        "merge_all_changes",
        "merge_p99_ms",
        "baseline_p99_ms",
        "merge_one_p99_ms",
        "merge_one_baseline_p99_ms",
    ] {
        let mut v: Vec<f64> = rounds.iter().filter_map(|r| r[key].as_f64()).collect();
        let (p50, max) = median_max(&mut v);
        out[format!("{key}_p50")] = json!(p50);
        out[format!("{key}_max")] = json!(max);
        human.push(format!("{key} {p50:.1} (max {max:.1})"));
    }
    println!(
        "{} branches over {} rounds, median (max): {}",
        c.label,
        rounds.len(),
        human.join(", ")
    );
    println!("{out}");
}

/// What a fresh client of `doc` reads of its text.
async fn fresh_text(
    c: &Common,
    http: &reqwest::Client,
    base: &str,
    admin: &str,
    doc: &str,
) -> anyhow::Result<String> {
    let token = sessions::token(http, base, admin, "checker", doc, "read").await?;
    let mut ws = wire::connect_with(
        &c.url,
        &format!("{doc}?token={token}"),
        Flavor::YWebsocket,
        wire::BULK_READ_BUFFER,
    )
    .await?;
    let state = wire::wait_synced(&mut ws, Flavor::YWebsocket, doc, &[0, 0]).await?;
    let _ = ws.close(None).await;
    let fresh = Doc::new();
    let text = fresh.get_or_insert_text("text");
    fresh
        .transact_mut()
        .apply_update(yrs::Update::decode_v1(&state)?)?;
    let s = text.get_string(&fresh.transact());
    Ok(s)
}

/// The parent's text must be the trace's final text with every typist's marker inserted
/// somewhere, each exactly once (the markers are inserted at the start while the merge's
/// text arrives: they may land between merged runs, never inside a marker).
fn check_parent(
    text: &str,
    final_text: &str,
    sent: &HashMap<(usize, u32), Instant>,
) -> anyhow::Result<()> {
    let mut found: HashMap<(usize, u32), usize> = HashMap::new();
    let mut rest = String::with_capacity(text.len());
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if let Some((key, len)) = marker_at(&bytes[i..]).filter(|(k, _)| sent.contains_key(k)) {
            *found.entry(key).or_default() += 1;
            i += len;
            continue;
        }
        let ch = text[i..].chars().next().context("char boundary")?;
        rest.push(ch);
        i += ch.len_utf8();
    }
    let missing = sent.keys().filter(|k| !found.contains_key(k)).count();
    let twice = found.values().filter(|n| **n > 1).count();
    anyhow::ensure!(
        missing == 0 && twice == 0,
        "the parent's text lacks {missing} of {} markers and has {twice} twice",
        sent.len()
    );
    if rest != final_text {
        let at = rest
            .bytes()
            .zip(final_text.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(rest.len().min(final_text.len()));
        let around = |s: &str| {
            s.get(at.saturating_sub(40)..(at + 40).min(s.len()))
                .unwrap_or("")
                .to_owned()
        };
        anyhow::bail!(
            "the parent's text without the markers differs from the trace's final text ({} \
             against {} bytes), first at byte {at}: {:?} against {:?}",
            rest.len(),
            final_text.len(),
            around(&rest),
            around(final_text)
        );
    }
    Ok(())
}

/// A marker `[k:n]` at the start of `b`: its key and length.
fn marker_at(b: &[u8]) -> Option<((usize, u32), usize)> {
    let b = b.strip_prefix(b"[")?;
    let k_len = b.iter().take_while(|c| c.is_ascii_digit()).count();
    let b2 = b.get(k_len..)?.strip_prefix(b":")?;
    let n_len = b2.iter().take_while(|c| c.is_ascii_digit()).count();
    if k_len == 0 || n_len == 0 || k_len > 6 || n_len > 9 || b2.get(n_len) != Some(&b']') {
        return None;
    }
    let k = std::str::from_utf8(&b[..k_len]).ok()?.parse().ok()?;
    let n = std::str::from_utf8(&b2[..n_len]).ok()?.parse().ok()?;
    Some(((k, n), k_len + n_len + 3))
}

/// Send times of the typists' markers, by (typist, marker number).
type Sent = Mutex<HashMap<(usize, u32), Instant>>;

/// The typists and the observer on the parent.
struct Typing {
    started: Instant,
    stop: Arc<AtomicBool>,
    observer_stop: Arc<AtomicBool>,
    sent: Arc<Sent>,
    typists: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    observer: tokio::task::JoinHandle<anyhow::Result<Vec<(Instant, Duration)>>>,
}

impl Typing {
    /// Connects the observer and the typists (each synced) and starts typing.
    async fn start(
        args: &BranchesArgs,
        http: &reqwest::Client,
        base: &str,
        parent: &str,
    ) -> anyhow::Result<Typing> {
        let c = &args.common;
        let admin = args.admin_key.as_str();
        let sent: Arc<Sent> = Arc::default();
        let token = sessions::token(http, base, admin, "observer", parent, "read").await?;
        let mut observer = wire::connect(
            &c.url,
            &format!("{parent}?token={token}"),
            Flavor::YWebsocket,
        )
        .await?;
        wire::wait_synced(&mut observer, Flavor::YWebsocket, parent, &[0, 0]).await?;
        let mut typists = Vec::new();
        for k in 0..args.typists {
            let user = format!("typist-{k}");
            let token = sessions::token(http, base, admin, &user, parent, "write").await?;
            let mut ws = wire::connect(
                &c.url,
                &format!("{parent}?token={token}"),
                Flavor::YWebsocket,
            )
            .await?;
            let state = wire::wait_synced(&mut ws, Flavor::YWebsocket, parent, &[0, 0]).await?;
            // The typist's own copy of the parent, so "the start" is the document's start.
            let doc = Doc::with_client_id(5_000_000 + k as u64);
            doc.transact_mut()
                .apply_update(yrs::Update::decode_v1(&state)?)?;
            typists.push((ws, doc));
        }
        let started = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let observer_stop = Arc::new(AtomicBool::new(false));
        let n = args.typists;
        let typists = typists
            .into_iter()
            .enumerate()
            .map(|(k, (ws, doc))| {
                let phase = args.type_every.mul_f64(k as f64 / n as f64);
                tokio::spawn(typist(
                    ws,
                    doc,
                    k,
                    (started + phase, args.type_every),
                    stop.clone(),
                    sent.clone(),
                ))
            })
            .collect();
        let observer = tokio::spawn(observe(observer, n, observer_stop.clone(), sent.clone()));
        Ok(Typing {
            started,
            stop,
            observer_stop,
            sent,
            typists,
            observer,
        })
    }

    /// Stops the typists, waits for the observer to receive every marker; the markers' send
    /// times, and each delivery's send time and latency.
    async fn stop(
        self,
    ) -> anyhow::Result<(HashMap<(usize, u32), Instant>, Vec<(Instant, Duration)>)> {
        self.stop.store(true, Ordering::SeqCst);
        let mut failed = Vec::new();
        for (k, t) in self.typists.into_iter().enumerate() {
            if let Err(e) = t.await? {
                failed.push(format!("typist {k}: {e}"));
            }
        }
        self.observer_stop.store(true, Ordering::SeqCst);
        let delivered = self.observer.await?;
        anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
        let delivered = delivered?;
        let sent = std::mem::take(&mut *self.sent.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
        Ok((sent, delivered))
    }
}

/// One typist: a marker `[k:n]` inserted at the start of its copy of the parent every
/// period, sent as an update; whatever the server sends is read and dropped.
async fn typist(
    ws: wire::Ws,
    doc: Doc,
    k: usize,
    (first, every): (Instant, Duration),
    stop: Arc<AtomicBool>,
    sent: Arc<Sent>,
) -> anyhow::Result<()> {
    let text = doc.get_or_insert_text("text");
    let (mut sink, mut stream) = ws.split();
    let mut tick = tokio::time::interval_at(first.into(), every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                n += 1;
                let update = {
                    let mut txn = doc.transact_mut();
                    text.insert(&mut txn, 0, &format!("[{k}:{n}]"));
                    txn.encode_update_v1()
                };
                sent.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert((k, n), Instant::now());
                sink.send(WsMessage::Binary(protocol::encode_update(&update))).await?;
            }
            frame = stream.next() => match frame {
                None => anyhow::bail!("the server closed the connection"),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(WsMessage::Close(f))) => anyhow::bail!("closed by the server: {f:?}"),
                Some(Ok(_)) => {}
            },
        }
    }
    let _ = sink.close().await;
    Ok(())
}

/// The observer: finds the typists' markers in every update it receives (by their bytes, so
/// however the server packs updates) and records each one's delivery latency the first time.
/// Once told to stop, it ends when it has seen every marker sent, or fails after [`DRAIN`].
async fn observe(
    mut ws: wire::Ws,
    typists: usize,
    stop: Arc<AtomicBool>,
    sent: Arc<Sent>,
) -> anyhow::Result<Vec<(Instant, Duration)>> {
    let mut seen: HashSet<(usize, u32)> = HashSet::new();
    let mut delivered = Vec::new();
    let mut check = tokio::time::interval(Duration::from_millis(50));
    let mut deadline: Option<Instant> = None;
    loop {
        tokio::select! {
            frame = ws.next() => {
                let Some(frame) = frame else { anyhow::bail!("the server closed the observer") };
                let data = match frame? {
                    WsMessage::Binary(b) => b,
                    WsMessage::Close(f) => anyhow::bail!("the server closed the observer: {f:?}"),
                    _ => continue,
                };
                let now = Instant::now();
                for m in wire::parse(Flavor::YWebsocket, &data) {
                    let (Incoming::Update(u) | Incoming::Step2(u)) = m else { continue };
                    let times = sent.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
                    for i in memchr_all(&u, b'[') {
                        let Some((key, _)) = marker_at(&u[i..]) else { continue };
                        if key.0 >= typists || seen.contains(&key) {
                            continue;
                        }
                        if let Some(at) = times.get(&key) {
                            seen.insert(key);
                            delivered.push((*at, now.duration_since(*at)));
                        }
                    }
                }
            }
            _ = check.tick() => {
                if stop.load(Ordering::SeqCst) {
                    let all = sent.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.len();
                    if seen.len() >= all {
                        break;
                    }
                    let until = *deadline.get_or_insert_with(|| Instant::now() + DRAIN);
                    anyhow::ensure!(
                        Instant::now() < until,
                        "{} of {all} markers never reached the observer",
                        all - seen.len()
                    );
                }
            }
        }
    }
    let _ = ws.close(None).await;
    Ok(delivered)
}

/// The positions of `byte` in `b`.
fn memchr_all(b: &[u8], byte: u8) -> impl Iterator<Item = usize> + '_ {
    b.iter()
        .enumerate()
        .filter(move |(_, c)| **c == byte)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_read_and_removed_exactly() {
        assert_eq!(marker_at(b"[3:41]rest"), Some(((3, 41), 6)));
        assert_eq!(marker_at(b"[3:]"), None);
        assert_eq!(marker_at(b"[a:1]"), None);
        assert_eq!(marker_at(b"[3:41"), None);
        let now = Instant::now();
        let sent: HashMap<(usize, u32), Instant> =
            [((0, 1), now), ((1, 1), now), ((0, 2), now)].into();
        assert!(check_parent("[0:2][1:1]He[0:1]llo [x:1]", "Hello [x:1]", &sent).is_ok());
        // A marker missing, one twice, or the text around them wrong: each fails.
        assert!(check_parent("[0:2]He[0:1]llo [x:1]", "Hello [x:1]", &sent).is_err());
        assert!(check_parent("[0:2][1:1][1:1]He[0:1]llo [x:1]", "Hello [x:1]", &sent).is_err());
        assert!(check_parent("[0:2][1:1]He[0:1]lo [x:1]", "Hello [x:1]", &sent).is_err());
    }
}
