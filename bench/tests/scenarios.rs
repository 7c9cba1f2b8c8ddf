//! Every quire-bench scenario, run for real (small and short) against an in-process Quire on
//! loopback: each must finish by itself and print a result line whose figures make sense, and
//! bench/report.py must turn the lines into its table and plot.

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

async fn start(dir: &Path, addr: &str) -> Server {
    let mut config = quire_server::config::Settings::default().resolve();
    config.database_url = format!("sqlite://{}", dir.join("quire.db").display()).into();
    let listener = TcpListener::bind(addr).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(quire_server::run(listener, config, shutdown.clone()));
    Server {
        addr,
        shutdown,
        task,
    }
}

impl Server {
    async fn stop(self) {
        self.shutdown.cancel();
        let stopped = tokio::time::timeout(std::time::Duration::from_secs(30), self.task).await;
        assert!(
            matches!(stopped, Ok(Ok(Ok(())))),
            "server stops cleanly: {stopped:?}"
        );
    }
}

/// Runs quire-bench with the arguments of `command_line` (split at spaces; on a blocking
/// thread: the server runs on this test's runtime) and returns its JSON result lines.
async fn bench(addr: SocketAddr, command_line: &str) -> Vec<Value> {
    bench_at(&format!("ws://{addr}"), command_line).await
}

/// [`bench`] against the server at `url`.
async fn bench_at(url: &str, command_line: &str) -> Vec<Value> {
    let args: Vec<String> = command_line.split_whitespace().map(str::to_owned).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire-bench"));
    cmd.args(&args).args([
        "--url",
        url,
        "--server-pid",
        &std::process::id().to_string(),
        "--label",
        "quire",
    ]);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .expect("join")
        .expect("run quire-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "quire-bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("result line is JSON"))
        .collect()
}

fn one<'a>(lines: &'a [Value], scenario: &str) -> &'a Value {
    let found: Vec<&Value> = lines.iter().filter(|l| l["scenario"] == scenario).collect();
    assert_eq!(found.len(), 1, "one {scenario} line in {lines:?}");
    found[0]
}

