//! The WebSocket transport both protocols share: frames out (a long message sent in
//! fragments), a socket seen as one sink-and-stream, when the client was last heard from, the
//! close handshake, and the settings every client socket gets.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use prometheus::IntGauge;
use tokio::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
pub(crate) use tokio_tungstenite::tungstenite::{Error as WsError, Message as WsMessage};

use crate::close;
use crate::config::Limits;
use crate::room::CloseReason;

/// Bytes of frames collected before a write, if the burst does not end first.
pub(crate) const WRITE_BUFFER: usize = 64 * 1024;

/// The WebSocket settings of a client connection (either protocol).
pub(crate) fn socket_config(limits: &Limits) -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(limits.max_message_size))
        .max_frame_size(Some(limits.max_message_size))
        // tungstenite reads in 128 KiB chunks by default, allocated up front: per idle
        // connection that was most of its memory. Small reads cost more syscalls on large
        // messages only (8,192 for a 1 MiB initial sync at 128 bytes), which are rare.
        .read_buffer_size(limits.ws_read_buffer)
        // Frames collect in the write buffer until the connection flushes its burst (or the
        // buffer reaches this size), so a burst leaves in one write.
        .write_buffer_size(WRITE_BUFFER)
}

/// How long a close frame may take to leave before the socket is dropped.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest WebSocket frame sent: a longer message (a whole document's Sync Step 2) leaves as
/// fragments, each a slice of the one buffer the room shares among its peers. tungstenite
/// copies a message whole into the connection's write buffer, which keeps that capacity
/// afterwards, and moves what is left of it forward after every partial write: 150 clients
/// opening a 20 MB document held 150 copies (3 GB) and spent most of their CPU moving them.
pub(crate) const FRAGMENT_BYTES: usize = 64 * 1024;

/// A sink that sends binary messages longer than [`FRAGMENT_BYTES`] as a fragmented message
/// (a Binary frame, then Continuation frames, the last one final); nothing else is sent
/// between the fragments of one message.
pub(crate) struct Fragmenting<S> {
    inner: S,
    /// The message being fragmented and how much of it has been sent (boxed: an idle
    /// connection keeps 8 bytes for it, not 40).
    rest: Option<Box<(Bytes, usize)>>,
}

impl<S: futures_util::Sink<WsMessage> + Unpin> Fragmenting<S> {
    pub(crate) fn new(inner: S) -> Fragmenting<S> {
        Fragmenting { inner, rest: None }
    }

    /// Hands the pending fragments to the inner sink, as far as it takes them.
    fn poll_fragments(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while let Some(rest) = &mut self.rest {
            let (message, at) = &mut **rest;
            ready!(Pin::new(&mut self.inner).poll_ready(cx))?;
            let end = (*at + FRAGMENT_BYTES).min(message.len());
            let opcode = if *at == 0 {
                OpCode::Data(Data::Binary)
            } else {
                OpCode::Data(Data::Continue)
            };
            let last = end == message.len();
            let frame = Frame::message(message.slice(*at..end), opcode, last);
            *at = end;
            if last {
                self.rest = None;
            }
            Pin::new(&mut self.inner).start_send(WsMessage::Frame(frame))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: futures_util::Sink<WsMessage> + Unpin> futures_util::Sink<WsMessage> for Fragmenting<S> {
    type Error = S::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: WsMessage) -> Result<(), S::Error> {
        let this = self.get_mut();
        match item {
            WsMessage::Binary(message) if message.len() > FRAGMENT_BYTES => {
                // poll_ready returned Ready, so no earlier message is still pending.
                this.rest = Some(Box::new((message, 0)));
                Ok(())
            }
            other => Pin::new(&mut this.inner).start_send(other),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        let this = self.get_mut();
        ready!(this.poll_fragments(cx))?;
        Pin::new(&mut this.inner).poll_close(cx)
    }
}

/// Reads pass through untouched.
impl<S: futures_util::Stream + Unpin> futures_util::Stream for Fragmenting<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.get_mut().inner).poll_next(cx)
    }
}

