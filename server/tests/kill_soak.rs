//! Kill soak: twenty SIGKILLs of a random node at random moments while twenty clients edit
//! without pause (each edit asks for a durable ack). After each restart, before any client
//! may reconnect (a reconnecting client uploads what it has, which would hide a loss), a
//! client that never held the document must find every edit any client saw acknowledged;
//! at the end every client converges. SQLite pass: one node. PostgreSQL pass: three nodes on
//! a bus. The seed is printed; `QUIRE_TEST_SEED` replays it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

const KILLS: usize = 20;
const EDITORS: u64 = 20;
const DOC: &str = "soak";

/// Starts the editors; they run until `stop` fires.
fn start_editors(
    urls: &Urls,
    log: &Arc<Mutex<Vec<String>>>,
    stop: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<Editor>> {
    (0..EDITORS)
        .map(|i| {
            let mut e = Editor::new(1_000 + i);
            e.log = log.clone();
            tokio::spawn(e.run(urls.clone(), stop.clone()))
        })
        .collect()
}

/// Every marker in `acked` is in what a fresh client gets through `live`.
async fn check_fresh(live: &[String], acked: &[String], seed: u64, kill: usize) {
    let text = fresh_text_via(live).await;
    let lost = lost_markers(&text, acked);
    assert!(
        lost.is_empty(),
        "seed {seed}, after kill {kill}: acknowledged, then lost: {lost:?}"
    );
}

async fn finish(
    editors: Vec<tokio::task::JoinHandle<Editor>>,
    urls: &Urls,
    stop: CancellationToken,
    seed: u64,
) -> usize {
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.cancel();
    let mut done = Vec::new();
    for e in editors {
        done.push(e.await.expect("editor"));
    }
    let reconnects: u64 = done.iter().map(|e| e.reconnects).sum();
    let checked = check_soak(done, urls).await;
    eprintln!(
        "seed {seed}: {KILLS} kills, {checked} acknowledged updates checked with a fresh \
         client, {reconnects} reconnections"
    );
    checked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_kills_of_a_single_node_lose_nothing_acknowledged_on_sqlite() {
    require_sqlite();
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut node = ServerProcess::start(dir.path(), &[]).await;
    let urls: Urls = Arc::new(Mutex::new(vec![node.url(DOC)]));
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let editors = start_editors(&urls, &log, &stop);
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(200..1_200))).await;
        // Reconnections are held back from before the kill until the check: a client that
        // reconnects uploads what it has.
        urls.lock().expect("urls").clear();
        let acked = log.lock().expect("log").clone();
        node.signal("KILL");
        let _ = node.child.wait().await;
        node = ServerProcess::start(dir.path(), &[]).await;
        let live = vec![node.url(DOC)];
        check_fresh(&live, &acked, seed, kill).await;
        *urls.lock().expect("urls") = live;
    }
    let checked = finish(editors, &urls, stop, seed).await;
    assert!(checked >= 100, "seed {seed}: only {checked} acknowledged");
    node.signal("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn twenty_kills_of_random_nodes_of_three_lose_nothing_acknowledged() {
    require_postgres();
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg_database_url(dir.path());
    let nats = Nats::start().await;
    let ids = ["node-1", "node-2", "node-3"];
    let start = |id: &'static str| {
        let (url, bus) = (url.clone(), nats.url.clone());
        async move { ServerProcess::start_url(&url, &node_args(id, &bus, "2s")).await }
    };
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(start(id).await);
    }
    let all = |nodes: &[ServerProcess]| nodes.iter().map(|n| n.url(DOC)).collect::<Vec<_>>();
    let urls: Urls = Arc::new(Mutex::new(all(&nodes)));
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let editors = start_editors(&urls, &log, &stop);
    for kill in 1..=KILLS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1_500))).await;
        let victim = rng.random_range(0..nodes.len());
        urls.lock().expect("urls").clear();
        let acked = log.lock().expect("log").clone();
        nodes[victim].signal("KILL");
        let _ = nodes[victim].child.wait().await;
        // Restarted under its name, the node takes its own leases back at once.
        nodes[victim] = start(ids[victim]).await;
        let live = all(&nodes);
        check_fresh(&live, &acked, seed, kill).await;
        *urls.lock().expect("urls") = live;
    }
    let checked = finish(editors, &urls, stop, seed).await;
    assert!(checked >= 100, "seed {seed}: only {checked} acknowledged");
    for n in &nodes {
        n.signal("TERM");
    }
    drop(nats);
}
