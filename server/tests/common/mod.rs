//! Test harness: a real server on port 0 with a fresh database, and a Rust y-websocket client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use quire_server::config::{Config, Settings};
use quire_server::protocol::{self, Message};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;
use yrs::updates::decoder::Decode;
use yrs::{Doc, GetString, ReadTxn, StateVector, Text, Transact, Update};

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
        init_tracing();
        let listener = TcpListener::bind(addr).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(quire_server::run(listener, config, shutdown.clone()));
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

/// The `quire` binary as a child process (for SIGKILL tests).
pub struct ServerProcess {
    pub child: tokio::process::Child,
    pub addr: SocketAddr,
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
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn quire");
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
        ServerProcess { child, addr }
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

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// An awareness message announcing one client's state (clock 1) as `json`.
pub fn presence(client: u64, json: &str) -> Bytes {
    let update = yrs::sync::AwarenessUpdate {
        clients: [(
            yrs::ClientID::new(client),
            yrs::sync::awareness::AwarenessUpdateEntry {
                clock: 1,
                json: json.into(),
            },
        )]
        .into_iter()
        .collect(),
    };
    protocol::encode_awareness(&update)
}

/// A y-websocket client in Rust: a `Doc` kept in sync over one socket.
pub struct Client {
    pub doc: Doc,
    ws: Ws,
    pub synced: bool,
    pub acks_received: Vec<Bytes>,
    pub awareness: HashMap<u64, String>,
    pub updates_received: usize,
    pub closed: Option<CloseFrame>,
    /// The reason of the last Auth permission-denied message.
    pub permission_denied: Option<String>,
}

impl Client {
    /// Connects with a fixed client id and waits for the initial sync.
    pub async fn connect(url: &str, client_id: u64) -> Client {
        let mut c = Client::connect_unsynced(url, client_id).await;
        c.sync().await;
        c
    }

    /// Connects and sends Sync/Step1 without waiting for anything.
    pub async fn connect_unsynced(url: &str, client_id: u64) -> Client {
        Client::connect_with_doc(url, Doc::with_client_id(client_id)).await
    }

    pub async fn connect_with_doc(url: &str, doc: Doc) -> Client {
        match Client::try_connect_with_doc(url, doc).await {
            Ok(c) => c,
            Err(e) => panic!("websocket connect: {e}"),
        }
    }

    /// Like [`Client::connect_with_doc`], but a refused connection is an error (a server
    /// that is down, or answers 503/429).
    pub async fn try_connect_with_doc(
        url: &str,
        doc: Doc,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        // Large documents arrive as one large Step2 frame; lift tungstenite's 16 MiB default.
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_frame_size(None)
            .max_message_size(None);
        let (ws, _) = tokio_tungstenite::connect_async_with_config(url, Some(config), true).await?;
        let mut c = Client {
            doc,
            ws,
            synced: false,
            acks_received: Vec::new(),
            awareness: HashMap::new(),
            updates_received: 0,
            closed: None,
            permission_denied: None,
        };
        let sv = c.doc.transact().state_vector();
        c.send_raw(protocol::encode_step1(&sv)).await;
        Ok(c)
    }

    pub async fn sync(&mut self) {
        let ok = self.pump_until(PATIENCE, |c| c.synced).await;
        assert!(ok, "initial sync completes");
    }

    pub fn text(&self) -> String {
        let t = self.doc.get_or_insert_text("text");
        t.get_string(&self.doc.transact())
    }

    /// Length of the shared text, without building the string.
    pub fn text_len(&self) -> usize {
        let t = self.doc.get_or_insert_text("text");
        t.len(&self.doc.transact()) as usize
    }

    pub fn state_vector(&self) -> StateVector {
        self.doc.transact().state_vector()
    }

    /// Inserts into the shared text "text" and sends the update; returns it.
    pub async fn insert(&mut self, index: u32, s: &str) -> Vec<u8> {
        let t = self.doc.get_or_insert_text("text");
        let update = {
            let mut txn = self.doc.transact_mut();
            let len = t.len(&txn);
            t.insert(&mut txn, index.min(len), s);
            txn.encode_update_v1()
        };
        self.send_update(&update).await;
        update
    }

    pub async fn send_update(&mut self, update: &[u8]) {
        self.send_raw(protocol::encode_update(update)).await;
    }

    pub async fn send_raw(&mut self, frame: Bytes) {
        let _ = self.ws.send(WsMessage::Binary(frame)).await;
    }

    /// Sends a durable-ack request and waits for its echo.
    pub async fn durable_ack(&mut self, n: u64) {
        let frame = protocol::encode_durable_ack(n);
        self.send_raw(frame.clone()).await;
        let ok = self
            .pump_until(PATIENCE, |c| c.acks_received.contains(&frame))
            .await;
        assert!(ok, "durable ack {n} echoed");
    }

