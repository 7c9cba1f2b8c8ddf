//! `presence`: N clients in one document, each changing its awareness state (a cursor move) at
//! a fixed rate. A sample of the clients (`--measurers`) decodes every awareness message it
//! receives and records, per other client's change, the time from its send to its arrival;
//! the others read and drop what they receive, so the generator's cost stays linear in N.
//! Server CPU is read at the start and the end of the measured window and divided by the
//! changes sent in it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use quire_protocol::{self as protocol, hocuspocus, Message};
use tokio_tungstenite::tungstenite::Message as WsMessage;
use yrs::sync::awareness::AwarenessUpdateEntry;
use yrs::sync::AwarenessUpdate;
use yrs::ClientID;

use crate::wire::{self, Flavor};
use crate::{histogram, ms, Common};

#[derive(clap::Args, Clone)]
pub struct PresenceArgs {
    #[command(flatten)]
    common: Common,
    /// Clients in the document, each changing its state at `--rate`
    #[arg(long, default_value_t = 300)]
    clients: usize,
    /// Awareness changes per second per client
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time after every client is connected, before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Clients that decode what they receive and record delivery latency
    #[arg(long, default_value_t = 20)]
    measurers: usize,
}

/// Send times of changes, keyed by (client id, clock).
type SendTimes = RwLock<HashMap<(u64, u32), Instant>>;

struct Shared {
    from: Instant,
    until: Instant,
    sent: AtomicU64,
    /// Deliveries the measurers should see: per change sent in the window, every measurer
    /// but its sender.
    expected: AtomicU64,
    delivered: AtomicU64,
    frames: AtomicU64,
    latency: Mutex<hdrhistogram::Histogram<u64>>,
    errors: AtomicU64,
}

impl Shared {
    fn measuring(&self, t: Instant) -> bool {
        t >= self.from && t < self.until
    }
}

const CLIENT_BASE: u64 = 3_000_000;

