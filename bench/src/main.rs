//! `quire-bench`: drives y-websocket-compatible servers (and Hocuspocus) and measures what
//! clients see. Every result is printed as a line of JSON (for `bench/report.py`) after a
//! human-readable summary, with the generator's own CPU use beside it.
//!
//! Scenarios:
//! - `typing`: R rooms × C clients, W of them typing at a fixed rate; every other client of the
//!   room records delivery latency. `--ack` adds a durable-ack request (tag 102) per update.
//!   Fan-out is `typing --rooms 1 --clients N+1 --writers 1`. `--docs-per-socket K`
//!   (Hocuspocus) carries the clients of K rooms on one socket (`multiplex`).
//! - `search`: repeated `typing` runs at rising rates (× `--step`), then `--refine`
//!   bisections between the last passing and the first failing rate; the highest with p99
//!   under a bound and every update delivered.
//! - `idle`: N connections over R rooms, connected and synced, then idle: time to connect and
//!   server RSS per connection.
//! - `coldload`: replays the editing trace through one client (ingest rate), or (with
//!   `--verify`) times a new client's sync to the stored document and checks its text.
//! - `history` (Quire only): replays the editing trace as sessions of one author each (a
//!   token per author, a pause longer than the server's `--version-idle` between them), then
//!   times the history routes: listing the sessions, the content at random positions, the
//!   diff of two versions far apart.
//! - `branches` (Quire only): replays the editing trace into a branch as sessions by a few
//!   authors, then times listing the branch's changes, merging one author's changes (with
//!   what they depend on) and merging the rest while typists type into the parent, whose
//!   delivery latency is compared with the same typists' just before; checks the parent's
//!   text after each round.
//!
//! - `presence`: N clients in one document, each moving its cursor (an awareness change) once
//!   a second; a sample of them times every other client's change; server CPU per change.
//!
//! - `memory`: a large document's cost in server RSS once loaded, after a join storm and
//!   after typing (a snapshot), on the storm's seeded document.
//!
//! - `reads` (Quire only): a large document's content now, at a version and at an older
//!   position: the first read's time, CPU and memory, and the CPU of each read again.
//!
//! - `capacity` (Quire only): a one-character JSON edit on a large document beside the same
//!   edit on an empty one, the clients an agent's edits add, and never-reading clients of
//!   whole-document answers beside other readers and editors.
//!
//! The generator is cheap by design: clients never apply what they receive; they decode only
//! the update's block ids to find which send it was.

mod branches;
mod capacity;
mod heavy;
mod items;
mod large;
mod memory;
mod multiplex;
mod presence;
mod reads;
mod sessions;
mod typist;
mod wire;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use quire_protocol as protocol;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use typist::{frame_data, Typist};
use wire::{Flavor, Incoming};
use yrs::{Doc, GetString, Text, Transact};

#[derive(Parser)]
#[command(name = "quire-bench", about = "Load generator for y-websocket servers")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// Rooms × clients typing at a fixed rate; delivery latency between clients.
    Typing(TypingArgs),
    /// The highest rate whose p99 delivery latency stays under a bound.
    Search(SearchArgs),
    /// Many idle connections: connect time and server RSS per connection.
    Idle(IdleArgs),
    /// The real editing trace through one client, or a new client's sync to it.
    Coldload(ColdArgs),
    /// The editing trace as sessions of one author each; then the history routes, timed.
    History(HistoryArgs),
    /// Many clients opening one large document at the same moment.
    Storm(large::StormArgs),
    /// Whole-document reads of a large document in loops beside typists (Quire only).
    Heavy(heavy::HeavyArgs),
    /// The editing trace as sessions of a few authors on a branch; then its change list and
    /// its merges, timed, with typists on the parent (Quire only).
    Branches(branches::BranchesArgs),
    /// Clients in one document each moving its cursor (an awareness change) at a fixed rate;
    /// delivery latency of presence and server CPU per change.
    Presence(presence::PresenceArgs),
    /// A large document's cost in server RSS: loaded, after a join storm, after typing.
    Memory(memory::MemoryArgs),
    /// A large document's content read now, at a version and at a position: first read
    /// and repeated reads, server CPU each (Quire only).
    Reads(reads::ReadsArgs),
    /// JSON edits on a large document beside an empty one, the clients an agent's edits add,
    /// and never-reading clients of whole-document answers beside others (Quire only).
    Capacity(capacity::CapacityArgs),
    /// yrs alone decoding a state file (Yjs v1) into a fresh document and encoding it again:
    /// the floor of a snapshot, to alternate with `quire compact` on one machine.
    Roundtrip(memory::RoundtripArgs),
}

