//! Interop with the real npm packages (`yjs`, `y-websocket`, `ws`): the scripts in `tests/js`
//! run against a server started here. They need `npm ci --prefix tests/js` first; without the
//! packages these tests fail (they are part of the suite, never skipped).

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

fn js_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/js");
    assert!(
        dir.join("node_modules/y-websocket").is_dir(),
        "the npm packages for the interop tests are missing: run `npm ci --prefix tests/js`"
    );
    dir
}

fn node() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("node");
    cmd.current_dir(js_dir()).kill_on_drop(true);
    cmd
}

/// Runs `interop.mjs` (random edits and disconnects, then convergence with late clients)
/// against a fresh server with `extra` arguments; returns its output once it succeeded, and
/// the server for checks of its own.
async fn interop(default_ms: &str, extra: &[&str]) -> (String, TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed() % (1 << 31);
    let duration = std::env::var("QUIRE_INTEROP_MS").unwrap_or_else(|_| default_ms.into());
    let out = tokio::time::timeout(
        Duration::from_secs(180),
        node()
            .args(["interop.mjs", "--url", &format!("ws://{}", server.addr)])
            .args(["--seed", &seed.to_string(), "--duration", &duration])
            .args(extra)
            .output(),
    )
    .await
    .expect("interop script finishes")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "interop failed (seed {seed})");
    assert!(stdout.contains("\"ok\":true"));
    (stdout, server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_yjs_clients_on_three_documents_converge_through_random_disconnects() {
    let (_, server, _dir) = interop("20000", &["--clients", "8", "--docs", "3"]).await;
    assert!(server.metric("quire_updates_logged_total").await > 100.0);
    server.stop().await;
}

/// Both protocols on the same documents: y-websocket clients and `@hocuspocus/provider`
/// clients (4.x and 3.x, three documents per socket) edit at random with random disconnects;
/// every client and fresh late clients of both kinds converge. Seeded: the seed is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn yjs_and_hocuspocus_clients_converge_through_random_disconnects() {
    let args = [
        "--clients",
        "9",
        "--docs",
        "3",
        "--hocuspocus",
        "2",
        "--prefix",
        "mixed",
    ];
    let (stdout, server, _dir) = interop("15000", &args).await;
    assert!(
        stdout.contains("\"hocuspocus\":4"),
        "four Hocuspocus clients took part"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_and_rust_clients_converge_on_one_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut js = node()
        .args(["mixed.mjs", "--url", &format!("ws://{}", server.addr)])
        .args(["--doc", "mixed", "--seed", &(seed % 1000).to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("node runs");
    let mut lines = BufReader::new(js.stdout.take().expect("stdout")).lines();
    let ready = tokio::time::timeout(PATIENCE, lines.next_line()).await;
    assert!(
        matches!(ready, Ok(Ok(Some(ref l))) if l == "ready"),
        "{ready:?}"
    );

    let url = server.url("mixed");
    let mut rust = Vec::new();
    for i in 0..3 {
        rust.push(Client::connect(&url, 7000 + i).await);
    }
    let mut rust_chars = 0;
    for round in 0..60 {
        for (i, c) in rust.iter_mut().enumerate() {
            let len = c.text_len() as u32;
            let s = format!("rs{i}.{round} ");
            rust_chars += s.len();
            c.insert(rng.random_range(0..=len), &s).await;
            c.pump_until(Duration::from_millis(5), |_| false).await;
        }
    }
    for (i, c) in rust.iter_mut().enumerate() {
        c.durable_ack(i as u64).await;
    }
    let mut stdin = js.stdin.take().expect("stdin");
    stdin.write_all(b"done\n").await.expect("write");
    let last = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("js finishes")
        .expect("read")
        .expect("a result line");
    let result: serde_json::Value = serde_json::from_str(&last).expect("json");
    let js_text = result["content"]["text"].as_str().expect("text").to_owned();
    // Inserts land at random positions (inside earlier ones too), so count characters: the
    // JS clients' text holds every character the Rust clients inserted, plus their own.
    let js_edits = result["edits"].as_u64().unwrap_or(0);
    assert!(js_edits > 0, "the JS clients edited");
    assert!(
        js_text.len() > rust_chars,
        "{} characters in the JS clients' text, {rust_chars} inserted by Rust alone",
        js_text.len()
    );
    for c in rust.iter_mut() {
        let ok = c.pump_until(PATIENCE, |c| c.text() == js_text).await;
        assert!(
            ok,
            "rust client converged with the JS clients (seed {seed})"
        );
    }
    let late = Client::connect(&url, 9999).await;
    assert_eq!(late.text(), js_text);
    assert!(js.wait().await.expect("exit").success());
    server.stop().await;
}

/// A restore while real y-websocket clients edit (tests/js/history.mjs): a client typing
/// throughout and one offline during the restore converge, with a fresh client, on the
/// version's text plus the edits the restore had not seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_under_live_and_offline_yjs_clients_converges() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let seed = seed() % (1 << 31);
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        node()
            .args(["history.mjs", "--url", &format!("ws://{}", server.addr)])
            .args(["--http", &format!("http://{}", server.addr)])
            .args(["--doc", "restored", "--seed", &seed.to_string()])
            .output(),
    )
    .await
    .expect("history script finishes")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(out.status.success(), "restore interop failed (seed {seed})");
    assert!(stdout.contains("\"ok\":true"));
    server.stop().await;
}

/// A branch merged in part while real clients edit (tests/js/branches.mjs): a y-websocket
/// client and a Hocuspocus provider type on the parent; two authors (a y-websocket client and
/// a Hocuspocus provider, tokens of their own) edit a branch, the second inside the first's
/// text; merging the second's changes alone is refused naming the first's, then the first's
/// are merged while the parent's clients keep typing. Everyone converges, and a fresh client
/// of the parent reads exactly the merged author's changes plus the parent's typing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_branch_merged_in_part_under_live_yjs_and_hocuspocus_clients_converges() {
    let out = branches("alice").await;
    assert!(out.status.success(), "branch merge interop failed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
}

/// The same with the other author's changes merged too: the script's checks must fail (what
/// they assert can fail), naming the other author's text in the parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_branch_merge_checks_fail_when_the_other_author_is_merged_too() {
    let out = branches("both").await;
    assert!(
        !out.status.success(),
        "the checks passed with both authors merged"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("not ok - bob's unmerged text reached the parent")
            && stdout.contains("not ok - without the typing the parent reads"),
        "{stdout}"
    );
}

