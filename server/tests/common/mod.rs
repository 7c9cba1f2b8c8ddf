//! Test harness: a real server on port 0 with a fresh database, and a Rust y-websocket client.
#![allow(dead_code)]

mod api;
mod client;
mod cluster;
mod command;
mod wedge;

#[allow(unused_imports)]
pub use api::*;
#[allow(unused_imports)]
pub use client::*;
#[allow(unused_imports)]
pub use cluster::*;
#[allow(unused_imports)]
pub use command::*;
#[allow(unused_imports)]
pub use wedge::*;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use quire_server::app::TestHooks;
use quire_server::config::{Config, Settings};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The markers of `acked` (each a `[...]` token) that `text` lacks, found in one pass over
/// the text. A `contains` per marker is quadratic: on a document of megabytes it holds the
/// test's runtime, which the server under test shares, for seconds, long enough to starve
/// the rooms' lease renewals.
pub fn lost_markers<'a>(text: &str, acked: impl IntoIterator<Item = &'a String>) -> Vec<&'a str> {
    let mut present = std::collections::HashSet::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        rest = &rest[open..];
        let Some(close) = rest[1..].find(['[', ']']) else {
            break;
        };
        if rest.as_bytes()[close + 1] == b']' {
            present.insert(&rest[..close + 2]);
            rest = &rest[close + 2..];
        } else {
            rest = &rest[close + 1..];
        }
    }
    acked
        .into_iter()
        .map(String::as_str)
        .filter(|m| !present.contains(m))
        .collect()
}

/// Generous bound for "this should happen": tests fail instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(20);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("QUIRE_TEST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// The PostgreSQL server the tests use (`QUIRE_TEST_PG_URL` overrides it); each test gets a
/// database of its own on it.
pub fn pg_admin_url() -> String {
    std::env::var("QUIRE_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// True when the suite runs against PostgreSQL (`QUIRE_TEST_DATABASE=postgres`); SQLite
/// otherwise.
pub fn on_postgres() -> bool {
    match std::env::var("QUIRE_TEST_DATABASE").as_deref() {
        Ok("postgres") | Ok("postgresql") => true,
        Ok("sqlite") | Ok("") | Err(_) => false,
        Ok(other) => panic!("QUIRE_TEST_DATABASE={other:?}: expected sqlite or postgres"),
    }
}

/// For the tests marked `#[ignore = "PostgreSQL pass only..."]`: they are listed as ignored on
/// the SQLite pass, and the PostgreSQL pass (`tests/run-all.sh`) runs them with
/// `--include-ignored`; run on SQLite all the same, they fail instead of passing as no-ops.
pub fn require_postgres() {
    assert!(
        on_postgres(),
        "this test needs PostgreSQL: run it with QUIRE_TEST_DATABASE=postgres \
         (the PostgreSQL pass of tests/run-all.sh)"
    );
}

/// For the tests named `*_on_sqlite`, which the PostgreSQL pass skips (`--skip _on_sqlite`).
pub fn require_sqlite() {
    assert!(
        !on_postgres(),
        "this test is for SQLite: the PostgreSQL pass skips tests named *_on_sqlite"
    );
}

/// The database of the test whose temporary directory is `dir`: a SQLite file in it, or on
/// PostgreSQL a database of its own, named after the directory and created on first use
/// (the same `dir` always gives the same database, as the same file would).
pub fn database_url(dir: &Path) -> String {
    if !on_postgres() {
        return format!("sqlite://{}", dir.join("quire.db").display());
    }
    pg_database_url(dir)
}

/// A PostgreSQL database of the test whose directory is `dir`, whichever backend the suite
/// runs on (several server nodes need PostgreSQL). PostgreSQL must be reachable.
pub fn pg_database_url(dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    dir.hash(&mut h);
    let name = format!("quire_t_{}_{:016x}", std::process::id(), h.finish());
    pg_databases().create(&name);
    let admin = pg_admin_url();
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
    format!("{base}/{name}")
}

/// The databases this test process created, dropped when it exits.
struct PgDatabases {
    created: std::sync::Mutex<std::collections::HashSet<String>>,
}

fn pg_databases() -> &'static PgDatabases {
    static DBS: std::sync::OnceLock<PgDatabases> = std::sync::OnceLock::new();
    DBS.get_or_init(|| {
        // Databases left by test processes that are gone (killed, or interrupted).
        let stale: Vec<String> =
            pg_admin_query(r"SELECT datname FROM pg_database WHERE datname LIKE 'quire\_t\_%'");
        for db in stale {
            let pid = db.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                pg_admin_exec(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"));
            }
        }
        extern "C" fn drop_all() {
            let created = pg_databases()
                .created
                .lock()
                .map(|c| c.clone())
                .unwrap_or_default();
            for db in created {
                let _ = std::panic::catch_unwind(|| {
                    pg_admin_exec(&format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"))
                });
            }
        }
        extern "C" {
            fn atexit(f: extern "C" fn()) -> std::os::raw::c_int;
        }
        // SAFETY: registering a plain function with the C runtime's exit handlers.
        unsafe {
            atexit(drop_all);
        }
        PgDatabases {
            created: std::sync::Mutex::new(Default::default()),
        }
    })
}

impl PgDatabases {
    fn create(&self, name: &str) {
        let mut created = self.created.lock().unwrap_or_else(|e| e.into_inner());
        if created.insert(name.to_owned()) {
            pg_admin_exec(&format!("CREATE DATABASE \"{name}\""));
        }
    }
}

/// Runs `f` on a runtime of its own in a thread of its own, so it works from sync and async
/// code alike.
fn on_own_runtime<T: Send + 'static>(
    f: impl FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(f())
    })
    .join()
    .expect("admin thread")
}

