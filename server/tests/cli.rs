//! The `quire` binary: help, migrate, configuration layering, SIGTERM.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

fn quire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quire"))
}

#[test]
fn help_documents_every_setting() {
    let out = quire()
        .args(["serve", "--help"])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--bind",
        "--database",
        "--config",
        "--sqlite-synchronous",
        "--log-format",
        "--log",
        "--max-message-size",
        "--max-doc-size",
        "--max-connections-per-doc",
        "--peer-queue",
        "--room-queue",
        "--commit-batch",
        "--ping-interval",
        "--idle-timeout",
        "--awareness-timeout",
        "--room-unload-delay",
        "--load-retry-delay",
        "--snapshot-updates",
        "--snapshot-bytes",
        "--shutdown-grace",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    // Every setting in the README's table is a flag, and the other way round.
    let readme = include_str!("../../README.md");
    for line in readme
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("`--"))
    {
        let flag = line.split('`').nth(1).expect("flag column");
        assert!(help.contains(flag), "README lists {flag}, --help does not");
    }
}

/// Each subcommand's help shows the settings it reads and not the server's others; a hidden
/// setting is still accepted (a config file or script may carry it).
#[test]
fn each_subcommand_shows_only_the_settings_it_reads() {
    let help = |args: &[&str]| {
        let out = quire()
            .args(args)
            .arg("--help")
            .output_within(COMMAND_LIMIT)
            .expect("run");
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let issue = help(&["token", "issue"]);
    assert!(
        issue.contains("--auth-key") && issue.contains("--config"),
        "{issue}"
    );
    for flag in [
        "--database",
        "--sqlite-synchronous",
        "--bus",
        "--peer-queue",
        "--bind",
    ] {
        assert!(!issue.contains(flag), "token issue shows {flag}:\n{issue}");
    }
    let export = help(&["doc", "export"]);
    assert!(
        export.contains("--database") && export.contains("--bind"),
        "{export}"
    );
    for flag in [
        "--auth-key",
        "--peer-queue",
        "--webhook-url",
        "--heavy-per-node",
    ] {
        assert!(!export.contains(flag), "doc export shows {flag}:\n{export}");
    }
    let doctor = help(&["doctor"]);
    assert!(
        doctor.contains("--bus") && doctor.contains("--cluster-key"),
        "{doctor}"
    );
    assert!(!doctor.contains("--snapshot-bytes"), "{doctor}");
    // Hidden, yet accepted.
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("q.db").display());
    let out = quire()
        .args(["migrate", "--database", &url, "--peer-queue", "8"])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn migrate_creates_the_schema_and_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = quire()
        .args(["migrate", "--database", &database_url(dir.path())])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let pool = open_db(dir.path()).await;
        let sql = if on_postgres() {
            "SELECT CAST(table_name AS TEXT) FROM information_schema.tables \
             WHERE table_schema = 'public' ORDER BY table_name"
        } else {
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        };
        let tables: Vec<(String,)> = sqlx::query_as(sql).fetch_all(&pool).await.expect("tables");
        let names: Vec<_> = tables.into_iter().map(|t| t.0).collect();
        assert!(names.contains(&"documents".to_string()), "{names:?}");
        assert!(names.contains(&"doc_updates".to_string()), "{names:?}");
    });
}

/// A log that is not a terminal (a file, a pipe, a journal) has no colour codes: a new
/// user's log file was full of them.
#[test]
fn a_log_that_is_not_a_terminal_has_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = quire()
        .args(["migrate", "--database", &database_url(dir.path())])
        .env("QUIRE_LOG", "info")
        .env_remove("NO_COLOR")
        .output_within(COMMAND_LIMIT)
        .expect("run");
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("migrations applied"), "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log:?}"
    );
}

/// Flags beat `QUIRE_*` variables, which beat the TOML file. Observed through the listening
/// address: a layer pointing at a port already taken makes start-up fail.
#[test]
fn flags_beat_environment_which_beats_the_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let taken = taken.local_addr().expect("addr").to_string();
    let file = dir.path().join("quire.toml");
    std::fs::write(&file, format!("bind = \"{taken}\"\nlog = \"warn\"\n")).expect("write");
    let db = database_url(dir.path());

    let start = |env_bind: Option<&str>, flag_bind: Option<&str>| {
        let mut cmd = quire();
        cmd.args(["serve", "--config"])
            .arg(&file)
            .args(["--database", &db]);
        cmd.env_remove("QUIRE_BIND");
        if let Some(b) = env_bind {
            cmd.env("QUIRE_BIND", b);
        }
        if let Some(b) = flag_bind {
            cmd.args(["--bind", b]);
        }
        cmd.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        // It prints its address once listening; a failed bind ends the process (stdout EOF).
        let stdout = child.stdout.take().expect("stdout");
        let listening = std::io::BufRead::lines(std::io::BufReader::new(stdout))
            .map_while(Result::ok)
            .any(|l| l.starts_with("quire listening on "));
        let _ = child.kill();
        let status = child.wait().expect("wait");
        if listening {
            Ok(())
        } else {
            Err(status)
        }
    };
    assert!(
        start(None, None).is_err(),
        "the file's (taken) address is used"
    );
    assert!(
        start(Some("127.0.0.1:0"), None).is_ok(),
        "env beats the file"
    );
    assert!(
        start(Some(&taken), Some("127.0.0.1:0")).is_ok(),
        "flag beats env"
    );
}

