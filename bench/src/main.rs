//! `quire-bench`: drives any y-websocket-compatible server and measures what clients see.
//!
//! Scenario `typing`: R rooms × C clients, each client sending small text updates at a fixed
//! rate; every other client of the room measures delivery latency (send to receipt). With
//! `--ack`, each update is followed by a durable-ack request (tag 102) and the echo latency is
//! measured too (only servers that implement it answer). The generator is cheap by design:
//! clients never apply what they receive; they decode only the update's state vector to find
//! which send it was. Its own CPU use is printed beside the results.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::{Parser, Subcommand};
use futures_util::{SinkExt, StreamExt};
use hdrhistogram::Histogram;
use quire_server::protocol::{self, Message};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::updates::decoder::Decode;
use yrs::{Doc, ReadTxn, Text, Transact, Update};

#[derive(Parser)]
#[command(name = "quire-bench", about = "Load generator for y-websocket servers")]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand)]
enum Scenario {
    /// R rooms × C clients typing at a fixed rate; delivery latency between clients.
    Typing(TypingArgs),
}

#[derive(clap::Args, Clone)]
struct TypingArgs {
    /// Server URL; the room name is appended as a path segment
    #[arg(long, default_value = "ws://127.0.0.1:1234")]
    url: String,
    #[arg(long, default_value_t = 200)]
    rooms: usize,
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Updates per second per client
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// Measured duration
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time after connecting, before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Also request a durable acknowledgement (tag 102) after each update
    #[arg(long)]
    ack: bool,
    /// PID of the server, to report its CPU time over the measured period
    #[arg(long)]
    server_pid: Option<u32>,
    /// Prefix of room names (use a fresh one per run)
    #[arg(long, default_value = "bench")]
    prefix: String,
    /// Label printed with the results (e.g. the server's name)
    #[arg(long, default_value = "server")]
    label: String,
}

/// Send times of updates, keyed by (client id, start clock of the insert).
type SendTimes = Mutex<HashMap<(u64, u32), Instant>>;

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