/// The two wedges against the stock providers (tests/js/wedge.mjs): a raw socket sends the
/// second of two updates of its own and a delete set for its victims' future clocks; the
/// y-websocket and Hocuspocus clients type on, and a fresh client reads all they typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_clients_keep_every_edit_after_a_writer_sends_updates_that_do_not_integrate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = test_config(dir.path());
    cfg.room.held_update_timeout = Duration::from_millis(500);
    let server = TestServer::start(cfg).await;
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        node()
            .args(["wedge.mjs", "--url", &format!("ws://{}", server.addr)])
            .output(),
    )
    .await
    .expect("wedge script finishes")
    .expect("node runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "wedge interop failed");
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    server.stop().await;
}

/// Runs tests/js/branches.mjs against a fresh secured server, merging `merge`'s changes
/// (`alice`, or `both` to see the checks fail); its output.
async fn branches(merge: &str) -> std::process::Output {
    use quire_server::auth::Permission;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let seed = seed() % (1 << 31);
    let tokens = serde_json::json!({
        "pat": token("pat", "plan*", Permission::Write),
        "hugo": token("hugo", "plan*", Permission::Write),
        "alice": token("alice", "plan*", Permission::Write),
        "bob": token("bob", "plan*", Permission::Write),
        "rev": token("rev", "plan*", Permission::Write),
        "rita": token("rita", "plan*", Permission::Read),
    });
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        node()
            .args(["branches.mjs", "--url", &format!("ws://{}", server.addr)])
            .args(["--http", &format!("http://{}", server.addr)])
            .args(["--tokens", &tokens.to_string(), "--parent", "plan"])
            .args(["--seed", &seed.to_string(), "--merge", merge])
            .output(),
    )
    .await
    .expect("branches script finishes")
    .expect("node runs");
    eprintln!(
        "seed {seed}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    server.stop().await;
    out
}

/// A Python tool (tests/python/edit_doc.py: pycrdt, pycrdt-websocket's channel over httpx-ws,
/// from PyPI) and a stock yjs + y-websocket client (the stack a browser editor uses) edit one
/// document at the same time: each appends its text, each ends up with both, identical, and a
/// fresh read of the committed state holds both. The Python packages come from
/// tests/requirements.txt (tests/run-all.sh installs them); without them this fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_pycrdt_tool_and_a_yjs_client_converge_on_one_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let url = format!("ws://{}", server.addr);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/python/edit_doc.py");
    let python = tokio::process::Command::new("python3")
        .arg(&script)
        .args([
            &url,
            "tools",
            "[from python]",
            "[from python],[from js]",
            "30",
        ])
        .kill_on_drop(true)
        .output();
    let js = node()
        .args(["python-peer.mjs", "--url", &url, "--doc", "tools"])
        .args(["--text", "[from js]", "--expect", "[from python],[from js]"])
        .output();
    let (python, js) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(python, js) })
            .await
            .expect("both finish");
    let (python, js) = (python.expect("python3 runs"), js.expect("node runs"));
    let said = |o: &std::process::Output| -> serde_json::Value {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "failed: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        serde_json::from_str(out.trim()).expect("a JSON line")
    };
    let (from_python, from_js) = (said(&python), said(&js));
    assert_eq!(
        from_python["text"], from_js["text"],
        "both hold the same text"
    );
    let stored = reqwest::get(format!("http://{}/api/v1/docs/tools/json", server.addr))
        .await
        .expect("GET /json")
        .json::<serde_json::Value>()
        .await
        .expect("json");
    let text = stored["content"].as_str().expect("the text root");
    assert!(
        text.contains("[from python]") && text.contains("[from js]"),
        "{text}"
    );
    assert_eq!(stored["content"], from_python["text"]);
}