#[tokio::test]
async fn sigterm_commits_closes_with_1001_and_exits_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path();
    let mut server = ServerProcess::start(db, &["--log-format", "json"]).await;
    let mut c = Client::connect(&server.url("term"), 1).await;
    for i in 0..30 {
        c.insert(i, "t").await;
    }
    c.durable_ack(1).await;
    server.signal("TERM");
    assert_eq!(c.wait_closed().await, Some(1001));
    let status = tokio::time::timeout(PATIENCE, server.child.wait())
        .await
        .expect("exits in time")
        .expect("status");
    assert!(status.success(), "{status:?}");
    let server = ServerProcess::start(db, &[]).await;
    let again = Client::connect(&server.url("term"), 2).await;
    assert_eq!(again.text(), "t".repeat(30));
    assert_eq!(
        log_rows(db, "term").await,
        0,
        "the shutdown snapshot covers the log"
    );
    server.signal("TERM");
}

#[test]
fn token_issue_prints_a_token_the_server_accepts_and_revoke_records_it() {
    let key = "cli:0123456789abcdef0123";
    let out = quire()
        .args([
            "token",
            "issue",
            "--auth-key",
            key,
            "--user",
            "ann",
            "--doc",
            "notes/*",
        ])
        .args(["--permission", "write", "--ttl", "10m"])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let auth = quire_server::auth::Auth::new(&[key.into()], None).expect("key");
    let p = auth
        .verify(&token, quire_server::auth::now_secs())
        .expect("valid token");
    assert_eq!(p.user, "ann");
    assert_eq!(p.doc_pattern, "notes/*");
    assert_eq!(p.perm, quire_server::auth::Permission::Write);

    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    let out = quire()
        .args(["token", "revoke", "--user", "ann", "--database", &db])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("revocation 1 recorded"));
}