    /// Handles incoming frames until `done` holds or `patience` passes. Returns whether `done`.
    pub async fn pump_until(&mut self, patience: Duration, done: impl Fn(&Client) -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + patience;
        while !done(self) {
            if self.closed.is_some() {
                return false;
            }
            match tokio::time::timeout_at(deadline, self.ws.next()).await {
                Err(_) => return false,
                Ok(None) => {
                    self.closed = Some(CloseFrame {
                        code: CloseCode::Abnormal,
                        reason: "eof".into(),
                    });
                }
                Ok(Some(Err(_))) => {
                    self.closed = Some(CloseFrame {
                        code: CloseCode::Abnormal,
                        reason: "error".into(),
                    });
                }
                Ok(Some(Ok(msg))) => self.handle(msg).await,
            }
        }
        true
    }

    /// Waits for the server to close the connection; returns the close code.
    pub async fn wait_closed(&mut self) -> Option<u16> {
        self.pump_until(PATIENCE, |c| c.closed.is_some()).await;
        self.closed.as_ref().map(|f| u16::from(f.code))
    }

    async fn handle(&mut self, msg: WsMessage) {
        match msg {
            WsMessage::Binary(data) => {
                let msgs = protocol::decode_frame(&data).expect("server frames decode");
                for m in msgs {
                    match m {
                        Message::SyncStep1(sv) => {
                            let diff = self.doc.transact().encode_diff_v1(&sv);
                            self.send_raw(protocol::encode_step2(&diff)).await;
                        }
                        Message::SyncStep2(u) => {
                            self.apply(&u);
                            self.synced = true;
                        }
                        Message::Update(u) => {
                            self.updates_received += 1;
                            self.apply(&u);
                        }
                        Message::Awareness { update, .. } => {
                            for (id, e) in update.clients {
                                if &*e.json == "null" {
                                    self.awareness.remove(&id.get());
                                } else {
                                    self.awareness.insert(id.get(), e.json.to_string());
                                }
                            }
                        }
                        Message::DurableAck { raw } => self.acks_received.push(raw),
                        Message::Auth(Some(reason)) => self.permission_denied = Some(reason),
                        _ => {}
                    }
                }
            }
            WsMessage::Close(frame) => {
                self.closed = Some(frame.unwrap_or(CloseFrame {
                    code: CloseCode::Status,
                    reason: "".into(),
                }));
            }
            _ => {}
        }
    }