async fn pg_admin_conn() -> sqlx::PgConnection {
    use sqlx::Connection;
    let url = pg_admin_url();
    match sqlx::PgConnection::connect(&url).await {
        Ok(c) => c,
        Err(e) => panic!(
            "QUIRE_TEST_DATABASE=postgres but PostgreSQL at {url} is not reachable: {e} \
             (start it, or run the suite on SQLite without QUIRE_TEST_DATABASE)"
        ),
    }
}

fn pg_admin_exec(sql: &str) {
    let sql = sql.to_owned();
    on_own_runtime(move || {
        Box::pin(async move {
            let mut c = pg_admin_conn().await;
            sqlx::query(&sql)
                .execute(&mut c)
                .await
                .expect("admin statement");
        })
    })
}

fn pg_admin_query(sql: &str) -> Vec<String> {
    let sql = sql.to_owned();
    on_own_runtime(move || {
        Box::pin(async move {
            let mut c = pg_admin_conn().await;
            sqlx::query_scalar(&sql)
                .fetch_all(&mut c)
                .await
                .expect("admin query")
        })
    })
}

/// Settings for tests: the test's own database (see [`database_url`]), quick unloads.
pub fn test_config(dir: &Path) -> Config {
    let mut cfg = Settings::default().resolve();
    cfg.database_url = database_url(dir).into();
    cfg.room.unload_delay = Duration::from_millis(200);
    cfg.shutdown_grace = Duration::from_secs(10);
    cfg
}

/// An in-process server.
pub struct TestServer {
    pub addr: SocketAddr,
    pub shutdown: CancellationToken,
    handle: JoinHandle<anyhow::Result<()>>,
}

impl TestServer {
    pub async fn start(config: Config) -> TestServer {
        TestServer::start_at(config, "127.0.0.1:0".parse().expect("addr")).await
    }

    /// Starts on `addr` (a stopped server's address, to restart it where clients expect it).
    pub async fn start_at(config: Config, addr: SocketAddr) -> TestServer {
        TestServer::start_at_with_hooks(config, addr, TestHooks::default()).await
    }

    /// Starts with test hooks (bus faults, a barrier in restores).
    pub async fn start_with_hooks(config: Config, hooks: TestHooks) -> TestServer {
        let addr = "127.0.0.1:0".parse().expect("addr");
        TestServer::start_at_with_hooks(config, addr, hooks).await
    }

    async fn start_at_with_hooks(config: Config, addr: SocketAddr, hooks: TestHooks) -> TestServer {
        init_tracing();
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(quire_server::run_with_hooks(
            listener,
            config,
            hooks,
            shutdown.clone(),
        ));
        TestServer {
            addr,
            shutdown,
            handle,
        }
    }

    pub fn url(&self, doc: &str) -> String {
        format!("ws://{}/{}", self.addr, doc)
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Graceful shutdown, as on SIGTERM.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(PATIENCE, self.handle)
            .await
            .expect("server stops in time")
            .expect("server task")
            .expect("server result");
    }

    /// Fetches a metric's value from /metrics.
    pub async fn metric(&self, name: &str) -> f64 {
        metric_at(self.addr, name).await
    }
}