#[derive(clap::Args, Clone)]
struct HistoryArgs {
    #[command(flatten)]
    common: Common,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    trace: PathBuf,
    /// Sessions (authors) the trace is cut into
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// The server's admin key, to issue each author's token
    #[arg(long)]
    admin_key: String,
    /// Pause between sessions: longer than the server's `--version-idle`
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// Times each read is repeated
    #[arg(long, default_value_t = 20)]
    repeat: usize,
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Server URL (y-websocket: the room name is appended as a path segment). Several,
    /// comma-separated, spread the typing scenario's clients over several nodes: client c of
    /// room r connects to URL (r + c) mod n, so room r's first client (whose node becomes the
    /// owner) is on node r mod n
    #[arg(long, default_value = "ws://127.0.0.1:1234")]
    url: String,
    #[arg(long, value_enum, default_value = "y-websocket")]
    flavor: Flavor,
    /// PID of the server, to report its CPU time and RSS
    #[arg(long)]
    server_pid: Option<u32>,
    /// Label printed with the results (the server's name)
    #[arg(long, default_value = "server")]
    label: String,
    /// Prefix of room names (use a fresh one per run)
    #[arg(long, default_value = "bench")]
    prefix: String,
}

#[derive(clap::Args, Clone)]
struct TypingArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 200)]
    rooms: usize,
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Clients per room that type (the others only read); default all
    #[arg(long)]
    writers: Option<usize>,
    /// Updates per second per typing client
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time after connecting, before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Also request a durable acknowledgement (tag 102) after each update (Quire only)
    #[arg(long)]
    ack: bool,
    /// Soak: every this long, append a sample of the server's RSS and open file descriptors
    /// (needs --server-pid) and the updates sent and delivered so far to --samples
    #[arg(long, value_parser = humantime::parse_duration)]
    sample_every: Option<Duration>,
    /// File the soak samples go to, one JSON object per line
    #[arg(long, default_value = "soak.jsonl")]
    samples: std::path::PathBuf,
    /// Large documents: first upload a seeded document of this many MiB (encoded) into every
    /// room, so the clients type into it
    #[arg(long)]
    seed_mb: Option<f64>,
    /// With several URLs (`--url a,b,c`): every client of a document connects to the same
    /// node, chosen by the document (as a load balancer hashing the path would), instead of
    /// spreading a document's clients over the nodes
    #[arg(long)]
    by_document: bool,
    /// Documents per socket (Hocuspocus only; --rooms a multiple of it): rooms in groups of K,
    /// one socket per group and client index carrying that client of each room of the group.
    /// With several URLs, every room is first opened on the node meant to own it: its group's
    /// (--by-document), or room r on URL r mod n, so a socket's rooms have different owners
    #[arg(long, default_value_t = 1)]
    docs_per_socket: usize,
}

#[derive(clap::Args, Clone)]
struct SearchArgs {
    #[command(flatten)]
    typing: TypingArgs,
    /// p99 delivery latency bound, milliseconds
    #[arg(long, default_value_t = 50.0)]
    p99_ms: f64,
    /// Rate multiplier between steps
    #[arg(long, default_value_t = 1.5)]
    step: f64,
    /// Most steps
    #[arg(long, default_value_t = 12)]
    steps: usize,
    /// After the first failing step, this many bisections (geometric) between the last
    /// passing rate and the failing one, so the result is not quantised by `--step`
    #[arg(long, default_value_t = 3)]
    refine: usize,
}

#[derive(clap::Args, Clone)]
struct IdleArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 2000)]
    conns: usize,
    #[arg(long, default_value_t = 500)]
    rooms: usize,
    /// Connections opened at once
    #[arg(long, default_value_t = 64)]
    parallel: usize,
    /// How long to hold the connections before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    settle: Duration,
}