    fn apply(&mut self, update: &[u8]) {
        let u = Update::decode_v1(update).expect("server sends valid updates");
        self.doc.transact_mut().apply_update(u).expect("apply");
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

/// Log rows stored for a document, read straight from the test's database.
pub async fn log_rows(dir: &Path, name: &str) -> i64 {
    let pool = open_db(dir).await;
    let n: i64 = sqlx::query_scalar(
        "SELECT CAST(COUNT(*) AS BIGINT) FROM doc_updates u JOIN documents d ON d.id = u.doc_id \
         WHERE d.name = $1",
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

/// The cluster key the tests' nodes share.
pub const CLUSTER_KEY: &str = "test-cluster-key-0123456789";

/// A private NATS server on a free loopback port (killed when dropped).
pub struct Nats {
    pub child: tokio::process::Child,
    pub url: String,
    pub port: u16,
}

impl Nats {
    pub async fn start() -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        Nats::start_on(port).await
    }

    pub async fn start_on(port: u16) -> Nats {
        Nats::start_with(port, &[]).await
    }

    /// On a free port, with these extra `nats-server` arguments (`--user`, `--pass`, ...).
    pub async fn start_args(extra: &[&str]) -> Nats {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        Nats::start_with(port, extra).await
    }

    pub async fn start_with(port: u16, extra: &[&str]) -> Nats {
        let child = tokio::process::Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .args(extra)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server is installed (Debian package nats-server)");
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(tokio::time::Instant::now() < deadline, "nats-server starts");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
            port,
        }
    }
}

/// A client that never held the document: connects to `url` (client id 999,999), syncs,
/// returns the text, and goes. What a durability test checks with, since a client that
/// held the data would upload it again on reconnect.
pub async fn fresh_text(url: &str) -> String {
    let c = Client::connect(url, 999_999).await;
    let text = c.text();
    c.close().await;
    text
}

/// Settings of an in-process cluster node: the test's PostgreSQL database, node `id`, the
/// bus at `bus` signed with [`CLUSTER_KEY`], a 2 s lease.
pub fn node_config(dir: &Path, id: &str, bus: &str) -> Config {
    let mut cfg = test_config(dir);
    cfg.database_url = pg_database_url(dir).into();
    cfg.node_id = id.to_owned();
    cfg.bus_url = Some(bus.into());
    cfg.cluster_key = Some(CLUSTER_KEY.into());
    cfg.lease_ttl = Duration::from_secs(2);
    cfg
}

/// A client that edits without pause through servers that fail under it: each edit is a
/// marker of its own at the end of the text, followed by a durable-ack request; a marker is
/// *acknowledged* once its ack is echoed. When its connection drops, refuses or times out it
/// reconnects (with its document, as y-websocket does) through the current `urls`, in turn.
pub struct Editor {
    pub id: u64,
    pub doc: Doc,
    pub acked: Vec<String>,
    /// Every editor's acknowledged markers, shared (for checks while they run).
    pub log: Arc<std::sync::Mutex<Vec<String>>>,
    pub sent: u64,
    pub reconnects: u64,
}

/// The servers editors connect through (a test replaces one when it restarts a node).
pub type Urls = Arc<std::sync::Mutex<Vec<String>>>;

impl Editor {
    pub fn new(id: u64) -> Editor {
        Editor {
            id,
            doc: Doc::with_client_id(id),
            acked: Vec::new(),
            log: Arc::default(),
            sent: 0,
            reconnects: 0,
        }
    }

    /// Connects through `urls` (trying each in turn) until a sync completes. `patience`
    /// counts only time in which there was a server to try: while the test holds
    /// reconnections back (no urls), the clock starts again.
    pub async fn connect(&mut self, urls: &Urls, patience: Duration) -> Client {
        let mut deadline = tokio::time::Instant::now() + patience;
        let mut i = self.id as usize;
        loop {
            let url = {
                let urls = urls.lock().unwrap_or_else(|e| e.into_inner());
                (!urls.is_empty()).then(|| urls[i % urls.len()].clone())
            };
            i += 1;
            // (No url: the test holds reconnections back for a moment.)
            let attempt = match url {
                Some(url) => Client::try_connect_with_doc(&url, self.doc.clone())
                    .await
                    .ok(),
                None => {
                    deadline = tokio::time::Instant::now() + patience;
                    None
                }
            };
            if let Some(mut c) = attempt {
                // A large document's sync on a busy machine takes a while: wait for it
                // rather than start over.
                if c.pump_until(Duration::from_secs(10), |c| c.synced).await {
                    return c;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "editor {} cannot reconnect",
                self.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Edits until `stop` fires; returns itself with what was acknowledged.
    pub async fn run(mut self, urls: Urls, stop: CancellationToken) -> Editor {
        let mut client: Option<Client> = None;
        while !stop.is_cancelled() {
            let mut c = match client.take() {
                Some(c) => c,
                None => {
                    self.reconnects += 1;
                    self.connect(&urls, PATIENCE * 3).await
                }
            };
            self.sent += 1;
            let marker = format!("[{}.{}]", self.id, self.sent);
            let end = c.text_len() as u32;
            c.insert(end, &marker).await;
            let ack = protocol::encode_durable_ack(self.sent);
            c.send_raw(ack.clone()).await;
            let acked = c
                .pump_until(Duration::from_secs(3), |c| c.acks_received.contains(&ack))
                .await;
            if acked {
                self.log
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(marker.clone());
                self.acked.push(marker);
                client = Some(c);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            // Otherwise closed or silent: dropped, and the next round reconnects.
        }
        self
    }
}

/// After a soak: a client that never held the document must have every marker the editors
/// saw acknowledged; then every editor reconnects (uploading what it has) and all converge.
/// Returns the number of acknowledged markers checked.
pub async fn check_soak(editors: Vec<Editor>, urls: &Urls) -> usize {
    let mut fresh = Editor::new(999_999);
    let c = fresh.connect(urls, PATIENCE * 3).await;
    let text = c.text();
    c.close().await;
    let mut checked = 0;
    for e in &editors {
        for m in &e.acked {
            assert!(text.contains(m.as_str()), "{m} was acknowledged, then lost");
            checked += 1;
        }
    }
    let mut clients = Vec::new();
    for mut e in editors {
        let mut c = e.connect(urls, PATIENCE * 3).await;
        c.durable_ack(u64::MAX).await;
        clients.push(c);
    }
    let c = fresh.connect(urls, PATIENCE).await;
    let all = c.text();
    c.close().await;
    for c in clients.iter_mut() {
        assert!(
            c.pump_until(PATIENCE, |c| c.text() == all).await,
            "an editor converges"
        );
    }
    checked
}

/// The text a client that never held the document gets through `urls` (retrying until a
/// node serves it).
pub async fn fresh_text_via(urls: &[String]) -> String {
    let mut fresh = Editor::new(999_998);
    let urls: Urls = Arc::new(std::sync::Mutex::new(urls.to_vec()));
    let c = fresh.connect(&urls, PATIENCE * 3).await;
    let text = c.text();
    c.close().await;
    text
}

/// The id of document `name` (the first whose name starts with it), through the HTTP API
/// of the server at `addr`, with `bearer` if given.
pub async fn doc_id(addr: SocketAddr, name: &str, bearer: Option<&str>) -> i64 {
    let mut req = reqwest::Client::new().get(format!("http://{addr}/api/v1/docs?prefix={name}"));
    if let Some(key) = bearer {
        req = req.bearer_auth(key);
    }
    let docs: serde_json::Value = req.send().await.expect("list").json().await.expect("json");
    docs["items"][0]["id"].as_i64().expect("id")
}

/// `quire serve` arguments of cluster node `id` on the bus at `bus` (signed with
/// [`CLUSTER_KEY`]), with a lease of `lease_ttl`.
pub fn node_args<'a>(id: &'a str, bus: &'a str, lease_ttl: &'a str) -> [&'a str; 8] {
    [
        "--node-id",
        id,
        "--bus",
        bus,
        "--cluster-key",
        CLUSTER_KEY,
        "--lease-ttl",
        lease_ttl,
    ]
}