/// A small editing trace in the real trace's format: edits [position, deleted, inserted].
fn write_trace(dir: &Path) -> std::path::PathBuf {
    let edits = serde_json::json!([
        [0, 0, "h"],
        [1, 0, "e"],
        [2, 0, "l"],
        [3, 0, "l"],
        [4, 0, "o"],
        [5, 0, " "],
        [6, 0, "w"],
        [7, 0, "o"],
        [8, 0, "r"],
        [9, 0, "d"],
        [9, 1, ""],
        [9, 0, "l"],
        [10, 0, "d"],
        [0, 1, ""],
        [0, 0, "H"]
    ]);
    let trace = serde_json::json!({ "edits": edits, "finalText": "Hello world" });
    let path = dir.join("trace.json.gz");
    let file = std::fs::File::create(&path).expect("create trace");
    let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
    gz.write_all(trace.to_string().as_bytes())
        .expect("write trace");
    gz.finish().expect("finish trace");
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_runs_against_quire_and_reports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), "127.0.0.1:0").await;
    let mut all = Vec::new();

    let typing = bench(
        server.addr,
        "typing --rooms 2 --clients 3 --rate 10 --duration 2s --warmup 0s --prefix typing",
    )
    .await;
    let t = one(&typing, "typing");
    assert_eq!(t["complete"], true, "{t}");
    assert!(t["sent"].as_u64().unwrap_or(0) > 0, "{t}");
    assert_eq!(t["delivered"], t["expected"], "{t}");
    assert!(t["p99_ms"].as_f64().is_some_and(|p| p > 0.0), "{t}");
    assert!(
        t["bench_cpu_s"].as_f64().is_some(),
        "its own CPU beside the result: {t}"
    );
    assert!(
        t["server_cpu_per_1k"].as_f64().is_some_and(|c| c > 0.0),
        "the server's CPU per 1,000 updates: {t}"
    );
    all.extend(typing);

    let acked = bench(
        server.addr,
        "typing --rooms 1 --clients 2 --rate 10 --duration 1s --warmup 0s --ack --prefix acked",
    )
    .await;
    let a = one(&acked, "typing");
    assert!(a["ack_p99_ms"].as_f64().is_some_and(|p| p > 0.0), "{a}");
    all.extend(acked);

    let fan = bench(
        server.addr,
        "typing --rooms 1 --clients 5 --writers 1 --rate 10 --duration 2s --warmup 0s --prefix fan",
    )
    .await;
    let f = one(&fan, "typing");
    assert_eq!(f["complete"], true, "{f}");
    assert_eq!(
        f["delivered"].as_u64(),
        f["sent"].as_u64().map(|s| s * 4),
        "every send reaches the four readers: {f}"
    );
    all.extend(fan);

    // One Hocuspocus socket per client index carrying that client of two rooms: every
    // client's sends reach the other clients of its room.
    let mux = bench_at(
        &format!("ws://{}/hocuspocus", server.addr),
        "typing --rooms 4 --clients 3 --rate 10 --duration 2s --warmup 0s --flavor hocuspocus \
         --docs-per-socket 2 --prefix mux",
    )
    .await;
    let m = one(&mux, "typing");
    assert_eq!(m["docs_per_socket"], 2, "{m}");
    assert_eq!(m["complete"], true, "{m}");
    assert!(m["sent"].as_u64().unwrap_or(0) > 0, "{m}");
    assert_eq!(m["delivered"], m["expected"], "{m}");
    assert_eq!(m["errors"], 0, "{m}");

    // A latency bound no working run misses: this test checks the search's mechanics, not the
    // machine's speed.
    let search = bench(
        server.addr,
        "search --rooms 2 --clients 2 --rate 5 --step 2 --steps 2 --refine 0 --duration 1s \
         --warmup 0s --prefix search --p99-ms 60000",
    )
    .await;
    assert!(search.iter().any(|l| l["scenario"] == "search-step"));
    let s = one(&search, "search");
    assert!(
        s["best_rate_per_s"].as_f64().is_some_and(|r| r > 0.0),
        "{search:?}"
    );
    all.extend(search);

    let idle = bench(
        server.addr,
        "idle --conns 40 --rooms 4 --settle 0s --prefix idle",
    )
    .await;
    let i = one(&idle, "idle");
    assert_eq!(i["conns"], 40, "{i}");
    assert!(i["connect_s"].as_f64().is_some_and(|t| t > 0.0), "{i}");
    assert!(i["kib_per_conn"].as_f64().is_some(), "{i}");
    all.extend(idle);

    let storm = bench(server.addr, "storm --clients 6 --doc-mb 0.3 --prefix storm").await;
    let st = one(&storm, "storm");
    assert_eq!(st["text_ok"], true, "{st}");
    assert_eq!(st["short_syncs"], 0, "{st}");
    assert!(st["p99_ms"].as_f64().is_some_and(|p| p > 0.0), "{st}");
    assert!(st["peak_rss_kib"].as_u64().is_some(), "{st}");
    all.extend(storm);

    // Presence: every measurer hears every other client's change.
    let presence = bench(
        server.addr,
        "presence --clients 6 --measurers 3 --duration 2s --warmup 0s --rate 5 --prefix presence",
    )
    .await;
    let p = one(&presence, "presence");
    assert_eq!(p["complete"], true, "{p}");
    assert!(p["sent"].as_u64().unwrap_or(0) > 0, "{p}");
    assert_eq!(p["delivered"], p["expected"], "{p}");
    assert!(p["server_us_per_change"].as_f64().is_some(), "{p}");
    all.extend(presence);

    // A large document's memory at its three moments, and its reads.
    let memory = bench(
        server.addr,
        "memory --clients 4 --doc-mb 0.3 --typing 5 --settle 0s --prefix memory",
    )
    .await;
    let m = one(&memory, "memory");
    for field in ["rss_loaded_mb", "rss_after_storm_mb", "rss_after_typing_mb"] {
        assert!(m[field].as_f64().is_some_and(|r| r > 0.0), "{field}: {m}");
    }
    all.extend(memory);
    // A document of many items (the trace replayed by clients of their own), its state saved
    // for the floor to load.
    let items_dir = tempfile::tempdir().expect("tempdir");
    let small_trace = write_trace(items_dir.path());
    let items = bench(
        server.addr,
        &format!(
            "memory --trace-replays 6 --keep-every 3 --trace {} --items-cache {} --save-state {} \
             --clients 2 --typing 2 --settle 0s --prefix items",
            small_trace.display(),
            items_dir.path().display(),
            items_dir.path().join("items.v1").display()
        ),
    )
    .await;
    let it = one(&items, "memory");
    assert!(it["items"].as_u64().is_some_and(|n| n >= 6 * 2), "{it}");
    assert!(it["yrs_load_ms"].as_f64().is_some(), "{it}");
    let saved = std::fs::read(items_dir.path().join("items.v1")).expect("the saved state");
    assert_eq!(it["doc_bytes"].as_u64(), Some(saved.len() as u64), "{it}");
    // The snapshot's floor (bench/snapshot_rounds.sh): the saved state decoded and encoded
    // again, to the same bytes' length.
    let state = items_dir.path().join("items.v1");
    let out = Command::new(env!("CARGO_BIN_EXE_quire-bench"))
        .args(["roundtrip", "--state"])
        .arg(&state)
        .output()
        .expect("run quire-bench roundtrip");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rt: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(rt["encoded"].as_u64(), Some(saved.len() as u64), "{rt}");
    assert!(
        rt["snapshot_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{rt}"
    );
    let reads = bench(server.addr, "reads --doc-mb 0.3 --repeat 2 --prefix reads").await;
    for kind in ["now", "version", "position"] {
        let r = reads
            .iter()
            .find(|l| l["read"] == kind)
            .unwrap_or_else(|| panic!("a {kind} read in {reads:?}"));
        assert!(r["body_bytes"].as_u64().is_some_and(|b| b > 300_000), "{r}");
        assert!(r["repeat_cpu_ms_per_read"].as_f64().is_some(), "{r}");
    }
    all.extend(reads);
    // Edits beside an empty document, an agent's clients, readers that never read.
    let capacity = bench(
        server.addr,
        "capacity --doc-mb 0.3 --edits 5 --agent-edits 20 --stuck 0,2 --probes 2 \
         --prefix capacity",
    )
    .await;
    let part = |p: &'static str| capacity.iter().filter(move |l| l["part"] == p);
    assert_eq!(part("edit").count(), 4, "{capacity:?}");
    assert_eq!(part("yrs-alone").count(), 3, "{capacity:?}");
    let clients = part("clients").next().expect("the clients line");
    assert_eq!(
        clients["clients_after"].as_u64(),
        clients["clients_before"].as_u64().map(|n| n + 1),
        "one client for the caller's edits: {clients}"
    );
    for stuck in part("stuck") {
        assert_eq!(stuck["refused"], 0, "{stuck}");
    }
    all.extend(capacity);

    // Typing into a seeded document: every send is delivered (the seeded document's client
    // ids are apart from the typing clients').
    let large = bench(
        server.addr,
        "typing --rooms 1 --clients 3 --rate 10 --duration 1s --warmup 0s --seed-mb 0.3 \
         --prefix large",
    )
    .await;
    let l = one(&large, "typing");
    assert_eq!(l["complete"], true, "{l}");
    all.extend(large);

    let trace = write_trace(dir.path());
    let trace = trace.to_str().expect("utf-8 path");
    assert!(
        !trace.contains(char::is_whitespace),
        "bench() splits at spaces: {trace}"
    );
    let ingest = bench(
        server.addr,
        &format!("coldload --trace {trace} --prefix cold"),
    )
    .await;
    let c = one(&ingest, "coldload-ingest");
    assert_eq!(c["edits"], 15, "{c}");
    assert!(c["updates_per_s"].as_f64().is_some_and(|r| r > 0.0), "{c}");
    all.extend(ingest);

    // Restart on the same database: a new client's text must be the trace's final text.
    let addr = server.addr.to_string();
    server.stop().await;
    let server = start(dir.path(), &addr).await;
    let verify = bench(
        server.addr,
        &format!("coldload --verify --trace {trace} --prefix cold"),
    )
    .await;
    let v = one(&verify, "coldload-verify");
    assert_eq!(v["text_ok"], true, "{v}");
    assert_eq!(v["chars"], 11, "{v}");
    all.extend(verify);
    server.stop().await;

    // The report turns the lines into its table and plot.
    let results = dir.path().join("results.jsonl");
    let lines: Vec<String> = all.iter().map(Value::to_string).collect();
    std::fs::write(&results, lines.join("\n") + "\n").expect("write results");
    let svg = dir.path().join("plot.svg");
    let report = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/report.py"))
        .arg(&results)
        .arg(&svg)
        .output()
        .expect("python3 runs bench/report.py");
    assert!(
        report.status.success(),
        "report.py failed: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    let table = String::from_utf8_lossy(&report.stdout);
    assert!(table.contains("editing-trace ingest"), "{table}");
    assert!(table.contains("join storm p99 ms"), "{table}");
    assert!(
        table.contains("presence: µs of server CPU per change"),
        "{table}"
    );
    assert!(table.contains("large document RSS"), "{table}");
    assert!(table.contains("content reads"), "{table}");
    let presence_plot =
        std::fs::read_to_string(dir.path().join("bench-presence.svg")).expect("presence plot");
    assert!(presence_plot.contains("<polyline"), "{presence_plot}");
    let plot = std::fs::read_to_string(&svg).expect("plot written");
    assert!(plot.contains("<svg"), "an SVG plot");
}

/// The floor server relays like a y-websocket server: every send delivered, and a join storm
/// gets the whole document.
#[tokio::test]
async fn the_floor_relays_and_answers_a_join_storm() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut floor = tokio::process::Command::new(env!("CARGO_BIN_EXE_quire-floor"))
        .arg(port.to_string())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn quire-floor");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(port).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let typing = bench(
        port,
        "typing --rooms 2 --clients 3 --rate 10 --duration 1s --warmup 0s --prefix typing",
    )
    .await;
    let t = one(&typing, "typing");
    assert_eq!(t["complete"], true, "{t}");
    assert_eq!(t["delivered"], t["expected"], "{t}");
    let storm = bench(port, "storm --clients 6 --doc-mb 0.3 --prefix storm").await;
    let st = one(&storm, "storm");
    assert_eq!(st["text_ok"], true, "{st}");
    assert_eq!(st["short_syncs"], 0, "{st}");
    let presence = bench(
        port,
        "presence --clients 6 --measurers 3 --duration 1s --warmup 0s --rate 5 --prefix presence",
    )
    .await;
    let p = one(&presence, "presence");
    assert_eq!(p["delivered"], p["expected"], "{p}");
    let _ = floor.kill().await;
}