fn histogram() -> Histogram<u64> {
    // Microseconds, up to 60 s, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000, 3)
        .unwrap_or_else(|_| Histogram::new(3).unwrap_or_else(|_| unreachable!()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().scenario {
        Scenario::Typing(args) => typing(args).await,
    }
}

async fn typing(args: TypingArgs) -> anyhow::Result<()> {
    let cpu_start = own_cpu_seconds();
    let connect_started = Instant::now();
    let total = args.rooms * args.clients;
    let mut sockets = Vec::with_capacity(total);
    // Connect in small waves so the accept queue does not overflow.
    for room in 0..args.rooms {
        for client in 0..args.clients {
            let url = format!("{}/{}-{room}", args.url.trim_end_matches('/'), args.prefix);
            // TCP_NODELAY, as browsers do for WebSockets.
            let (ws, _) = tokio_tungstenite::connect_async_with_config(&url, None, true)
                .await
                .with_context(|| format!("connect {url}"))?;
            sockets.push((room, client, ws));
        }
    }
    let connect_time = connect_started.elapsed();
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
        .map(|_| Arc::new(Mutex::new(HashMap::new())))
        .collect();
    let stop_at = start + args.duration + Duration::from_secs(2);
    let server_cpu_start = args.server_pid.and_then(process_cpu_seconds);
    let mut tasks = Vec::with_capacity(total);
    for (i, (room, client, ws)) in sockets.into_iter().enumerate() {
        let shared = shared.clone();
        let times = room_maps[room].clone();
        let args = args.clone();
        let client_id = 1_000_000 + i as u64;
        tasks.push(tokio::spawn(async move {
            if let Err(e) =
                run_client(ws, client_id, client, args, times, shared.clone(), stop_at).await
            {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("client {client_id}: {e}");
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let server_cpu = match (
        args.server_pid.and_then(process_cpu_seconds),
        server_cpu_start,
    ) {
        (Some(end), Some(start)) => Some(end - start),
        _ => None,
    };
    let own_cpu = own_cpu_seconds() - cpu_start;
    report(&args, &shared, connect_time, own_cpu, server_cpu);
    Ok(())
}

async fn run_client(
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    client_id: u64,
    index: usize,
    args: TypingArgs,
    times: Arc<SendTimes>,
    shared: Arc<Shared>,
    stop_at: Instant,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let doc = Doc::with_client_id(client_id);
    let text = doc.get_or_insert_text("text");
    sink.send(WsMessage::Binary(protocol::encode_step1(
        &Default::default(),
    )))
    .await?;
    let period = Duration::from_secs_f64(1.0 / args.rate);
    // Spread the clients' phases over one period.
    let phase = period.mul_f64((index as f64 * 0.618_034) % 1.0);
    let mut tick = tokio::time::interval_at((Instant::now() + phase).into(), period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let receivers = (args.clients - 1) as u64;
    let mut pending_acks: HashMap<u64, Instant> = HashMap::new();
    let mut ack_seq = 0u64;
    let mut n = 0u32;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= stop_at - Duration::from_secs(2) {
                    if now >= stop_at { break; }
                    continue;
                }
                let update = {
                    let mut txn = doc.transact_mut();
                    text.insert(&mut txn, 0, "x");
                    txn.encode_update_v1()
                };
                // Keyed by the insert's start clock, which receivers read back from the update.
                if receivers > 0 {
                    times.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.insert((client_id, n), now);
                }
                n += 1;
                sink.send(WsMessage::Binary(protocol::encode_update(&update))).await?;
                if shared.measuring(now) {
                    shared.sent.fetch_add(1, Ordering::Relaxed);
                }
                if args.ack {
                    ack_seq += 1;
                    pending_acks.insert(ack_seq, now);
                    sink.send(WsMessage::Binary(protocol::encode_durable_ack(ack_seq))).await?;
                }
            }
            frame = stream.next() => {
                let Some(frame) = frame else { anyhow::bail!("server closed the connection") };
                let data: Bytes = match frame? {
                    WsMessage::Binary(b) => b,
                    WsMessage::Close(f) => anyhow::bail!("closed by server: {f:?}"),
                    _ => continue,
                };
                let now = Instant::now();
                for msg in protocol::decode_frame(&data).map_err(|e| anyhow::anyhow!("{e}"))? {
                    match msg {
                        Message::SyncStep1(_) => {
                            // Answer with what we have (only our own edits).
                            let diff = doc.transact().encode_diff_v1(&Default::default());
                            sink.send(WsMessage::Binary(protocol::encode_step2(&diff))).await?;
                        }
                        Message::Update(u) => record_delivery(&u, &times, &shared, now),
                        Message::DurableAck { raw } => {
                            let mut cur = yrs::encoding::read::Cursor::new(&raw[2..]);
                            let seq: u64 = yrs::encoding::read::Read::read_var(&mut cur).unwrap_or(0);
                            if let Some(sent) = pending_acks.remove(&seq) {
                                if shared.measuring(sent) {
                                    shared.acks.fetch_add(1, Ordering::Relaxed);
                                    if let Ok(mut h) = shared.ack_latency.lock() {
                                        let _ = h.record(now.duration_since(sent).as_micros() as u64);
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    let _ = sink.close().await;
    Ok(())
}

/// Looks the update up by its (client, start clock) and records the latency for this receiver.
fn record_delivery(update: &[u8], times: &SendTimes, shared: &Shared, now: Instant) {
    let Ok(u) = Update::decode_v1(update) else {
        return;
    };
    let sv = u.state_vector_lower();
    let Ok(mut map) = times.lock() else { return };
    for (client, clock) in sv.iter() {
        let key = (client.get(), *clock);
        if let Some(sent) = map.get(&key).copied() {
            if shared.measuring(sent) {
                shared.delivered.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut h) = shared.latency.lock() {
                    let _ = h.record(now.duration_since(sent).as_micros().max(1) as u64);
                }
            }
            // Entries are small; drop those older than a minute to bound memory.
            if now.duration_since(sent) > Duration::from_secs(60) {
                map.remove(&key);
            }
        }
    }
}

fn report(args: &TypingArgs, s: &Shared, connect: Duration, own_cpu: f64, server_cpu: Option<f64>) {
    let sent = s.sent.load(Ordering::Relaxed);
    let expected = sent * (args.clients as u64 - 1);
    let delivered = s.delivered.load(Ordering::Relaxed);
    let secs = args.duration.as_secs_f64();
    let lat = s
        .latency
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| histogram());
    let ack = s
        .ack_latency
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| histogram());
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "{} typing: {} rooms x {} clients at {}/s for {:?}",
        args.label, args.rooms, args.clients, args.rate, args.duration
    );
    println!(
        "  connected {} clients in {:.2?}",
        args.rooms * args.clients,
        connect
    );
    println!(
        "  updates sent {sent} ({:.0}/s), deliveries {delivered}/{expected} ({:.0}/s), errors {}",
        sent as f64 / secs,
        delivered as f64 / secs,
        s.errors.load(Ordering::Relaxed)
    );
    println!(
        "  delivery latency ms: p50 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
        ms(lat.value_at_quantile(0.5)),
        ms(lat.value_at_quantile(0.99)),
        ms(lat.value_at_quantile(0.999)),
        ms(lat.max())
    );
    if args.ack {
        println!(
            "  durable ack ms ({} acks): p50 {:.2}  p99 {:.2}  max {:.2}",
            s.acks.load(Ordering::Relaxed),
            ms(ack.value_at_quantile(0.5)),
            ms(ack.value_at_quantile(0.99)),
            ms(ack.max())
        );
    }
    println!(
        "  load generator CPU: {own_cpu:.2} s ({:.0}% of one core)",
        100.0 * own_cpu / (secs + args.warmup.as_secs_f64() + 2.0)
    );
    if let Some(cpu) = server_cpu {
        println!(
            "  server CPU: {cpu:.2} s, {:.3} s per 1,000 updates",
            cpu / (sent.max(1) as f64 / 1000.0)
        );
    }
    let json = serde_json::json!({
        "label": args.label, "rooms": args.rooms, "clients": args.clients, "rate": args.rate,
        "sent": sent, "delivered": delivered, "expected": expected,
        "p50_ms": ms(lat.value_at_quantile(0.5)), "p99_ms": ms(lat.value_at_quantile(0.99)),
        "max_ms": ms(lat.max()),
        "ack_p50_ms": args.ack.then(|| ms(ack.value_at_quantile(0.5))),
        "ack_p99_ms": args.ack.then(|| ms(ack.value_at_quantile(0.99))),
        "bench_cpu_s": own_cpu, "server_cpu_s": server_cpu,
    });
    println!("{json}");
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
