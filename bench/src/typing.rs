//! `typing` and `search`: rooms of clients typing at a fixed rate, delivery latency between
//! them; and the highest rate whose p99 stays under a bound.

use super::*;

#[derive(clap::Args, Clone)]
pub(crate) struct TypingArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    #[arg(long, default_value_t = 200)]
    pub(crate) rooms: usize,
    #[arg(long, default_value_t = 4)]
    pub(crate) clients: usize,
    /// Clients per room that type (the others only read); default all
    #[arg(long)]
    pub(crate) writers: Option<usize>,
    /// Updates per second per typing client
    #[arg(long, default_value_t = 5.0)]
    pub(crate) rate: f64,
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Unmeasured time after connecting, before measuring
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) warmup: Duration,
    /// Also request a durable acknowledgement (tag 102) after each update (Quire only)
    #[arg(long)]
    pub(crate) ack: bool,
    /// Soak: every this long, append a sample of the server's RSS and open file descriptors
    /// (needs --server-pid) and the updates sent and delivered so far to --samples
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) sample_every: Option<Duration>,
    /// File the soak samples go to, one JSON object per line
    #[arg(long, default_value = "soak.jsonl")]
    pub(crate) samples: std::path::PathBuf,
    /// Large documents: first upload a seeded document of this many MiB (encoded) into every
    /// room, so the clients type into it
    #[arg(long)]
    pub(crate) seed_mb: Option<f64>,
    /// With several URLs (`--url a,b,c`): every client of a document connects to the same
    /// node, chosen by the document (as a load balancer hashing the path would), instead of
    /// spreading a document's clients over the nodes
    #[arg(long)]
    pub(crate) by_document: bool,
    /// Documents per socket (Hocuspocus only; --rooms a multiple of it): rooms in groups of K,
    /// one socket per group and client index carrying that client of each room of the group.
    /// With several URLs, every room is first opened on the node meant to own it: its group's
    /// (--by-document), or room r on URL r mod n, so a socket's rooms have different owners
    #[arg(long, default_value_t = 1)]
    pub(crate) docs_per_socket: usize,
}

#[derive(clap::Args, Clone)]
pub(crate) struct SearchArgs {
    #[command(flatten)]
    pub(crate) typing: TypingArgs,
    /// p99 delivery latency bound, milliseconds
    #[arg(long, default_value_t = 50.0)]
    p99_ms: f64,
    /// Rate multiplier between steps
    #[arg(long, default_value_t = 1.5)]
    pub(crate) step: f64,
    /// Most steps
    #[arg(long, default_value_t = 12)]
    pub(crate) steps: usize,
    /// After the first failing step, this many bisections (geometric) between the last
    /// passing rate and the failing one, so the result is not quantised by `--step`
    #[arg(long, default_value_t = 3)]
    pub(crate) refine: usize,
}

/// Send times of updates, keyed by (client id, start clock of the insert). Read by every
/// receiver of a room at once, written by its typists.
pub(crate) type SendTimes = RwLock<HashMap<(u64, u32), Instant>>;

/// Latencies a client measured and has not yet added to the shared histogram: one client's
/// receptions do not contend on the shared lock with the room's other receivers (200 of them
/// receiving the same update at the same moment in the fan-out scenario).
pub(crate) struct Measured {
    pub(crate) shared: Arc<Shared>,
    pub(crate) delivered: u64,
    pub(crate) latencies: Vec<u64>,
}

/// Latencies kept locally before a client takes the shared lock.
pub(crate) const MEASURED_BATCH: usize = 256;

impl Measured {
    pub(crate) fn new(shared: Arc<Shared>) -> Measured {
        Measured {
            shared,
            delivered: 0,
            latencies: Vec::with_capacity(MEASURED_BATCH),
        }
    }

    pub(crate) fn record(&mut self, latency: Duration) {
        self.delivered += 1;
        self.latencies.push(latency.as_micros().max(1) as u64);
        if self.latencies.len() >= MEASURED_BATCH {
            self.flush();
        }
    }

    pub(crate) fn flush(&mut self) {
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

pub(crate) struct Shared {
    pub(crate) measuring_from: Instant,
    pub(crate) measuring_until: Instant,
    pub(crate) sent: AtomicU64,
    pub(crate) delivered: AtomicU64,
    pub(crate) latency: Mutex<Histogram<u64>>,
    pub(crate) ack_latency: Mutex<Histogram<u64>>,
    pub(crate) acks: AtomicU64,
    pub(crate) errors: AtomicU64,
}

impl Shared {
    pub(crate) fn measuring(&self, t: Instant) -> bool {
        t >= self.measuring_from && t < self.measuring_until
    }
}

pub(crate) struct TypingResult {
    pub(crate) label: String,
    pub(crate) rooms: usize,
    pub(crate) clients: usize,
    pub(crate) writers: usize,
    pub(crate) docs_per_socket: usize,
    pub(crate) rate: f64,
    pub(crate) secs: f64,
    pub(crate) sent: u64,
    pub(crate) delivered: u64,
    pub(crate) expected: u64,
    pub(crate) errors: u64,
    pub(crate) connect: Duration,
    pub(crate) lat: Histogram<u64>,
    pub(crate) ack: Option<(u64, Histogram<u64>)>,
    pub(crate) bench_cpu: f64,
    pub(crate) server_cpu: Option<f64>,
    pub(crate) server_rss_kib: Option<u64>,
}

impl TypingResult {
    pub(crate) fn p99(&self) -> f64 {
        ms(self.lat.value_at_quantile(0.99))
    }

    pub(crate) fn complete(&self) -> bool {
        self.expected > 0 && self.delivered >= self.expected && self.errors == 0
    }

    pub(crate) fn print(&self) {
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

pub(crate) async fn typing(args: &TypingArgs) -> anyhow::Result<TypingResult> {
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
pub(crate) async fn connect_clients(
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

pub(crate) struct ClientPlan {
    pub(crate) client_id: u64,
    pub(crate) index: usize,
    pub(crate) writes: bool,
    pub(crate) rate: f64,
    pub(crate) ack: bool,
    pub(crate) flavor: Flavor,
    pub(crate) doc: String,
    pub(crate) stop_at: Instant,
}

pub(crate) async fn run_client(
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

pub(crate) async fn search(args: SearchArgs) -> anyhow::Result<()> {
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
pub(crate) async fn search_step(
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