#[derive(clap::Args, Clone)]
struct ColdArgs {
    #[command(flatten)]
    common: Common,
    /// The editing trace (gzipped JSON: edits and finalText)
    #[arg(long, default_value = "tests/data/editing-trace.json.gz")]
    trace: PathBuf,
    /// Instead of ingesting: time a new client's sync and check its text
    #[arg(long)]
    verify: bool,
    /// Edits per frame... one update per message, this many messages per write batch
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Give up on a server that has not taken and relayed the whole trace by then (a server
    /// that stops reading would otherwise hold the run forever)
    #[arg(long, default_value = "300s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().scenario {
        Scenario::Typing(args) => {
            let r = typing(&args).await?;
            r.print();
        }
        Scenario::Search(args) => search(args).await?,
        Scenario::History(args) => history(args).await?,
        Scenario::Idle(args) => idle(args).await?,
        Scenario::Coldload(args) => coldload(args).await?,
        Scenario::Storm(args) => large::storm(args).await?,
        Scenario::Heavy(args) => heavy::heavy(args).await?,
        Scenario::Branches(args) => branches::branches(args).await?,
        Scenario::Presence(args) => presence::presence(args).await?,
        Scenario::Memory(args) => memory::memory(args).await?,
        Scenario::Reads(args) => reads::reads(args).await?,
        Scenario::Capacity(args) => capacity::capacity(args).await?,
        Scenario::Roundtrip(args) => memory::roundtrip(&args)?,
    }
    Ok(())
}