/// `quire history` and `quire version list|create|restore` against a running server: what
/// they print, and a restore that a fresh client then reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_version_commands_work_through_the_running_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let url = format!(
        "{}?token={}",
        server.url("cli/doc"),
        token("ann", "cli/doc", quire_server::auth::Permission::Write)
    );
    let mut ann = Client::connect(&url, 1).await;
    ann.insert(0, "first").await;
    ann.durable_ack(1).await;
    let base = server.http("");
    let run = |args: &[&str]| {
        let out = quire()
            .args(args)
            .args(["--server", base.trim_end_matches('/'), "--token", ADMIN])
            .output_within(COMMAND_LIMIT)
            .expect("run");
        assert!(
            out.status.success(),
            "quire {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let created =
        tokio::task::block_in_place(|| run(&["version", "create", "cli/doc", "--label", "one"]));
    assert!(
        created.starts_with("version 1 of cli/doc at position 1"),
        "{created}"
    );
    ann.insert(5, " second").await;
    ann.durable_ack(2).await;
    let list = tokio::task::block_in_place(|| run(&["version", "list", "cli/doc"]));
    assert!(
        list.contains("1  position 1  named") && list.contains("one"),
        "{list}"
    );
    let history = tokio::task::block_in_place(|| run(&["history", "cli/doc"]));
    assert!(
        history.contains("positions 1-2") && history.contains("ann (2 updates, +12 -0)"),
        "{history}"
    );
    let restored = tokio::task::block_in_place(|| run(&["version", "restore", "cli/doc", "1"]));
    assert!(
        restored.starts_with("restored version 1 of cli/doc at position 3"),
        "{restored}"
    );
    let fresh = format!(
        "{}?token={}",
        server.url("cli/doc"),
        token("rita", "cli/doc", quire_server::auth::Permission::Read)
    );
    let reader = Client::connect(&fresh, 9).await;
    assert_eq!(reader.text(), "first");
    // A refusal is an error exit with the server's reason.
    let out = quire()
        .args([
            "version",
            "restore",
            "cli/doc",
            "999",
            "--server",
            base.trim_end_matches('/'),
        ])
        .args(["--token", ADMIN])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    reader.close().await;
    ann.close().await;
    server.stop().await;
}

/// `quire branch ...` against a running server: a branch of a document written by three
/// authors (Rust clients), listed, reviewed (authors, dependencies, diffs), a merge refused
/// for a missing dependency then accepted with it, the parent's own typing brought into the
/// branch, a change rejected, the branch closed; the parent then holds exactly the merged
/// changes and its own typing, for a live client, a fresh one and `GET /json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branch_commands_review_and_merge_through_the_running_server() {
    use quire_server::auth::Permission;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(secured(dir.path())).await;
    let ws = |user: &str, doc: &str| {
        format!(
            "{}?token={}",
            server.url(doc),
            token(user, "notes*", Permission::Write)
        )
    };
    let mut ann = Client::connect(&ws("ann", "notes"), 1).await;
    ann.insert(0, "Hello world").await;
    ann.durable_ack(1).await;
    let base = server.http("").trim_end_matches('/').to_owned();
    let run = |args: &[&str]| {
        let out = quire()
            .arg("branch")
            .args(args)
            .args(["--server", &base, "--token", ADMIN])
            .output_within(COMMAND_LIMIT)
            .expect("run");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), stdout, stderr)
    };
    let ok = |args: &[&str]| {
        let (success, stdout, stderr) = tokio::task::block_in_place(|| run(args));
        assert!(success, "quire branch {args:?}: {stderr}");
        stdout
    };
    let refused = |args: &[&str]| {
        let (success, stdout, stderr) = tokio::task::block_in_place(|| run(args));
        assert!(!success, "quire branch {args:?} succeeded: {stdout}");
        stderr
    };

    let created = ok(&["create", "notes", "notes-review"]);
    assert_eq!(created, "branch notes-review of notes from position 1\n");
    // Three authors on the branch, one after the other: bob writes inside alice's insertion
    // (his change needs hers), carol at the end of the parent's text.
    let mut alice = Client::connect(&ws("alice", "notes-review"), 2).await;
    alice.insert(5, " dear").await;
    alice.durable_ack(1).await;
    let mut bob = Client::connect(&ws("bob", "notes-review"), 3).await;
    assert_eq!(bob.text(), "Hello dear world");
    bob.insert(10, "!!").await;
    bob.durable_ack(1).await;
    let mut carol = Client::connect(&ws("carol", "notes-review"), 4).await;
    carol.insert(18, " (carol)").await;
    carol.durable_ack(1).await;
    // Meanwhile the parent goes on.
    ann.insert(0, "[ann] ").await;
    ann.durable_ack(2).await;

    let list = ok(&["list", "notes"]);
    assert!(
        list.starts_with("notes-review  open, by admin, base position 1, 3 ahead, 1 behind"),
        "{list}"
    );
    assert_eq!(list.lines().count(), 1, "{list}");
    assert_eq!(
        ok(&["list", "notes-review"]),
        "no branches of notes-review\n"
    );

    // The ids, by author, from the API the command reads.
    let http = reqwest::Client::new();
    let changes: serde_json::Value = http
        .get(api(&server, "/docs/notes-review/changes"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("GET /changes")
        .json()
        .await
        .expect("json");
    let id_of = |author: &str| {
        let ids: Vec<i64> = changes["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .filter(|c| c["author"] == author)
            .map(|c| c["id"].as_i64().expect("id"))
            .collect();
        assert_eq!(ids.len(), 1, "{author}: {changes}");
        ids[0].to_string()
    };
    let (a, b, c) = (id_of("alice"), id_of("bob"), id_of("carol"));
    let shown = ok(&["changes", "notes-review"]);
    let lines: Vec<&str> = shown.lines().collect();
    assert!(
        lines[0].starts_with("branch notes-review of notes: open, by admin, base position 1"),
        "{shown}"
    );
    let change = |id: &str| {
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("change {id}  ")))
            .unwrap_or_else(|| panic!("no change {id} in:\n{shown}"));
        (lines[at], lines[at + 1])
    };
    let (head, diff) = change(&a);
    assert!(
        head.contains("  alice  open  ") && head.contains("+5 -0"),
        "{head}"
    );
    assert!(!head.contains("depends on"), "{head}");
    assert_eq!(diff, "    text: Hello{+ dear+} world");
    let (head, diff) = change(&b);
    assert!(
        head.contains("  bob  open  ") && head.contains("+2 -0"),
        "{head}"
    );
    assert!(head.ends_with(&format!("depends on {a}")), "{head}");
    assert_eq!(diff, "    text: Hello{+!!+} world");
    let (head, diff) = change(&c);
    assert!(head.contains("  carol  open  "), "{head}");
    assert_eq!(diff, "    text: Hello world{+ (carol)+}");

    // Bob's change alone is refused, naming alice's; nothing is applied.
    let why = refused(&["merge", "notes-review", "--change", &b]);
    assert!(
        why.contains(&format!("depend on changes not chosen: {a}\n"))
            && why.contains(&format!(
                "quire branch merge notes-review --change {a} --change {b}"
            )),
        "{why}"
    );
    let parent_text = || async {
        let doc: serde_json::Value = reqwest::Client::new()
            .get(api(&server, "/docs/notes/json"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("GET /json")
            .json()
            .await
            .expect("json");
        doc["text"].as_str().expect("text root").to_owned()
    };
    assert_eq!(parent_text().await, "[ann] Hello world");

    // The parent's typing comes into the branch (and is no change of the branch's).
    let pulled = ok(&["update-from-parent", "notes-review"]);
    assert!(
        pulled.starts_with(
            "brought the parent's changes up to its position 2 into notes-review at position "
        ),
        "{pulled}"
    );
    let ok_pulled = carol
        .pump_until(PATIENCE, |c| c.text() == "[ann] Hello dear!! world (carol)")
        .await;
    assert!(ok_pulled, "{}", carol.text());
    assert_eq!(
        ok(&["update-from-parent", "notes-review"]),
        "notes-review already has the parent's changes up to its position 2\n"
    );

    let merged = ok(&["merge", "notes-review", "--change", &a, "--change", &b]);
    assert!(
        merged.starts_with(&format!(
            "merged changes {a}, {b} of notes-review into the parent at position "
        )),
        "{merged}"
    );
    let again = ok(&["merge", "notes-review", "--change", &a, "--change", &b]);
    assert_eq!(
        again,
        format!("nothing to merge from notes-review\nalready merged: {a}, {b}\n")
    );
    // The parent's new rows are the branch's own changes: updating from the parent brings
    // nothing, and the branch is then behind by nothing (it stayed "2 behind" for ever).
    assert_eq!(
        ok(&["update-from-parent", "notes-review"]),
        "notes-review already has the parent's changes up to its position 4\n"
    );
    let list = ok(&["list", "notes"]);
    assert!(list.contains(", 0 behind, "), "{list}");
    let rejected = ok(&["reject", "notes-review", &c]);
    assert_eq!(
        rejected,
        format!("rejected change {c} of notes-review (carol, +8 -0)\n")
    );
    let why = refused(&["merge", "notes-review", "--change", &c]);
    assert!(why.contains("change-rejected"), "{why}");
    let shown = ok(&["changes", "notes-review"]);
    assert!(
        shown.contains(&format!("change {a}  alice  merged  ")),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("change {c}  carol  rejected  ")),
        "{shown}"
    );
    let closed = ok(&["close", "notes-review"]);
    assert!(
        closed.starts_with("notes-review  closed, by admin"),
        "{closed}"
    );
    let why = refused(&["merge", "notes-review"]);
    assert!(why.contains("branch-closed"), "{why}");

    // The parent: its own typing and the merged changes, nothing of carol's.
    let expected = "[ann] Hello dear!! world";
    assert_eq!(parent_text().await, expected);
    let live = ann.pump_until(PATIENCE, |c| c.text() == expected).await;
    assert!(live, "the parent's live client has {:?}", ann.text());
    let fresh = Client::connect(&ws("rita", "notes"), 9).await;
    assert_eq!(fresh.text(), expected);
    // A branch from an earlier position holds the parent's content there.
    let old = ok(&["create", "notes", "notes-old", "--position", "1"]);
    assert_eq!(old, "branch notes-old of notes from position 1\n");
    let reader = Client::connect(&ws("rita", "notes-old"), 10).await;
    assert_eq!(reader.text(), "Hello world");
    for c in [ann, alice, bob, carol, fresh, reader] {
        c.close().await;
    }
    server.stop().await;
}

/// CPU time (user + system, in clock ticks) the process `pid` has used.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit_once(')').expect("stat format").1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// A document holding an update whose dependencies never arrive cannot be encoded, so its
/// automatic version cannot be taken: the room tries again after another idle spell instead
/// of at once, forever (it used to spin a core). Measured on the real binary's CPU time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_that_cannot_be_taken_does_not_spin_the_room() {
    use yrs::{ReadTxn, Text, Transact};
    let dir = tempfile::tempdir().expect("tempdir");
    let server = ServerProcess::start(dir.path(), &["--version-idle", "50ms"]).await;
    let mut c = Client::connect(&server.url("pending"), 1).await;
    c.insert(0, "start").await;
    // Client 77's second update without its first: the room holds it for the connection
    // (an earlier Quire logged it, and yrs kept it pending in the document).
    let other = yrs::Doc::with_client_id(77);
    let text = other.get_or_insert_text("text");
    other
        .transact_mut()
        .apply_update(
            <yrs::Update as yrs::updates::decoder::Decode>::decode_v1(
                &c.doc
                    .transact()
                    .encode_state_as_update_v1(&Default::default()),
            )
            .expect("update"),
        )
        .expect("apply");
    {
        let mut txn = other.transact_mut();
        text.insert(&mut txn, 0, "first ");
    }
    let second = {
        let mut txn = other.transact_mut();
        text.insert(&mut txn, 0, "second ");
        txn.encode_update_v1()
    };
    c.send_update(&second).await;
    // (No durable acknowledgement: it is withheld while the peer's update is held.)
    // Past the idle deadline several times over: an idle room uses next to no CPU.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = server.child.id().expect("pid");
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let used = cpu_ticks(pid) - before;
    assert!(
        used < 30,
        "the server used {used} ticks of CPU in one idle second"
    );
    c.close().await;
}