pub async fn presence(args: PresenceArgs) -> anyhow::Result<()> {
    let c = &args.common;
    let doc = format!("{}-presence", c.prefix);
    let measurers = args.measurers.min(args.clients);
    let connect_started = Instant::now();
    let mut sockets = Vec::with_capacity(args.clients);
    for i in 0..args.clients {
        let mut ws = wire::connect(&c.url, &doc, c.flavor)
            .await
            .with_context(|| format!("connect client {i}"))?;
        wire::wait_synced(&mut ws, c.flavor, &doc, &[0, 0])
            .await
            .with_context(|| format!("sync client {i}"))?;
        sockets.push(ws);
    }
    let connect = connect_started.elapsed();
    let from = Instant::now() + args.warmup;
    let until = from + args.duration;
    let stop_at = until + Duration::from_secs(2);
    let shared = Arc::new(Shared {
        from,
        until,
        sent: AtomicU64::new(0),
        expected: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        frames: AtomicU64::new(0),
        latency: Mutex::new(histogram()),
        errors: AtomicU64::new(0),
    });
    let times: Arc<SendTimes> = Arc::new(RwLock::new(HashMap::new()));
    let bench_cpu0 = crate::own_cpu_seconds();
    // The server's CPU over the measured window only.
    let pid = c.server_pid;
    let server_cpu = tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let start = pid.and_then(crate::process_cpu_seconds);
        tokio::time::sleep_until(until.into()).await;
        let end = pid.and_then(crate::process_cpu_seconds);
        let rss = pid.and_then(crate::process_rss_kib);
        (start.zip(end).map(|(a, b)| b - a), rss)
    });
    let mut tasks = Vec::with_capacity(sockets.len());
    for (i, ws) in sockets.into_iter().enumerate() {
        let plan = Plan {
            index: i,
            client: CLIENT_BASE + i as u64,
            measures: i < measurers,
            measurers: measurers as u64,
            rate: args.rate,
            flavor: c.flavor,
            doc: doc.clone(),
            stop_at,
        };
        let (shared, times) = (shared.clone(), times.clone());
        tasks.push(tokio::spawn(async move {
            if let Err(e) = run_client(ws, &plan, &times, &shared).await {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                eprintln!("client {}: {e:#}", plan.index);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let (server_cpu, rss) = server_cpu.await?;
    let sent = shared.sent.load(Ordering::Relaxed);
    let expected = shared.expected.load(Ordering::Relaxed);
    let delivered = shared.delivered.load(Ordering::Relaxed);
    let frames = shared.frames.load(Ordering::Relaxed);
    let errors = shared.errors.load(Ordering::Relaxed);
    let lat = shared
        .latency
        .lock()
        .map(|h| h.clone())
        .unwrap_or_else(|_| histogram());
    let secs = args.duration.as_secs_f64();
    let per_change_us = server_cpu.map(|cpu| cpu * 1e6 / sent.max(1) as f64);
    println!(
        "{} presence: {} clients at {}/s for {secs:.0}s (connected in {connect:.2?})",
        c.label, args.clients, args.rate
    );
    println!(
        "  changes sent {sent} ({:.0}/s); {measurers} measurers: deliveries {delivered}/{expected}, \
         {:.1} awareness messages/s each, errors {errors}",
        sent as f64 / secs,
        frames as f64 / secs / measurers.max(1) as f64
    );
    println!(
        "  delivery latency ms: p50 {:.2}  p99 {:.2}  max {:.2}",
        ms(lat.value_at_quantile(0.5)),
        ms(lat.value_at_quantile(0.99)),
        ms(lat.max())
    );
    if let Some(us) = per_change_us {
        println!(
            "  server CPU {:.2} s in the window, {us:.0} µs per change; RSS {} KiB",
            server_cpu.unwrap_or(0.0),
            rss.unwrap_or(0)
        );
    }
    let json = serde_json::json!({
        "scenario": "presence", "label": c.label, "clients": args.clients, "rate": args.rate,
        "secs": secs, "sent": sent, "expected": expected, "delivered": delivered,
        "complete": expected > 0 && delivered >= expected && errors == 0, "errors": errors,
        "messages_per_s_per_client": frames as f64 / secs / measurers.max(1) as f64,
        "p50_ms": ms(lat.value_at_quantile(0.5)), "p99_ms": ms(lat.value_at_quantile(0.99)),
        "max_ms": ms(lat.max()), "server_cpu_s": server_cpu,
        "server_us_per_change": per_change_us, "server_rss_kib": rss,
        "bench_cpu_s": crate::own_cpu_seconds() - bench_cpu0,
        "connect_s": connect.as_secs_f64(),
    });
    println!("{json}");
    Ok(())
}

struct Plan {
    index: usize,
    client: u64,
    measures: bool,
    measurers: u64,
    rate: f64,
    flavor: Flavor,
    doc: String,
    stop_at: Instant,
}

/// A cursor move as a y-protocols awareness message: the state a CodeMirror or ProseMirror
/// binding sets (a user and a cursor), at clock `clock`.
fn cursor_move(client: u64, clock: u32, index: usize) -> Bytes {
    let json = format!(
        r##"{{"user":{{"name":"client {index}","color":"#30bced","colorLight":"#30bced33"}},"cursor":{{"anchor":{{"type":null,"tname":"text","item":{{"client":{client},"clock":{clock}}},"assoc":0}},"head":{{"type":null,"tname":"text","item":{{"client":{client},"clock":{clock}}},"assoc":0}}}}}}"##
    );
    let update = AwarenessUpdate {
        clients: HashMap::from([(
            ClientID::new(client),
            AwarenessUpdateEntry {
                clock,
                json: Arc::from(json),
            },
        )]),
    };
    protocol::encode_awareness(&update)
}

/// The (client, clock) of every awareness entry in a server frame.
fn awareness_ids(flavor: Flavor, frame: &Bytes) -> Vec<(u64, u32)> {
    let msgs = match flavor {
        Flavor::YWebsocket => protocol::decode_frame(frame),
        Flavor::Hocuspocus => match hocuspocus::unwrap(frame) {
            Some((_doc, rest)) => protocol::decode_frame(&rest),
            None => return Vec::new(),
        },
    };
    let mut ids = Vec::new();
    for m in msgs.unwrap_or_default() {
        if let Message::Awareness { update, .. } = m {
            ids.extend(update.clients.iter().map(|(c, e)| (c.get(), e.clock)));
        }
    }
    ids
}

async fn run_client(
    ws: wire::Ws,
    plan: &Plan,
    times: &SendTimes,
    shared: &Shared,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let period = Duration::from_secs_f64(1.0 / plan.rate);
    let phase = period.mul_f64((plan.index as f64 * 0.618_034) % 1.0);
    let mut tick = tokio::time::interval_at((Instant::now() + phase).into(), period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let send_until = plan.stop_at - Duration::from_secs(2);
    let stop = tokio::time::sleep_until(plan.stop_at.into());
    tokio::pin!(stop);
    let mut clock = 0u32;
    let mut latencies = Vec::new();
    let mut delivered = 0u64;
    let mut frames = 0u64;
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => {
                let now = Instant::now();
                if now >= send_until { continue; }
                clock += 1;
                if shared.measuring(now) {
                    times.write().map_err(|_| anyhow::anyhow!("poisoned"))?.insert((plan.client, clock), now);
                    shared.sent.fetch_add(1, Ordering::Relaxed);
                    let others = plan.measurers - u64::from(plan.measures);
                    shared.expected.fetch_add(others, Ordering::Relaxed);
                }
                let frame = wire::wrap(plan.flavor, &plan.doc, cursor_move(plan.client, clock, plan.index));
                sink.send(WsMessage::Binary(frame)).await?;
            }
            frame = stream.next() => {
                let Some(frame) = frame else { anyhow::bail!("server closed the connection") };
                let data = match frame? {
                    WsMessage::Binary(b) => b,
                    WsMessage::Close(f) => anyhow::bail!("closed by server: {f:?}"),
                    _ => continue,
                };
                if !plan.measures {
                    continue;
                }
                let now = Instant::now();
                let ids = awareness_ids(plan.flavor, &data);
                if ids.is_empty() {
                    continue;
                }
                frames += 1;
                let Ok(map) = times.read() else { continue };
                for id in ids {
                    if id.0 == plan.client {
                        continue;
                    }
                    if let Some(sent) = map.get(&id) {
                        delivered += 1;
                        latencies.push(now.duration_since(*sent).as_micros().max(1) as u64);
                    }
                }
            }
        }
    }
    shared.delivered.fetch_add(delivered, Ordering::Relaxed);
    shared.frames.fetch_add(frames, Ordering::Relaxed);
    if let Ok(mut h) = shared.latency.lock() {
        for us in latencies {
            let _ = h.record(us);
        }
    }
    let _ = sink.close().await;
    Ok(())
}
