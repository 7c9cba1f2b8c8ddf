//! The listener: accepts connections and serves HTTP/1 on each, with a header timeout and a
//! write deadline.

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Accepts connections and serves HTTP/1 on each until `shutdown`, then lets requests in
/// flight finish (upgraded WebSocket connections live on in their own tasks).
///
/// Hand-written rather than `axum::serve`, which sets no timer and so no timeout at all: a
/// client that opens a connection and sends its request headers slowly (or never) would hold
/// it forever. Here a client has `header_timeout` to send its request line and headers, on
/// each request of a keep-alive connection too; a WebSocket, once upgraded, is not limited.
/// Every accepted socket gets `TCP_NODELAY`: small frames (a one-character update is about
/// 20 bytes) leave at once, where Nagle's algorithm made a frame sent while the previous one
/// was unacknowledged wait for the client's delayed ACK (measured: about 13 ms on loopback
/// for one delivery in three when four clients type in one document). The client's address
/// reaches handlers as [`axum::extract::ConnectInfo`], for the per-address limits.
///
/// A write that makes no progress for `write_timeout` fails and closes its connection: an
/// answer the client never reads (a whole-document read with a zero receive window) holds
/// its bytes and its caller's slot that long at most, and a WebSocket whose client stopped
/// reading is closed as well (its room's queue bounds apply before that).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    header_timeout: std::time::Duration,
    write_timeout: std::time::Duration,
    shutdown: CancellationToken,
) {
    use hyper::server::conn::http1;
    use hyper_util::rt::{TokioIo, TokioTimer};
    use tower::ServiceExt;

    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors, say: wait a little instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        set_nodelay(&tcp);
        let (router, builder, shutdown) = (router.clone(), builder.clone(), shutdown.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |mut req: hyper::Request<_>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                router.clone().oneshot(req.map(axum::body::Body::new))
            });
            let mut io = tokio_io_timeout::TimeoutStream::new(tcp);
            io.set_write_timeout(Some(write_timeout));
            let conn = builder
                .serve_connection(TokioIo::new(Box::pin(io)), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                served = conn.as_mut() => {
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    return;
                }
                _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
}

fn set_nodelay(tcp: &TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
    }
}