/// The editing trace (tests/data, 259,778 edits) applied to the text root `content` by one
/// client: its whole state as a Yjs v1 update, its text and its state vector.
fn trace_update() -> (Vec<u8>, String, yrs::StateVector) {
    use yrs::{GetString, ReadTxn, Text, Transact};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/editing-trace.json.gz"
    );
    let mut json = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(path).expect("the trace")),
        &mut json,
    )
    .expect("the trace decompresses");
    let trace: serde_json::Value = serde_json::from_str(&json).expect("trace json");
    let doc = yrs::Doc::with_client_id(7);
    let text = doc.get_or_insert_text("content");
    // One transaction per edit, as the keystrokes came: yrs merges the blocks of each
    // when it commits, which keeps positional lookups short (one transaction for all of
    // them takes minutes).
    for edit in trace["edits"].as_array().expect("edits") {
        let mut txn = doc.transact_mut();
        let pos = edit[0].as_u64().expect("pos") as u32;
        let deleted = edit[1].as_u64().expect("deleted") as u32;
        if deleted > 0 {
            text.remove_range(&mut txn, pos, deleted);
        }
        if let Some(s) = edit[2].as_str().filter(|s| !s.is_empty()) {
            text.insert(&mut txn, pos, s);
        }
    }
    let txn = doc.transact();
    let final_text = trace["finalText"].as_str().expect("finalText").to_owned();
    assert_eq!(text.get_string(&txn), final_text, "the trace replays");
    (
        txn.encode_state_as_update_v1(&yrs::StateVector::default()),
        final_text,
        txn.state_vector(),
    )
}