/// One client's messages both ways: a WebSocket (unsplit), or a sink and a stream joined by
/// [`Pair`].
pub(crate) trait Duplex:
    futures_util::Sink<WsMessage>
    + futures_util::Stream<Item = Result<WsMessage, WsError>>
    + Unpin
    + Send
{
}

impl<T> Duplex for T where
    T: futures_util::Sink<WsMessage>
        + futures_util::Stream<Item = Result<WsMessage, WsError>>
        + Unpin
        + Send
{
}

/// A sink and a stream as one [`Duplex`] (a relayed Hocuspocus document's channels).
pub(crate) struct Pair<S, R> {
    pub(crate) sink: S,
    pub(crate) stream: R,
}

impl<S: futures_util::Sink<WsMessage> + Unpin, R: Unpin> futures_util::Sink<WsMessage>
    for Pair<S, R>
{
    type Error = S::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut self.get_mut().sink).poll_ready(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: WsMessage) -> Result<(), S::Error> {
        Pin::new(&mut self.get_mut().sink).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut self.get_mut().sink).poll_flush(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        Pin::new(&mut self.get_mut().sink).poll_close(cx)
    }
}

impl<S: Unpin, R: futures_util::Stream + Unpin> futures_util::Stream for Pair<S, R> {
    type Item = R::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<R::Item>> {
        Pin::new(&mut self.get_mut().stream).poll_next(cx)
    }
}

/// Counts an open connection in the metrics for as long as it lives (a connection's future
/// dropped at shutdown included).
pub(crate) struct Counted(IntGauge);

impl Counted {
    pub(crate) fn new(gauge: &IntGauge) -> Counted {
        gauge.inc();
        Counted(gauge.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// When a connection's client was last heard from, marked by its reading side and read by its
/// writing side (one future, or a relay's two halves): milliseconds since the connection opened (an atomic, not an `Instant` behind a lock).
pub(crate) struct LastSeen {
    pub(crate) opened: Instant,
    at_ms: AtomicU64,
}

impl LastSeen {
    pub(crate) fn new() -> LastSeen {
        LastSeen {
            opened: Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }

    pub(crate) fn mark(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.at_ms.store(now, Ordering::Relaxed);
    }

    pub(crate) fn last(&self) -> Instant {
        self.opened + Duration::from_millis(self.at_ms.load(Ordering::Relaxed))
    }
}

/// The close handshake: send ours, then read until the client's Close (or the timeout) so
/// the client sees our code instead of a reset connection. `None`: the client closed. A
/// client closed for not reading (1013) gets `slow` (`slow_close_timeout`) for it: it may be
/// slow rather than gone.
pub(crate) async fn finish<T: Duplex>(
    mut conn: T,
    outcome: Option<CloseReason>,
    slow: Duration,
) -> CloseReason {
    match outcome {
        Some(reason) => {
            let frame = WsMessage::Close(Some(CloseFrame {
                code: reason.code.into(),
                reason: reason.reason.to_string().into(),
            }));
            let patience = if reason.code == close::TRY_AGAIN_LATER {
                slow
            } else {
                CLOSE_TIMEOUT
            };
            let _ = tokio::time::timeout(patience, async {
                if conn.send(frame).await.is_ok() {
                    while let Some(Ok(msg)) = conn.next().await {
                        if matches!(msg, WsMessage::Close(_)) {
                            break;
                        }
                    }
                }
                let _ = conn.close().await;
            })
            .await;
            reason
        }
        None => CloseReason::new(1000, "closed by peer"),
    }
}

/// Whether a read failed on a message or frame over the configured bounds.
pub(crate) fn is_too_big(e: &WsError) -> bool {
    matches!(e, WsError::Capacity(_))
}

/// Close reasons must fit a control frame (123 bytes).
pub(crate) fn truncate(mut s: String) -> String {
    if s.len() > 120 {
        let mut cut = 120;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