fn histogram() -> Histogram<u64> {
    // Microseconds, up to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

/// Send times of updates, keyed by (client id, start clock of the insert). Read by every
/// receiver of a room at once, written by its typists.
type SendTimes = RwLock<HashMap<(u64, u32), Instant>>;

/// Latencies a client measured and has not yet added to the shared histogram: one client's
/// receptions do not contend on the shared lock with the room's other receivers (200 of them
/// receiving the same update at the same moment in the fan-out scenario).
struct Measured {
    shared: Arc<Shared>,
    delivered: u64,
    latencies: Vec<u64>,
}

/// Latencies kept locally before a client takes the shared lock.
const MEASURED_BATCH: usize = 256;

impl Measured {
    fn new(shared: Arc<Shared>) -> Measured {
        Measured {
            shared,
            delivered: 0,
            latencies: Vec::with_capacity(MEASURED_BATCH),
        }
    }

    fn record(&mut self, latency: Duration) {
        self.delivered += 1;
        self.latencies.push(latency.as_micros().max(1) as u64);
        if self.latencies.len() >= MEASURED_BATCH {
            self.flush();
        }
    }

    fn flush(&mut self) {
        self.shared
            .delivered
            .fetch_add(std::mem::take(&mut self.delivered), Ordering::Relaxed);
        if let Ok(mut h) = self.shared.latency.lock() {
            for us in &self.latencies {
                let _ = h.record(*us);
            }
        }
        self.latencies.clear();
    }
}

impl Drop for Measured {
    /// Whatever way the client ends (an error included), its measurements count.
    fn drop(&mut self) {
        self.flush();
    }
}

struct Shared {
    measuring_from: Instant,
    measuring_until: Instant,
    sent: AtomicU64,
    delivered: AtomicU64,
    latency: Mutex<Histogram<u64>>,
    ack_latency: Mutex<Histogram<u64>>,
    acks: AtomicU64,
    errors: AtomicU64,
}

impl Shared {
    fn measuring(&self, t: Instant) -> bool {
        t >= self.measuring_from && t < self.measuring_until
    }
}

struct TypingResult {
    label: String,
    rooms: usize,
    clients: usize,
    writers: usize,
    docs_per_socket: usize,
    rate: f64,
    secs: f64,
    sent: u64,
    delivered: u64,
    expected: u64,
    errors: u64,
    connect: Duration,
    lat: Histogram<u64>,
    ack: Option<(u64, Histogram<u64>)>,
    bench_cpu: f64,
    server_cpu: Option<f64>,
    server_rss_kib: Option<u64>,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl TypingResult {
    fn p99(&self) -> f64 {
        ms(self.lat.value_at_quantile(0.99))
    }

    fn complete(&self) -> bool {
        self.expected > 0 && self.delivered >= self.expected && self.errors == 0
    }

    fn print(&self) {
        println!(
            "{} typing: {} rooms x {} clients ({} typing) at {}/s for {:.0}s",
            self.label, self.rooms, self.clients, self.writers, self.rate, self.secs
        );
        println!("  connected and synced in {:.2?}", self.connect);
        println!(
            "  updates sent {} ({:.0}/s), deliveries {}/{} ({:.0}/s), errors {}",
            self.sent,
            self.sent as f64 / self.secs,
            self.delivered,
            self.expected,
            self.delivered as f64 / self.secs,
            self.errors
        );
        println!(
            "  delivery latency ms: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            ms(self.lat.value_at_quantile(0.5)),
            self.p99(),
            ms(self.lat.value_at_quantile(0.999)),
            ms(self.lat.max())
        );
        if let Some((n, h)) = &self.ack {
            println!(
                "  durable ack ms ({n} acks): p50 {:.2}  p99 {:.2}  max {:.2}",
                ms(h.value_at_quantile(0.5)),
                ms(h.value_at_quantile(0.99)),
                ms(h.max())
            );
        }
        println!("  load generator CPU: {:.2} s", self.bench_cpu);
        if let Some(cpu) = self.server_cpu {
            println!(
                "  server CPU: {cpu:.2} s, {:.3} s per 1,000 updates; RSS {} KiB",
                cpu / (self.sent.max(1) as f64 / 1000.0),
                self.server_rss_kib.unwrap_or(0)
            );
        }
        let json = serde_json::json!({
            "scenario": "typing", "label": self.label, "rooms": self.rooms,
            "clients": self.clients, "writers": self.writers, "rate": self.rate,
            "docs_per_socket": self.docs_per_socket,
            "offered_per_s": self.rate * (self.rooms * self.writers) as f64,
            "sent": self.sent, "delivered": self.delivered, "expected": self.expected,
            "errors": self.errors, "complete": self.complete(),
            "p50_ms": ms(self.lat.value_at_quantile(0.5)), "p99_ms": self.p99(),
            "max_ms": ms(self.lat.max()),
            "ack_p50_ms": self.ack.as_ref().map(|(_, h)| ms(h.value_at_quantile(0.5))),
            "ack_p99_ms": self.ack.as_ref().map(|(_, h)| ms(h.value_at_quantile(0.99))),
            "bench_cpu_s": self.bench_cpu, "server_cpu_s": self.server_cpu,
            "server_cpu_per_1k": self.server_cpu.map(|c| c / (self.sent.max(1) as f64 / 1000.0)),
            "server_rss_kib": self.server_rss_kib,
        });
        println!("{json}");
    }
}

async fn typing(args: &TypingArgs) -> anyhow::Result<TypingResult> {
    let c = &args.common;
    let writers = args.writers.unwrap_or(args.clients).min(args.clients);
    multiplex::check(args)?;
    if let Some(mb) = args.seed_mb {
        let (updates, _, size) = large::seeded_updates((mb * 1048576.0) as usize, 512 * 1024, 1);
        let expect = size * 95 / 100;
        for room in 0..args.rooms {
            let doc = format!("{}-{room}", c.prefix);
            large::upload(c, &doc, &updates, expect, Duration::from_secs(300))
                .await
                .with_context(|| format!("seed {doc}"))?;
        }
    }
    let cpu_start = own_cpu_seconds();
    let connect_started = Instant::now();
    // A socket per client, or (--docs-per-socket) per client index of a group of rooms.
    let (sockets, mux) = match args.docs_per_socket {
        1 => (connect_clients(args).await?, None),
        _ => (Vec::new(), Some(multiplex::connect(args).await?)),
    };
    let connect = connect_started.elapsed();
    let start = Instant::now() + args.warmup;
    let shared = Arc::new(Shared {
        measuring_from: start,
        measuring_until: start + args.duration,
        sent: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        latency: Mutex::new(histogram()),
        ack_latency: Mutex::new(histogram()),
        acks: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let room_maps: Vec<Arc<SendTimes>> = (0..args.rooms)
        .map(|_| Arc::new(RwLock::new(HashMap::new())))
        .collect();
    let stop_at = start + args.duration + Duration::from_secs(2);
    let server_cpu_start = c.server_pid.and_then(process_cpu_seconds);
    let sampler = match (args.sample_every, c.server_pid) {
        (Some(every), Some(pid)) => Some(tokio::spawn(sample(
            pid,
            every,
            args.samples.clone(),
            shared.clone(),
            stop_at,
        ))),
        (Some(_), None) => anyhow::bail!("--sample-every needs --server-pid"),
        _ => None,
    };
    let mut tasks = Vec::with_capacity(sockets.len());
    for (i, (room, client, doc, ws)) in sockets.into_iter().enumerate() {
        let shared = shared.clone();
        let times = room_maps[room].clone();
        let plan = ClientPlan {
            client_id: 1_000_000 + i as u64,
            index: i,
            writes: client < writers,
            rate: args.rate,
            ack: args.ack,
            flavor: c.flavor,
            doc,
            stop_at,
        };
        tasks.push(tokio::spawn(async move {
            let id = plan.client_id;
            if let Err(e) = run_client(ws, plan, times, shared.clone()).await {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("client {id}: {e}");
            }
        }));
    }
    if let Some(mux) = mux {
        tasks.extend(mux.spawn(args, writers, &shared, &room_maps, stop_at));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(sampler) = sampler {
        sampler.await??;
    }
    let server_cpu = match (c.server_pid.and_then(process_cpu_seconds), server_cpu_start) {
        (Some(end), Some(start)) => Some(end - start),
        _ => None,
    };
    let sent = shared.sent.load(Ordering::Relaxed);
    let ack = args.ack.then(|| {
        (
            shared.acks.load(Ordering::Relaxed),
            shared
                .ack_latency
                .lock()
                .map(|h| h.clone())
                .unwrap_or_else(|_| histogram()),
        )
    });
    Ok(TypingResult {
        label: c.label.clone(),
        rooms: args.rooms,
        clients: args.clients,
        writers,
        docs_per_socket: args.docs_per_socket,
        rate: args.rate,
        secs: args.duration.as_secs_f64(),
        sent,
        delivered: shared.delivered.load(Ordering::Relaxed),
        expected: sent * (args.clients as u64 - 1),
        errors: shared.errors.load(Ordering::Relaxed),
        connect,
        lat: shared
            .latency
            .lock()
            .map(|h| h.clone())
            .unwrap_or_else(|_| histogram()),
        ack,
        bench_cpu: own_cpu_seconds() - cpu_start,
        server_cpu,
        server_rss_kib: c.server_pid.and_then(process_rss_kib),
    })
}

/// Every client's socket, connected and synced: (room, client, document, socket).
async fn connect_clients(
    args: &TypingArgs,
) -> anyhow::Result<Vec<(usize, usize, String, wire::Ws)>> {
    let c = &args.common;
    let mut sockets = Vec::with_capacity(args.rooms * args.clients);
    for room in 0..args.rooms {
        let doc = format!("{}-{room}", c.prefix);
        for client in 0..args.clients {
            let urls: Vec<&str> = c.url.split(',').collect();
            let url = if args.by_document {
                urls[room % urls.len()]
            } else {
                urls[(room + client) % urls.len()]
            };
            let ws = wire::connect(url, &doc, c.flavor)
                .await
                .with_context(|| format!("connect {url} {doc}"))?;
            sockets.push((room, client, doc.clone(), ws));
        }
    }
    // Every client is synced before the clock starts: a client whose initial Step 2 arrived
    // after the first sends would receive them twice (in the Step 2 and as updates) and be
    // credited twice. The Step 2s are already on their way, so waiting in turn costs little.
    for (_, _, doc, ws) in &mut sockets {
        wire::wait_synced(ws, c.flavor, doc, &[0, 0])
            .await
            .with_context(|| format!("sync {doc}"))?;
    }
    Ok(sockets)
}

struct ClientPlan {
    client_id: u64,
    index: usize,
    writes: bool,
    rate: f64,
    ack: bool,
    flavor: Flavor,
    doc: String,
    stop_at: Instant,
}

async fn run_client(
    ws: wire::Ws,
    plan: ClientPlan,
    times: Arc<SendTimes>,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let (writes, flavor, stop_at) = (plan.writes, plan.flavor, plan.stop_at);
    let mut typist = Typist::new(plan, times, shared);
    let mut tick = typist.timer();
    let send_until = stop_at - Duration::from_secs(2);
    // Readers have no timer of their own but this one: a reader woken every period for
    // nothing would cost the generator CPU and add noise to every delivery it measures.
    let stop = tokio::time::sleep_until(stop_at.into());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick(), if writes => {
                let now = Instant::now();
                if now >= stop_at { break; }
                if now >= send_until { continue; }
                typist.send_update(&mut sink, now).await?;
            }
            frame = stream.next() => {
                let Some(data) = frame_data(frame)? else { continue };
                let now = Instant::now();
                for msg in wire::parse(flavor, &data) {
                    typist.receive(msg, &mut sink, now).await?;
                }
            }
        }
    }
    let _ = sink.close().await;
    Ok(())
}

async fn search(args: SearchArgs) -> anyhow::Result<()> {
    // Coarse steps up by `--step` until one fails, then `--refine` geometric bisections
    // between the best passing rate and the lowest failing one. Rates are per client.
    let mut best: Option<(f64, f64, f64)> = None; // (rate, offered updates/s, p99)
    let mut failed: Option<f64> = None;
    let mut rate = args.typing.rate;
    for step in 0..args.steps {
        if search_step(&args, rate, step, &mut best).await? {
            rate *= args.step;
        } else {
            failed = Some(rate);
            break;
        }
    }
    // Refine only between a pass and a failure (nothing to bisect otherwise).
    if let (Some(mut fail), true) = (failed, best.is_some()) {
        for i in 0..args.refine {
            let Some((low, _, _)) = best else { break };
            let mid = (low * fail).sqrt();
            if !search_step(&args, mid, args.steps + i, &mut best).await? {
                fail = mid;
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "scenario": "search", "label": args.typing.common.label,
            "best_rate_per_s": best.map(|b| b.1), "p99_ms_at_best": best.map(|b| b.2),
            "bound_ms": args.p99_ms,
        })
    );
    Ok(())
}

/// One typing run of the search at `rate` per client; whether it passed. Updates `best`.
async fn search_step(
    args: &SearchArgs,
    rate: f64,
    step: usize,
    best: &mut Option<(f64, f64, f64)>,
) -> anyhow::Result<bool> {
    let mut t = args.typing.clone();
    t.rate = rate;
    t.common.prefix = format!("{}-s{step}", args.typing.common.prefix);
    let r = typing(&t).await?;
    r.print();
    let total = rate * (t.rooms * r.writers) as f64;
    let ok = r.complete() && r.p99() <= args.p99_ms;
    println!(
        "{}",
        serde_json::json!({
            "scenario": "search-step", "label": r.label, "offered_per_s": total,
            "p99_ms": r.p99(), "complete": r.complete(), "ok": ok,
            "server_cpu_s": r.server_cpu, "bench_cpu_s": r.bench_cpu,
        })
    );
    if ok && best.is_none_or(|b| total > b.1) {
        *best = Some((rate, total, r.p99()));
    }
    Ok(ok)
}

async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let rss_before = c.server_pid.and_then(process_rss_kib);
    let started = Instant::now();
    let mut conns = Vec::with_capacity(args.conns);
    let mut i = 0;
    while i < args.conns {
        let wave: Vec<_> = (i..(i + args.parallel).min(args.conns))
            .map(|k| {
                let doc = format!("{}-{}", c.prefix, k % args.rooms);
                let (url, flavor) = (c.url.clone(), c.flavor);
                tokio::spawn(async move {
                    let mut ws = wire::connect(&url, &doc, flavor).await?;
                    wire::wait_synced(&mut ws, flavor, &doc, &[0, 0]).await?;
                    anyhow::Ok(ws)
                })
            })
            .collect();
        for t in wave {
            conns.push(t.await??);
        }
        i += args.parallel;
    }
    let connect = started.elapsed();
    tokio::time::sleep(args.settle).await;
    let rss_after = c.server_pid.and_then(process_rss_kib);
    let per_conn = match (rss_before, rss_after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / args.conns as f64),
        _ => None,
    };
    println!(
        "{} idle: {} connections over {} rooms in {connect:.2?}; server RSS {} -> {} KiB ({:.2} KiB per connection)",
        c.label,
        args.conns,
        args.rooms,
        rss_before.unwrap_or(0),
        rss_after.unwrap_or(0),
        per_conn.unwrap_or(0.0)
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "idle", "label": c.label, "conns": args.conns, "rooms": args.rooms,
            "connect_s": connect.as_secs_f64(), "rss_before_kib": rss_before,
            "rss_after_kib": rss_after, "kib_per_conn": per_conn,
        })
    );
    drop(conns);
    Ok(())
}

