//! PostgreSQL restarted (`pg_ctlcluster ... restart`) while clients edit without pause: the
//! rooms stall while the database is gone (updates refused with 1013, nothing acknowledged
//! that is not committed), reconnect their pools by themselves once it is back, and every
//! acknowledged edit is there for a client that never held the document, checked before the
//! clients that were refused may reconnect (they would upload what they have). PostgreSQL
//! pass only; it is alone in its test binary because it takes the database away from every
//! test running beside it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tokio_util::sync::CancellationToken;

fn restart_postgres() {
    let version = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    let Some(version) = version else {
        panic!("no local PostgreSQL cluster to restart (/etc/postgresql is empty)");
    };
    let status = std::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .status()
        .expect("pg_ctlcluster");
    assert!(status.success(), "PostgreSQL restarts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
async fn a_postgres_restart_under_load_loses_nothing_acknowledged() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = ServerProcess::start_url(
        &pg_database_url(dir.path()),
        &["--node-id", "pg-restart", "--storage-timeout", "2s"],
    )
    .await;
    let live = [node.url("restart"), node.url("restart-2")];
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let editors: Vec<_> = (0..10)
        .map(|i| {
            let mut e = Editor::new(2_000 + i);
            e.log = log.clone();
            let urls = Arc::new(Mutex::new(vec![live[i as usize % 2].clone()]));
            let shared = urls.clone();
            (tokio::spawn(e.run(urls, stop.clone())), shared)
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = log.lock().expect("log").len();
    // Reconnections are held back from before the restart until the check: a client that
    // reconnects uploads what it has, which would hide a loss.
    for (_, u) in &editors {
        u.lock().expect("urls").clear();
    }
    tokio::task::spawn_blocking(restart_postgres)
        .await
        .expect("restart");
    let acked = log.lock().expect("log").clone();
    for doc in ["restart", "restart-2"] {
        let text = fresh_text_via(&[node.url(doc)]).await;
        let lost = lost_markers(
            &text,
            acked.iter().filter(|m| {
                let id: u64 = m[1..5].parse().unwrap_or(0);
                id.is_multiple_of(2) == (doc == "restart")
            }),
        );
        assert!(lost.is_empty(), "acknowledged, then lost: {lost:?}");
    }
    for (i, (_, u)) in editors.iter().enumerate() {
        *u.lock().expect("urls") = vec![live[i % 2].clone()];
    }
    // Edits flow again after the restart.
    let resumed = log.lock().expect("log").len();
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while log.lock().expect("log").len() < resumed + 50 {
        assert!(tokio::time::Instant::now() < deadline, "edits resume");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let mut by_doc: [Vec<Editor>; 2] = [Vec::new(), Vec::new()];
    for (i, (e, _)) in editors.into_iter().enumerate() {
        by_doc[i % 2].push(e.await.expect("editor"));
    }
    let mut checked = 0;
    for (doc, editors) in ["restart", "restart-2"].into_iter().zip(by_doc) {
        let urls: Urls = Arc::new(Mutex::new(vec![node.url(doc)]));
        checked += check_soak(editors, &urls).await;
    }
    eprintln!(
        "{before} edits acknowledged before the restart, {} by its end, {checked} checked",
        acked.len()
    );
    node.signal("TERM");
}