/// The `quire` binary as a child process (for SIGKILL tests). Its log (stderr) is kept and
/// printed only if the test fails, so a passing suite's output is not filled with every
/// server's start-up warnings.
pub struct ServerProcess {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(log) = self.log.lock() {
                eprintln!("--- log of the quire process at {}:", self.addr);
                for line in log.iter() {
                    eprintln!("{line}");
                }
            }
        }
    }
}

impl ServerProcess {
    /// Starts `quire serve` on the database of test directory `dir`, as node `test-node`
    /// (a restarted process takes its room leases back at once, as a restarted node would).
    pub async fn start(dir: &Path, extra: &[&str]) -> ServerProcess {
        let mut args = vec!["--node-id", "test-node"];
        args.extend_from_slice(extra);
        ServerProcess::start_url(&database_url(dir), &args).await
    }

    /// Starts `quire serve` on the database at `url`.
    pub async fn start_url(url: &str, extra: &[&str]) -> ServerProcess {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_quire"))
            .arg("serve")
            .arg("--bind")
            .arg("127.0.0.1:0")
            .arg("--database")
            .arg(url)
            .args(extra)
            .env("QUIRE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn quire");
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        if let Some(stderr) = child.stderr.take() {
            let log = log.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stderr).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Ok(mut log) = log.lock() {
                        log.push(line);
                    }
                }
            });
        }
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.strip_prefix("quire listening on ") {
                    return addr.parse::<SocketAddr>().expect("address");
                }
            }
            panic!("quire exited before listening");
        })
        .await
        .expect("quire starts");
        ServerProcess { child, addr, log }
    }

    pub fn url(&self, doc: &str) -> String {
        format!("ws://{}/{}", self.addr, doc)
    }

    /// Fetches a metric's value from /metrics.
    pub async fn metric(&self, name: &str) -> f64 {
        metric_at(self.addr, name).await
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.id().expect("running").to_string();
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -{sig} {pid}");
    }
}

/// A minimal HTTP/1.1 GET: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Log rows a load of the document replays (above its snapshot), read straight from the
/// test's database. Rows a snapshot covers and the history keeps are not counted.
pub async fn log_rows(dir: &Path, name: &str) -> i64 {
    let pool = open_db(dir).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM doc_updates u JOIN documents d ON d.id = u.doc_id \
         WHERE d.name = $1 AND u.seq > d.snapshot_seq",
    )
    .bind(name)
    .fetch_one(&pool)
    .await
    .expect("count");
    pool.close().await;
    n
}

/// A pool on the database of test directory `dir`, whichever backend it is. Queries use
/// `$1`-style parameters, which both backends accept.
pub async fn open_db(dir: &Path) -> sqlx::AnyPool {
    sqlx::any::install_default_drivers();
    // (sqlx waits up to 5 s for SQLite's lock, so a busy server does not fail the read.)
    sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&database_url(dir))
        .await
        .expect("open db")
}

/// The stores of test directory `dir`'s database, opened as the server opens them.
pub async fn open_test_stores(dir: &Path) -> quire_server::Stores {
    quire_server::open_stores(&test_config(dir))
        .await
        .expect("open stores")
}

pub fn seed() -> u64 {
    let seed = std::env::var("QUIRE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed = {seed} (replay with QUIRE_TEST_SEED={seed})");
    seed
}

pub fn shared<T>(t: T) -> Arc<T> {
    Arc::new(t)
}

/// Sends a request and decodes its JSON body (tests only: failures panic).
#[allow(async_fn_in_trait)]
pub trait JsonBody {
    async fn json_body(self) -> serde_json::Value;
}

impl JsonBody for reqwest::RequestBuilder {
    async fn json_body(self) -> serde_json::Value {
        self.send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json body")
    }
}

impl TestServer {
    /// Waits until a metric satisfies `done` (a test fails if it never does).
    pub async fn wait_metric(&self, name: &str, done: impl Fn(f64) -> bool) {
        wait_metric_at(self.addr, name, done).await
    }
}

/// A metric's value from the /metrics of the server at `addr` (0 if it is not there).
pub async fn metric_at(addr: SocketAddr, name: &str) -> f64 {
    let body = http_get(addr, "/metrics").await.1;
    body.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

/// Waits until a metric of the server at `addr` satisfies `done` (a test fails if it never
/// does).
pub async fn wait_metric_at(addr: SocketAddr, name: &str, done: impl Fn(f64) -> bool) {
    let ok = tokio::time::timeout(PATIENCE, async {
        while !done(metric_at(addr, name).await) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(ok.is_ok(), "metric {name} never reached the expected value");
}