/// Waits until something listens on `addr` (at most 10 s).
async fn wait_listening(addr: SocketAddr, what: &str) {
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{what} did not start listening on {addr}");
}

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
}

/// The floor of relaying: three floor processes sharing documents through a private NATS
/// server, each document's five clients spread over the three (two on the owner, two on the
/// next node, one on the last: an update of one of the two relayed together reaches the
/// other through the owner); every send reaches every other client of its document (a node
/// that served its clients a room of its own instead of relaying them to the owner would
/// deliver a fraction of that).
#[tokio::test]
async fn floor_nodes_relay_a_documents_clients_through_nats() {
    let nats_addr = free_port();
    let mut nats = tokio::process::Command::new("nats-server")
        .args(["-a", "127.0.0.1", "-p", &nats_addr.port().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nats-server is installed (Debian package nats-server)");
    wait_listening(nats_addr, "nats-server").await;
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    for i in 1..=3 {
        let addr = free_port();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_quire-floor"));
        cmd.arg(addr.to_string())
            .env("QUIRE_FLOOR_NATS", format!("nats://{nats_addr}"))
            .env("QUIRE_FLOOR_NODE", format!("floor-{i}"))
            .kill_on_drop(true);
        if i == 1 {
            cmd.env("QUIRE_FLOOR_DIRECTORY", "1");
        }
        nodes.push(cmd.spawn().expect("spawn quire-floor"));
        wait_listening(addr, "quire-floor").await;
        urls.push(format!("ws://{addr}"));
    }
    let typing = bench_at(
        &urls.join(","),
        "typing --rooms 4 --clients 5 --rate 10 --duration 1s --warmup 0s --prefix spread",
    )
    .await;
    let t = one(&typing, "typing");
    assert_eq!(t["complete"], true, "{t}");
    assert_eq!(t["delivered"], t["expected"], "{t}");
    for mut node in nodes {
        let _ = node.kill().await;
    }
    let _ = nats.kill().await;
}