/// A Yjs update file's text root `content` and state vector.
fn decoded(path: &std::path::Path, v2: bool) -> (String, yrs::StateVector) {
    use yrs::updates::decoder::Decode;
    use yrs::{GetString, ReadTxn, Transact};
    let bytes = std::fs::read(path).expect("exported file");
    let update = if v2 {
        yrs::Update::decode_v2(&bytes)
    } else {
        yrs::Update::decode_v1(&bytes)
    }
    .expect("an update");
    let doc = yrs::Doc::new();
    let text = doc.get_or_insert_text("content");
    doc.transact_mut().apply_update(update).expect("applies");
    let txn = doc.transact();
    (text.get_string(&txn), txn.state_vector())
}

/// Runs `quire` with `args`; its stdout, after checking it succeeded.
fn quire_ok(args: &[&str]) -> String {
    let out = quire()
        .args(args)
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(
        out.status.success(),
        "quire {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `quire doc import` and `quire doc export` round trip the editing trace, straight through
/// the store when no server answers and through the document's room when one does: the
/// text and the state vector survive both ways; importing the same file again adds nothing;
/// plain text appends to a text root; JSON shows the roots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doc_export_and_import_round_trip_the_editing_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    let (update, final_text, sv) = trace_update();
    let file = dir.path().join("trace.bin");
    std::fs::write(&file, &update).expect("write");
    let file = file.to_str().expect("utf-8");
    let out = |name: &str| dir.path().join(name).to_str().expect("utf-8").to_owned();
    // Port 1: nothing answers there, so the import writes to the store.
    let nobody = "http://127.0.0.1:1";

    let refused = quire()
        .args([
            "doc",
            "import",
            "trace",
            file,
            "--database",
            &db,
            "--server",
            nobody,
        ])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!refused.status.success(), "an import creates no store");
    quire_ok(&["migrate", "--database", &db]);
    let printed = quire_ok(&[
        "doc",
        "import",
        "trace",
        file,
        "--database",
        &db,
        "--server",
        nobody,
    ]);
    assert!(printed.contains("in the store"), "{printed}");
    quire_ok(&[
        "doc",
        "export",
        "trace",
        "--format",
        "update-v2",
        "-o",
        &out("t.v2"),
        "--database",
        &db,
    ]);
    assert_eq!(
        decoded(&dir.path().join("t.v2"), true),
        (final_text.clone(), sv.clone())
    );
    let printed = quire_ok(&[
        "doc",
        "import",
        "trace",
        file,
        "--database",
        &db,
        "--server",
        nobody,
    ]);
    assert!(printed.contains("already has everything"), "{printed}");
    assert_eq!(
        log_rows(dir.path(), "trace").await,
        1,
        "one row, written once"
    );
    let text = quire_ok(&[
        "doc",
        "export",
        "trace",
        "--format",
        "text",
        "--database",
        &db,
    ]);
    assert_eq!(text, final_text);

    // Through a running server: the import goes through the room, the export reads the
    // store beside it.
    let server = ServerProcess::start(dir.path(), &[]).await;
    let base = format!("http://{}", server.addr);
    let printed = quire_ok(&[
        "doc",
        "import",
        "copy",
        &out("t.v2"),
        "--database",
        &db,
        "--server",
        &base,
    ]);
    assert!(printed.contains("through the server"), "{printed}");
    quire_ok(&[
        "doc",
        "export",
        "copy",
        "-o",
        &out("c.v1"),
        "--database",
        &db,
    ]);
    assert_eq!(
        decoded(&dir.path().join("c.v1"), false),
        (final_text.clone(), sv)
    );

    // Plain text appends to the text root.
    let note = dir.path().join("note.txt");
    std::fs::write(&note, "hello\n").expect("write");
    let note = note.to_str().expect("utf-8");
    for _ in 0..2 {
        quire_ok(&[
            "doc",
            "import",
            "notes",
            note,
            "--format",
            "text",
            "--database",
            &db,
            "--server",
            &base,
        ]);
    }
    let text = quire_ok(&[
        "doc",
        "export",
        "notes",
        "--format",
        "text",
        "--database",
        &db,
    ]);
    assert_eq!(text, "hello\nhello\n");
    let json = quire_ok(&[
        "doc",
        "export",
        "notes",
        "--format",
        "json",
        "--database",
        &db,
    ]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["content"], "hello\nhello\n");

    // What is not there is an error, not an empty file.
    let missing = quire()
        .args(["doc", "export", "nothing-here", "--database", &db])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no document named"));
    drop(server);
}

