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
mod coldload;
mod heavy;
mod history;
mod idle;
mod items;
mod large;
mod memory;
mod multiplex;
mod presence;
mod reads;
mod sessions;
mod typing;
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

use coldload::ColdArgs;
use coldload::{coldload, read_trace, Trace};
use history::{history, HistoryArgs};
use idle::{idle, IdleArgs};
use typing::{search, typing, ClientPlan, Measured, SearchArgs, SendTimes, Shared, TypingArgs};

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

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
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
