//! The native transport: one tokio task per client owns the WebSocket; the application edits the
//! shared [`Doc`] directly and hears about the connection through a watch channel.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use tokio::sync::{broadcast, mpsc, watch, Notify};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};
use yrs::sync::time::SystemClock;
use yrs::{ClientID, Doc, Options};

use crate::session::{Event, Session, Shared};
use crate::{backoff_delay, document_url, is_permanent_close, Status};

/// What a [`TokenProvider`] returns: a token, or why there is none (the client then retries
/// after its backoff).
pub type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;

/// Called before every connection attempt, the first included, for the token to connect with:
/// a page whose tokens expire hands the client a way to get fresh ones, and the client keeps
/// editing across expiries (the server closes an expired connection with 4401, the client
/// reconnects with a new token and resyncs; nothing typed meanwhile is lost).
#[derive(Clone)]
pub struct TokenProvider(Arc<dyn Fn() -> TokenFuture + Send + Sync>);

impl TokenProvider {
    pub fn new<F, Fut>(f: F) -> TokenProvider
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        TokenProvider(Arc::new(move || Box::pin(f())))
    }
}

impl std::fmt::Debug for TokenProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenProvider")
    }
}

/// Where and how to connect.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `ws://host:port` of the Quire server.
    pub server: String,
    pub document: String,
    /// The token to connect with; replaced by the provider's before each attempt if there is
    /// one.
    pub token: Option<String>,
    pub token_provider: Option<TokenProvider>,
    /// Fixed Yjs client id (tests); random when `None`.
    pub client_id: Option<ClientID>,
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// How often the awareness state is re-sent; a keep-alive goes with it.
    pub awareness_refresh: Duration,
    /// A connection from which nothing arrived for this long is dropped and reopened.
    pub idle_timeout: Duration,
    /// How long opening a connection may take before it counts as failed.
    pub connect_timeout: Duration,
}

impl ClientConfig {
    pub fn new(server: impl Into<String>, document: impl Into<String>) -> ClientConfig {
        ClientConfig {
            server: server.into(),
            document: document.into(),
            token: None,
            token_provider: None,
            client_id: None,
            min_backoff: crate::MIN_BACKOFF,
            max_backoff: crate::MAX_BACKOFF,
            awareness_refresh: crate::AWARENESS_REFRESH,
            idle_timeout: crate::IDLE_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Why the client stopped for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// WebSocket close code (4400-4499), or the HTTP status that refused the upgrade.
    pub code: u16,
    pub reason: String,
}

/// What the application sees of the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientState {
    pub status: Status,
    /// The handshake of the current connection finished: the document holds the server's state.
    pub synced: bool,
    /// Local changes the server has not confirmed as committed.
    pub unsaved: u64,
    /// Set when the client stopped for good.
    pub closed: Option<Closed>,
}

enum Command {
    Frame(Vec<u8>),
    Disconnect,
    Connect,
    Shutdown,
}

/// A connected (or reconnecting) document. Dropping it stops the connection task.
pub struct Client {
    shared: Arc<Shared>,
    doc: Doc,
    state: watch::Receiver<ClientState>,
    events: broadcast::Sender<Event>,
    commands: mpsc::UnboundedSender<Command>,
    task: Option<JoinHandle<()>>,
}

impl Client {
    /// Starts connecting in the background (needs a tokio runtime).
    pub fn connect(config: ClientConfig) -> Client {
        let mut options = Options::default();
        if let Some(id) = config.client_id {
            options.client_id = id;
        }
        let doc = Doc::with_options(options);
        let notify = Arc::new(Notify::new());
        let waker = notify.clone();
        let session = Session::new(
            doc.clone(),
            SystemClock,
            Some(Arc::new(move || waker.notify_one())),
        );
        let shared = session.shared().clone();
        let (state_tx, state) = watch::channel(ClientState {
            status: Status::Connecting,
            synced: false,
            unsaved: 0,
            closed: None,
        });
        let (events, _) = broadcast::channel(256);
        let (commands, rx) = mpsc::unbounded_channel();
        let driver = Driver {
            session,
            config,
            commands: rx,
            state: state_tx,
            events: events.clone(),
            notify,
        };
        let task = tokio::spawn(driver.run());
        Client {
            shared,
            doc,
            state,
            events,
            commands,
            task: Some(task),
        }
    }