/// `quire backup` copies a running server's SQLite store and checks the copy; `quire
/// restore-backup` refuses a store a server answers for and a store with documents, and puts
/// the backup into an empty one, where a server then serves the content to a fresh client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_while_serving_then_restore_into_an_empty_store_on_sqlite() {
    require_sqlite();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    let server = ServerProcess::start(dir.path(), &[]).await;
    let base = format!("http://{}", server.addr);
    let mut c = Client::connect(&server.url("kept"), 1).await;
    c.insert(0, "worth keeping").await;
    c.durable_ack(1).await;

    let saved = tempfile::tempdir().expect("tempdir");
    let file = saved.path().join("quire-backup.db");
    let file = file.to_str().expect("utf-8");
    let printed = quire_ok(&["backup", file, "--database", &db]);
    assert!(printed.contains("backed up 1 documents"), "{printed}");
    assert!(printed.contains("integrity ok"), "{printed}");
    let again = quire()
        .args(["backup", file, "--database", &db])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!again.status.success(), "a backup never overwrites a file");

    let refused = quire()
        .args(["restore-backup", file, "--database", &db, "--server", &base])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("a server answers"));
    drop(c);
    drop(server);
    let nobody = "http://127.0.0.1:1";
    let refused = quire()
        .args([
            "restore-backup",
            file,
            "--database",
            &db,
            "--server",
            nobody,
        ])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("only into an empty store"));

    let fresh = tempfile::tempdir().expect("tempdir");
    let fresh_db = database_url(fresh.path());
    // A write-ahead log left beside the target (its database removed without it) would be
    // replayed over the restored file: refused until it is moved away.
    let leftover = fresh.path().join("quire.db-wal");
    std::fs::write(&leftover, b"pages of another database").expect("leftover");
    let refused = quire()
        .args([
            "restore-backup",
            file,
            "--database",
            &fresh_db,
            "--server",
            nobody,
        ])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("exists beside the target"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!fresh.path().join("quire.db").exists(), "nothing restored");
    std::fs::remove_file(&leftover).expect("move it away");
    let printed = quire_ok(&[
        "restore-backup",
        file,
        "--database",
        &fresh_db,
        "--server",
        nobody,
    ]);
    assert!(printed.contains("restored 1 documents"), "{printed}");
    let server = ServerProcess::start(fresh.path(), &[]).await;
    let reader = Client::connect(&server.url("kept"), 2).await;
    assert_eq!(reader.text(), "worth keeping");
}