struct Trace {
    edits: Vec<(u32, u32, String)>,
    final_text: String,
}

fn read_trace(path: &PathBuf) -> anyhow::Result<Trace> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let json: serde_json::Value = serde_json::from_reader(flate2::read::GzDecoder::new(file))?;
    let edits = json["edits"]
        .as_array()
        .context("edits")?
        .iter()
        .filter_map(|e| {
            let e = e.as_array()?;
            Some((
                e.first()?.as_u64()? as u32,
                e.get(1)?.as_u64()? as u32,
                e.get(2)?.as_str()?.to_owned(),
            ))
        })
        .collect();
    let final_text = json["finalText"].as_str().context("finalText")?.to_owned();
    Ok(Trace { edits, final_text })
}

async fn coldload(args: ColdArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let trace = read_trace(&args.trace)?;
    let doc_name = format!("{}-trace", c.prefix);
    if args.verify {
        let started = Instant::now();
        let mut ws = wire::connect(&c.url, &doc_name, c.flavor).await?;
        let state = wire::wait_synced(&mut ws, c.flavor, &doc_name, &[0, 0]).await?;
        let synced = started.elapsed();
        let doc = Doc::new();
        let text = doc.get_or_insert_text("text");
        {
            let mut txn = doc.transact_mut();
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(&state) {
                let _ = txn.apply_update(u);
            }
        }
        let got = text.get_string(&doc.transact());
        let ok = got == trace.final_text;
        println!(
            "{} cold sync: {synced:.2?} to a synced client, {} chars, text {}",
            c.label,
            got.len(),
            if ok { "matches" } else { "DIFFERS" }
        );
        println!(
            "{}",
            serde_json::json!({
                "scenario": "coldload-verify", "label": c.label, "sync_ms": synced.as_secs_f64() * 1000.0,
                "chars": got.len(), "text_ok": ok, "server_rss_kib": c.server_pid.and_then(process_rss_kib),
            })
        );
        return Ok(());
    }
    // Ingest: every edit is one update message, as an editor sends them; a second client
    // watches, and the ingest is done when it has received every edit.
    let cpu_start = own_cpu_seconds();
    let mut ws = wire::connect(&c.url, &doc_name, c.flavor).await?;
    wire::wait_synced(&mut ws, c.flavor, &doc_name, &[0, 0]).await?;
    let mut watcher = wire::connect(&c.url, &doc_name, c.flavor).await?;
    wire::wait_synced(&mut watcher, c.flavor, &doc_name, &[0, 0]).await?;
    let total_edits = trace.edits.len();
    // Encode every edit's update before the clock starts: the generator must not be what is
    // measured.
    let doc = Doc::with_client_id(424_242);
    let text = doc.get_or_insert_text("text");
    let updates: Vec<Vec<u8>> = trace
        .edits
        .iter()
        .map(|(pos, del, ins)| {
            let mut txn = doc.transact_mut();
            if *del > 0 {
                text.remove_range(&mut txn, *pos, *del);
            }
            if !ins.is_empty() {
                text.insert(&mut txn, *pos, ins);
            }
            txn.encode_update_v1()
        })
        .collect();
    // The same updates decoded and applied by yrs alone, on this machine, now: the reference
    // the ingest rate is read against (the machine's speed varies from day to day).
    let local = {
        let started = Instant::now();
        let alone = Doc::new();
        for update in &updates {
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(update) {
                let _ = alone.transact_mut().apply_update(u);
            }
        }
        total_edits as f64 / started.elapsed().as_secs_f64()
    };
    let frames: Vec<Bytes> = updates
        .iter()
        .map(|u| wire::wrap(c.flavor, &doc_name, protocol::encode_update(u)))
        .collect();
    drop(updates);
    let started = Instant::now();
    let (mut sink, mut stream) = ws.split();
    // Drain whatever the server sends the writer (echoes), so its socket never stalls; say why
    // if the server closes it before we do.
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let we_close = closing.clone();
    let drain = tokio::spawn(async move {
        while let Some(msg) = stream.next().await {
            match msg {
                Ok(WsMessage::Close(frame)) if !we_close.load(Ordering::SeqCst) => {
                    eprintln!("the server closed the ingest connection: {frame:?}");
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("the ingest connection failed: {e}");
                    break;
                }
            }
        }
    });
    let writer = async {
        for chunk in frames.chunks(args.batch) {
            let mut msgs =
                futures_util::stream::iter(chunk.iter().map(|f| Ok(WsMessage::Binary(f.clone()))));
            sink.send_all(&mut msgs).await?;
        }
        anyhow::Ok(sink)
    };
    // The watcher only collects what it receives, so it keeps up with any server (applying
    // every update as it arrived made it slower than Quire, which then closed it with 1013 as
    // a peer that does not read). It is done when it holds one update per edit (servers relay
    // each update as it came), or, for a server that merges updates, when the stream has been
    // quiet for a while and what it holds gives the trace's final text. The time is taken at
    // the last arrival; the text is checked after the clock stops, in either case.
    let watch = async {
        let mut received: Vec<Bytes> = Vec::with_capacity(total_edits);
        let mut last_arrival = started;
        loop {
            if received.len() >= total_edits {
                break;
            }
            match tokio::time::timeout(WATCH_QUIET, watcher.next()).await {
                Ok(None) => anyhow::bail!("watcher closed before the end of the trace"),
                Ok(Some(frame)) => match frame? {
                    WsMessage::Binary(data) => {
                        for m in wire::parse(c.flavor, &data) {
                            if let Incoming::Update(u) = m {
                                received.push(u);
                                last_arrival = Instant::now();
                            }
                        }
                    }
                    // Say why, for the record.
                    WsMessage::Close(frame) => eprintln!(
                        "the server closed the watcher after {} updates: {frame:?}",
                        received.len()
                    ),
                    _ => {}
                },
                Err(_) if watched_text(&received) == trace.final_text => break,
                Err(_) => {}
            }
        }
        let elapsed = last_arrival.duration_since(started);
        if watched_text(&received) != trace.final_text {
            anyhow::bail!("the watcher's text differs from the trace's final text");
        }
        anyhow::Ok(elapsed)
    };
    let Ok((sink, watched)) =
        tokio::time::timeout(args.timeout, async { tokio::join!(writer, watch) }).await
    else {
        anyhow::bail!(
            "the server had not taken and relayed the trace after {:?} (--timeout)",
            args.timeout
        );
    };
    let mut sink = sink?;
    let elapsed = watched?;
    closing.store(true, Ordering::SeqCst);
    let _ = sink.close().await;
    drain.abort();
    let rate = total_edits as f64 / elapsed.as_secs_f64();
    println!(
        "{} ingest: {total_edits} edits in {elapsed:.2?} ({rate:.0} updates/s; yrs alone \
         here: {local:.0}/s), generator CPU {:.2} s",
        c.label,
        own_cpu_seconds() - cpu_start
    );
    println!(
        "{}",
        serde_json::json!({
            "scenario": "coldload-ingest", "label": c.label, "edits": total_edits,
            "secs": elapsed.as_secs_f64(), "updates_per_s": rate,
            "yrs_alone_per_s": local,
            "bench_cpu_s": own_cpu_seconds() - cpu_start,
            "server_rss_kib": c.server_pid.and_then(process_rss_kib),
        })
    );
    Ok(())
}