    /// The document. Edit it with ordinary `yrs` transactions; changes are sent by themselves.
    pub fn doc(&self) -> &Doc {
        &self.doc
    }

    pub fn client_id(&self) -> ClientID {
        self.doc.client_id()
    }

    /// The current state. `synced` and `unsaved` are read from the session's counters, so a
    /// change made just now counts even before the connection task has seen it. Never waits
    /// for the document: safe to call from an observer or inside a transaction.
    pub fn state(&self) -> ClientState {
        let mut state = self.state.borrow().clone();
        state.synced = self.shared.synced();
        state.unsaved = self.shared.unsaved();
        state
    }

    pub fn watch_state(&self) -> watch::Receiver<ClientState> {
        self.state.clone()
    }

    /// Synced/awareness/permission events (awareness changes of peers in particular).
    pub fn events(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Waits until the state satisfies `done`.
    pub async fn wait_for(&self, done: impl Fn(&ClientState) -> bool) -> ClientState {
        let mut rx = self.state.clone();
        loop {
            rx.borrow_and_update();
            let state = self.state();
            if done(&state) {
                return state;
            }
            if rx.changed().await.is_err() {
                // The task ended: its last state is final.
                return self.state();
            }
        }
    }

    /// Waits until connected and synced; `Err` if the client stopped for good first.
    pub async fn synced(&self) -> Result<(), Closed> {
        let state = self
            .wait_for(|s| s.synced || s.status == Status::Closed)
            .await;
        stopped(state, |s| s.synced)
    }

    /// Waits until connected, synced and every local change is committed on the server;
    /// `Err` if the client stopped for good with changes unsaved.
    pub async fn saved(&self) -> Result<(), Closed> {
        let state = self
            .wait_for(|s| (s.synced && s.unsaved == 0) || s.status == Status::Closed)
            .await;
        stopped(state, |s| s.unsaved == 0)
    }

    /// Sets this client's awareness state (any JSON value); `None` clears it.
    pub fn set_local_state(&self, state: Option<serde_json::Value>) {
        let (frame, event) = self.shared.set_local_state(state.map(|s| s.to_string()));
        let _ = self.events.send(event);
        if let Some(frame) = frame {
            let _ = self.commands.send(Command::Frame(frame));
        }
    }

    /// Every known awareness state, this client's included (entries that are not JSON are
    /// skipped).
    pub fn states(&self) -> Vec<(ClientID, serde_json::Value)> {
        self.shared
            .states()
            .into_iter()
            .filter_map(|(id, json)| Some((id, serde_json::from_str(&json).ok()?)))
            .collect()
    }

    /// Goes offline on purpose; edits keep working and are sent after [`Client::reconnect`].
    pub fn disconnect(&self) {
        let _ = self.commands.send(Command::Disconnect);
    }

    pub fn reconnect(&self) {
        let _ = self.commands.send(Command::Connect);
    }

    /// Sends pending changes, clears the awareness state, closes the connection (1000) and
    /// waits for the task.
    pub async fn close(mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

/// `Ok` if `done` holds, else why the client stopped.
fn stopped(state: ClientState, done: impl Fn(&ClientState) -> bool) -> Result<(), Closed> {
    if done(&state) {
        return Ok(());
    }
    Err(state.closed.unwrap_or(Closed {
        code: 1000,
        reason: "client closed".into(),
    }))
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// How one connection ended.
enum End {
    /// Dropped or closed with a transient code: reconnect. `synced` says whether it had
    /// finished the handshake (then the backoff starts over).
    Dropped {
        synced: bool,
    },
    Permanent(Closed),
    Disconnect,
    Shutdown,
}

struct Driver {
    session: Session,
    config: ClientConfig,
    commands: mpsc::UnboundedReceiver<Command>,
    state: watch::Sender<ClientState>,
    events: broadcast::Sender<Event>,
    notify: Arc<Notify>,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

impl Driver {
    async fn run(mut self) {
        let mut attempt = 0u32;
        let mut online = true;
        loop {
            if online {
                self.publish(Some(Status::Connecting), None);
                let end = match self.open().await {
                    Ok(socket) => {
                        self.publish(Some(Status::Connected), None);
                        self.connection(socket).await
                    }
                    Err(end) => end,
                };
                let events = self.session.disconnected();
                self.emit(events);
                match end {
                    End::Dropped { synced } => {
                        if synced {
                            attempt = 0;
                        }
                    }
                    End::Permanent(closed) => {
                        self.publish(Some(Status::Closed), Some(closed));
                        return;
                    }
                    End::Disconnect => online = false,
                    End::Shutdown => {
                        self.publish(Some(Status::Closed), None);
                        return;
                    }
                }
                self.publish(Some(Status::Offline), None);
            }
            // Offline: wait for the backoff (or a command), keeping the state current.
            let delay = backoff_delay(
                attempt,
                self.config.min_backoff,
                self.config.max_backoff,
                fastrand::f64(),
            );
            attempt = attempt.saturating_add(1);
            let sleep = tokio::time::sleep(delay);
            tokio::pin!(sleep);
            loop {
                tokio::select! {
                    _ = &mut sleep, if online => break,
                    _ = self.notify.notified() => self.publish(None, None),
                    cmd = self.commands.recv() => match cmd {
                        Some(Command::Connect) => { online = true; attempt = 0; break }
                        Some(Command::Disconnect) => online = false,
                        // Awareness waits for the next handshake, which sends it.
                        Some(Command::Frame(_)) => {}
                        Some(Command::Shutdown) | None => {
                            self.publish(Some(Status::Closed), None);
                            return;
                        }
                    },
                }
            }
        }
    }

    async fn open(&mut self) -> Result<Socket, End> {
        if let Some(provider) = self.config.token_provider.clone() {
            match tokio::time::timeout(self.config.connect_timeout, (provider.0)()).await {
                Ok(Ok(token)) => self.config.token = Some(token),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "the token provider failed; retrying later");
                    return Err(End::Dropped { synced: false });
                }
                Err(_) => {
                    tracing::debug!("the token provider did not answer; retrying later");
                    return Err(End::Dropped { synced: false });
                }
            }
        }
        let url = document_url(
            &self.config.server,
            &self.config.document,
            self.config.token.as_deref(),
        );
        let connecting = tokio::time::timeout(
            self.config.connect_timeout,
            tokio_tungstenite::connect_async(url),
        );
        tokio::pin!(connecting);
        let result = loop {
            tokio::select! {
                result = &mut connecting => break result,
                // Commands are not held up by a slow connect.
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Shutdown) | None => return Err(End::Shutdown),
                    Some(Command::Disconnect) => return Err(End::Disconnect),
                    // Awareness goes out with the handshake.
                    Some(Command::Frame(_)) | Some(Command::Connect) => {}
                },
                _ = self.notify.notified() => self.publish(None, None),
            }
        };
        match result {
            Ok(Ok((socket, _))) => Ok(socket),
            Ok(Err(WsError::Http(response))) => {
                let code = response.status().as_u16();
                let reason = response
                    .body()
                    .as_ref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default();
                tracing::debug!(code, %reason, "upgrade refused");
                // 400 (bad name), 401, 403: retrying unchanged cannot succeed.
                if (400..500).contains(&code) && code != 408 && code != 429 {
                    Err(End::Permanent(Closed { code, reason }))
                } else {
                    Err(End::Dropped { synced: false })
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "connect failed");
                Err(End::Dropped { synced: false })
            }
            Err(_) => Err(End::Dropped { synced: false }),
        }
    }

    async fn connection(&mut self, socket: Socket) -> End {
        let (mut sink, mut stream) = socket.split();
        let first = self.session.connected();
        for frame in first {
            if sink.send(WsMessage::binary(frame)).await.is_err() {
                return End::Dropped { synced: false };
            }
        }
        let mut refresh = tokio::time::interval(self.config.awareness_refresh);
        refresh.reset();
        let mut heard = Instant::now();
        loop {
            let synced = self.session.synced();
            let frames: Vec<Vec<u8>> = tokio::select! {
                msg = stream.next() => match msg {
                    Some(Ok(WsMessage::Binary(data))) => {
                        heard = Instant::now();
                        let received = self.session.receive(&data);
                        match received {
                            Ok((replies, events)) => {
                                self.emit(events);
                                replies
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "closing the connection");
                                let _ = sink.send(close(CloseCode::Invalid, &e.to_string())).await;
                                return End::Dropped { synced };
                            }
                        }
                    }
                    Some(Ok(WsMessage::Close(frame))) => {
                        let (code, reason) = frame
                            .map(|f| (u16::from(f.code), f.reason.to_string()))
                            .unwrap_or((1005, String::new()));
                        tracing::debug!(code, %reason, "server closed the connection");
                        return if is_permanent_close(code) {
                            End::Permanent(Closed { code, reason })
                        } else {
                            End::Dropped { synced }
                        };
                    }
                    Some(Ok(_)) => {
                        heard = Instant::now(); // pings, pongs
                        Vec::new()
                    }
                    Some(Err(_)) | None => return End::Dropped { synced },
                },
                _ = self.notify.notified() => self.session.outgoing(),
                cmd = self.commands.recv() => match cmd {
                    Some(Command::Frame(frame)) => vec![frame],
                    Some(Command::Connect) => Vec::new(),
                    Some(Command::Disconnect) => {
                        let _ = sink.send(close(CloseCode::Normal, "disconnect")).await;
                        return End::Disconnect;
                    }
                    Some(Command::Shutdown) | None => {
                        // Changes made just before closing still go out.
                        let mut last = self.session.outgoing();
                        last.extend(self.session.set_local_state(None).0);
                        for frame in last {
                            let _ = sink.feed(WsMessage::binary(frame)).await;
                        }
                        let _ = sink.send(close(CloseCode::Normal, "client closed")).await;
                        return End::Shutdown;
                    }
                },
                _ = refresh.tick() => {
                    if heard.elapsed() >= self.config.idle_timeout {
                        tracing::debug!("nothing heard from the server: reconnecting");
                        return End::Dropped { synced };
                    }
                    // The keep-alive's echo proves the connection still works.
                    let mut frames: Vec<Vec<u8>> = self.session.refresh_awareness().into_iter().collect();
                    frames.extend(self.session.keepalive());
                    frames
                }
            };
            for frame in frames {
                if sink.feed(WsMessage::binary(frame)).await.is_err() {
                    return End::Dropped { synced };
                }
            }
            // Local changes made while handling this step go out in the same burst.
            let more = self.session.outgoing();
            for frame in more {
                if sink.feed(WsMessage::binary(frame)).await.is_err() {
                    return End::Dropped { synced };
                }
            }
            if sink.flush().await.is_err() {
                return End::Dropped { synced };
            }
            self.publish(None, None);
        }
    }

    fn emit(&self, events: Vec<Event>) {
        for event in events {
            let _ = self.events.send(event);
        }
    }

    fn publish(&self, status: Option<Status>, closed: Option<Closed>) {
        let (synced, unsaved) = (self.session.synced(), self.session.unsaved());
        self.state.send_if_modified(|s| {
            let next = ClientState {
                status: status.unwrap_or(s.status),
                synced,
                unsaved,
                closed: closed.clone().or_else(|| s.closed.clone()),
            };
            let changed = *s != next;
            *s = next;
            changed
        });
    }
}

fn close(code: CloseCode, reason: &str) -> WsMessage {
    WsMessage::Close(Some(CloseFrame {
        code,
        reason: reason.to_owned().into(),
    }))
}