/// On PostgreSQL, `quire backup` and `restore-backup` print the pg_dump / pg_restore
/// command, without the URL's password.
#[test]
#[ignore = "PostgreSQL pass only: QUIRE_TEST_DATABASE=postgres cargo test -- --include-ignored"]
fn backup_on_postgres_prints_the_pg_dump_command() {
    require_postgres();
    let dir = tempfile::tempdir().expect("tempdir");
    let db =
        database_url(dir.path()).replace("postgres://postgres@", "postgres://postgres:secret@");
    let printed = quire_ok(&["backup", "/tmp/x.dump", "--database", &db]);
    assert!(
        printed.contains("pg_dump --format=custom --file /tmp/x.dump"),
        "{printed}"
    );
    assert!(!printed.contains("secret"), "{printed}");
    let printed = quire_ok(&["restore-backup", "/tmp/x.dump", "--database", &db]);
    assert!(printed.contains("pg_restore"), "{printed}");
    assert!(!printed.contains("secret"), "{printed}");
}

/// `quire compact` writes a snapshot covering the log now; a second run finds nothing to do.
#[tokio::test]
async fn compact_writes_a_snapshot_of_the_log_now() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    let note = dir.path().join("note.txt");
    std::fs::write(&note, "line\n").expect("write");
    let note = note.to_str().expect("utf-8");
    let nobody = "http://127.0.0.1:1";
    quire_ok(&["migrate", "--database", &db]);
    for _ in 0..3 {
        quire_ok(&[
            "doc",
            "import",
            "notes",
            note,
            "--database",
            &db,
            "--server",
            nobody,
        ]);
    }
    let printed = quire_ok(&["compact", "notes", "--database", &db]);
    assert!(
        printed.contains("notes: 3 log rows into a snapshot"),
        "{printed}"
    );
    let pool = open_db(dir.path()).await;
    let (seq,): (i64,) = sqlx::query_as("SELECT snapshot_seq FROM documents WHERE name = 'notes'")
        .fetch_one(&pool)
        .await
        .expect("row");
    assert_eq!(seq, 3, "the snapshot covers the three rows");
    pool.close().await;
    let printed = quire_ok(&["compact", "--database", &db]);
    assert!(printed.contains("compacted 0 of 1 documents"), "{printed}");
    let text = quire_ok(&[
        "doc",
        "export",
        "notes",
        "--format",
        "text",
        "--database",
        &db,
    ]);
    assert_eq!(text, "line\nline\nline\n");
    let missing = quire()
        .args(["compact", "no-such-doc", "--database", &db])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    assert!(!missing.status.success(), "a mistyped name is an error");
    let printed = quire_ok(&["compact", "--database", &db]);
    assert!(
        printed.contains("of 1 documents"),
        "no document was created: {printed}"
    );
}

/// `quire doctor` fails (exit 1) on a store that was never migrated and on an unreachable
/// bus, and passes on a migrated store.
#[test]
fn doctor_checks_the_database_migrations_and_bus() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    if !on_postgres() {
        let out = quire()
            .args(["doctor", "--database", &db])
            .output_within(COMMAND_LIMIT)
            .expect("run");
        assert_eq!(out.status.code(), Some(1), "an absent store fails");
        assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL database"));
    }
    quire_ok(&["migrate", "--database", &db]);
    let printed = quire_ok(&["doctor", "--database", &db]);
    assert!(printed.contains("ok   migrations"), "{printed}");
    assert!(printed.contains("checks passed"), "{printed}");
    let out = quire()
        .args([
            "doctor",
            "--database",
            &db,
            "--bus",
            "nats://127.0.0.1:1",
            "--cluster-key",
            "k",
        ])
        .output_within(COMMAND_LIMIT)
        .expect("run");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{printed}");
    assert!(printed.contains("FAIL bus"), "{printed}");
}

/// `quire doctor` lists the stored updates set aside when their documents loaded (they did not
/// integrate; docs/durability.md), as information, not a failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_lists_what_was_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = database_url(dir.path());
    quire_ok(&["migrate", "--database", &db]);
    let printed = quire_ok(&["doctor", "--database", &db]);
    assert!(
        printed.contains("ok   set aside      no stored update was set aside"),
        "{printed}"
    );
    let stores = open_test_stores(dir.path()).await;
    let doc = stores.docs.load("kept/out").await.expect("document");
    let row = quire_server::storage::set_aside::SetAsideRow {
        seq: 7,
        data: vec![0, 0],
        reason: "depends on content never stored (client 77, clock 0)".into(),
    };
    stores
        .docs
        .shared()
        .set_aside(doc.id, &[row])
        .await
        .expect("set aside");
    let printed = quire_ok(&["doctor", "--database", &db]);
    assert!(
        printed.contains("1 stored updates kept out of their documents")
            && printed.contains("kept/out row 7 (2 bytes): depends on content never stored"),
        "{printed}"
    );
    assert!(printed.contains("checks passed"), "{printed}");
}