/// The trace as `--sessions` sessions, one author each, each sent over its own connection
/// and committed (durable acknowledgement) before a pause; then the history routes timed.
async fn history(args: HistoryArgs) -> anyhow::Result<()> {
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

/// How long the trace's watcher waits on a quiet stream before checking whether what it
/// holds is already the final text (servers that merge updates send fewer messages).
const WATCH_QUIET: Duration = Duration::from_millis(500);

/// The text of a document made of `updates`.
fn watched_text(updates: &[Bytes]) -> String {
    let doc = Doc::new();
    let text = doc.get_or_insert_text("text");
    {
        let mut txn = doc.transact_mut();
        for u in updates {
            if let Ok(u) = <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(u) {
                let _ = txn.apply_update(u);
            }
        }
    }
    let s = text.get_string(&doc.transact());
    s
}

/// The soak's samples: every `every` until `until`, the server's RSS and open file
/// descriptors and the updates sent and delivered so far, as JSON lines in `path`.
async fn sample(
    pid: u32,
    every: Duration,
    path: std::path::PathBuf,
    shared: Arc<Shared>,
    until: Instant,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
    let started = Instant::now();
    let mut tick = tokio::time::interval(every);
    while Instant::now() < until {
        tick.tick().await;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.count())
            .unwrap_or(0);
        let line = serde_json::json!({
            "t_s": started.elapsed().as_secs_f64(),
            "rss_kib": process_rss_kib(pid),
            "fds": fds,
            "cpu_s": process_cpu_seconds(pid),
            "sent": shared.sent.load(Ordering::Relaxed),
            "delivered": shared.delivered.load(Ordering::Relaxed),
            "errors": shared.errors.load(Ordering::Relaxed),
        });
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

/// CPU seconds (user + system) used by this process so far.
fn own_cpu_seconds() -> f64 {
    process_cpu_seconds(std::process::id()).unwrap_or(0.0)
}

/// CPU seconds of a process from /proc (Linux).
fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0) // USER_HZ is 100 on Linux
}

/// Resident set size of a process in KiB, from /proc (Linux).
fn process_rss_kib(pid: u32) -> Option<u64> {
    proc_status_kib(pid, "VmRSS:")
}

/// A KiB field of a process's /proc status (`VmRSS:`, `VmHWM:`), Linux.
pub(crate) fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