/// The `curl` examples of docs/api.md ("The content routes from `curl`") run as written
/// against a server with an auth key, with a token the CLI issued: every command succeeds
/// (`curl -f`), and the copy has the content the example's update carried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_curl_examples_in_the_api_docs_work() {
    let printed = run_api_example("### The content routes from `curl`").await;
    assert!(printed.contains("\"seq\""), "{printed}");
    assert!(printed.contains("Plan, v2"), "{printed}");
}

/// The branch example of docs/api.md: the parent ends with the branch's edit merged.
#[tokio::test]
async fn the_branch_example_in_the_api_docs_works() {
    let printed = run_api_example("### Branches from `curl`").await;
    assert!(
        printed.contains(r#"{"content":"Hello there"}"#),
        "{printed}"
    );
    assert!(printed.contains(r#""state":"closed""#), "{printed}");
}

/// Runs the first `sh` block after `heading` in docs/api.md against a server, with a token
/// for `team/*` in `$TOKEN`; what it printed.
async fn run_api_example(heading: &str) -> String {
    let doc = include_str!("../../docs/api.md");
    let section = doc.split(heading).nth(1).expect("the section");
    let script = section
        .split("```sh\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .expect("the sh block");
    let dir = tempfile::tempdir().expect("tempdir");
    let key = "docs:0123456789abcdef0123";
    let server = ServerProcess::start(dir.path(), &["--auth-key", key]).await;
    let token = quire_ok(&[
        "token",
        "issue",
        "--auth-key",
        key,
        "--user",
        "ann",
        "--doc",
        "team/*",
        "--permission",
        "write",
    ]);
    let script = script.replace("127.0.0.1:1234", &server.addr.to_string());
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("TOKEN", token.trim())
        .current_dir(dir.path())
        .output_within(COMMAND_LIMIT)
        .expect("bash");
    assert!(
        out.status.success(),
        "the example failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    drop(server);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every configuration error `quire serve` can meet before it serves: it exits with an error
/// before it binds or says "listening", and no secret it was given appears in anything it
/// printed (a malformed auth key used to be printed whole).
#[test]
fn configuration_errors_come_before_listening_and_never_print_a_secret() {
    const SECRET: &str = "HUNTER2SECRETVALUE0123";
    let dir = tempfile::tempdir().expect("tempdir");
    let wrong_type = dir.path().join("wrong-type.toml");
    std::fs::write(&wrong_type, format!("auth_keys = \"{SECRET}\"\n")).expect("write");
    let unknown = dir.path().join("unknown.toml");
    std::fs::write(
        &unknown,
        format!("admin_key = \"{SECRET}\"\nbindd = \"127.0.0.1:1\"\n"),
    )
    .expect("write");
    let pg = format!("postgres://quire:{SECRET}@127.0.0.1:1/quire");
    let nats = format!("nats://quire:{SECRET}@127.0.0.1:1");
    let cases: Vec<Vec<String>> = vec![
        vec!["--auth-key".into(), SECRET.into()],
        vec!["--auth-key".into(), format!("{SECRET}:short")],
        vec![
            "--database".into(),
            format!("mysql://quire:{SECRET}@db/quire"),
        ],
        vec![
            "--database".into(),
            pg.clone(),
            "--bus".into(),
            nats.clone(),
        ],
        vec![
            "--database".into(),
            pg,
            "--bus".into(),
            nats,
            "--cluster-key".into(),
            SECRET[..12].into(),
        ],
        vec!["--config".into(), wrong_type.display().to_string()],
        vec!["--config".into(), unknown.display().to_string()],
    ];
    for args in cases {
        let mut child = quire()
            .args(["serve", "--bind", "127.0.0.1:0"])
            .args(&args)
            .current_dir(dir.path())
            .env_remove("QUIRE_AUTH_KEYS")
            .env_remove("QUIRE_DATABASE_URL")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("quire serve {args:?} did not exit: its configuration was accepted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().expect("output");
        let printed = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} was accepted: {printed}");
        assert!(
            !printed.contains("listening"),
            "{args:?}: listening before the configuration was checked: {printed}"
        );
        assert!(
            !printed.contains(&SECRET[..12]),
            "{args:?}: a secret was printed: {printed}"
        );
        assert!(
            printed.contains("rror"),
            "{args:?}: no error said: {printed}"
        );
    }
}
