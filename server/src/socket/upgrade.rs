//! The WebSocket upgrade (RFC 6455, HTTP/1.1), done here instead of by axum's
//! `WebSocketUpgrade` so that a connection is tokio-tungstenite's own stream. axum's `Message`
//! has no raw frames; with tungstenite's, a large message (a whole document's Sync Step 2)
//! leaves as fragments of one shared buffer ([`super::transport::Fragmenting`]) instead of being
//! copied whole into every connection's write buffer.
//!
//! A refused upgrade gets a problem+json body: 405 for a method other than GET, 426 when the
//! request does not ask for a WebSocket (or its connection cannot be upgraded), 400 for a
//! missing key or a WebSocket version other than 13.

use std::future::Future;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;
use tracing::debug;

use crate::problem::problem;

/// An upgraded connection.
pub type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// A request to upgrade to a WebSocket, checked; [`WsUpgrade::on_upgrade`] answers it.
pub struct WsUpgrade {
    key: HeaderValue,
    on_upgrade: OnUpgrade,
    requested_protocols: Option<HeaderValue>,
    protocol: Option<HeaderValue>,
    config: WebSocketConfig,
}

/// Why an upgrade was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpgradeRejection {
    pub status: StatusCode,
    pub kind: &'static str,
    pub detail: &'static str,
}

impl IntoResponse for UpgradeRejection {
    fn into_response(self) -> Response {
        let mut resp = problem(self.status, self.kind, self.detail);
        if self.status == StatusCode::UPGRADE_REQUIRED {
            resp.headers_mut()
                .insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        }
        resp
    }
}

const NOT_A_WEBSOCKET: UpgradeRejection = UpgradeRejection {
    status: StatusCode::UPGRADE_REQUIRED,
    kind: "websocket-required",
    detail: "this path opens a document over a WebSocket: send Connection: Upgrade and \
             Upgrade: websocket",
};

/// Whether a comma-separated header of `headers` lists `token` (case-insensitive).
fn lists(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// Checks the request's upgrade headers and takes its connection's upgrade.
pub fn check(parts: &mut Parts) -> Result<WsUpgrade, UpgradeRejection> {
    if parts.method != Method::GET {
        return Err(UpgradeRejection {
            status: StatusCode::METHOD_NOT_ALLOWED,
            kind: "method-not-allowed",
            detail: "a WebSocket upgrade is a GET request",
        });
    }
    let headers = &parts.headers;
    if !lists(headers, header::CONNECTION, "upgrade")
        || !lists(headers, header::UPGRADE, "websocket")
    {
        return Err(NOT_A_WEBSOCKET);
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(UpgradeRejection {
            status: StatusCode::BAD_REQUEST,
            kind: "unsupported-websocket-version",
            detail: "only WebSocket version 13 is supported (Sec-WebSocket-Version: 13)",
        });
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return Err(UpgradeRejection {
            status: StatusCode::BAD_REQUEST,
            kind: "missing-websocket-key",
            detail: "the upgrade has no Sec-WebSocket-Key header",
        });
    };
    let requested_protocols = headers.get(header::SEC_WEBSOCKET_PROTOCOL).cloned();
    let Some(on_upgrade) = parts.extensions.remove::<OnUpgrade>() else {
        return Err(UpgradeRejection {
            detail: "this connection cannot be upgraded (HTTP/1.1 is required)",
            ..NOT_A_WEBSOCKET
        });
    };
    Ok(WsUpgrade {
        key,
        on_upgrade,
        requested_protocols,
        protocol: None,
        config: WebSocketConfig::default(),
    })
}

impl<S: Send + Sync> FromRequestParts<S> for WsUpgrade {
    type Rejection = UpgradeRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        check(parts)
    }
}

impl WsUpgrade {
    /// Selects `protocol` (answered in `Sec-WebSocket-Protocol`) if the client offered it.
    pub fn protocol(mut self, protocol: &'static str) -> WsUpgrade {
        let offered = self
            .requested_protocols
            .as_ref()
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|p| p.trim() == protocol));
        if offered {
            self.protocol = Some(HeaderValue::from_static(protocol));
        }
        self
    }

    /// The connection's settings (message and frame bounds, buffer sizes).
    pub fn config(mut self, config: WebSocketConfig) -> WsUpgrade {
        self.config = config;
        self
    }

    /// The 101 response; once it is sent and the connection upgraded, `callback` runs on the
    /// socket in a task of its own.
    pub fn on_upgrade<C, Fut>(self, callback: C) -> Response
    where
        C: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let WsUpgrade {
            key,
            on_upgrade,
            protocol,
            config,
            ..
        } = self;
        // The upgrade's steps are boxed, with what they need: the task keeps its captures
        // for the connection's whole life, and the connection's future is all it should hold.
        let setup = Box::new((on_upgrade, config, callback));
        tokio::spawn(async move {
            let Some((socket, callback)) = Box::pin(upgrade(setup)).await else {
                return;
            };
            callback(socket).await;
        });
        let mut resp = Response::new(axum::body::Body::empty());
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let headers = resp.headers_mut();
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(accept) = HeaderValue::from_str(&derive_accept_key(key.as_bytes())) {
            headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if let Some(protocol) = protocol {
            headers.insert(header::SEC_WEBSOCKET_PROTOCOL, protocol);
        }
        resp
    }
}

/// Waits for the connection's upgrade and makes it a WebSocket.
async fn upgrade<C>(setup: Box<(OnUpgrade, WebSocketConfig, C)>) -> Option<(Socket, C)> {
    let (on_upgrade, config, callback) = *setup;
    let upgraded = match on_upgrade.await {
        Ok(upgraded) => upgraded,
        Err(e) => {
            debug!(error = %e, "the upgrade did not complete");
            return None;
        }
    };
    let socket =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
    Some((socket, callback))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(req: axum::http::request::Builder) -> Parts {
        req.body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn upgrade_request() -> axum::http::request::Builder {
        axum::http::Request::get("/doc")
            .header(header::CONNECTION, "keep-alive, Upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
    }

    #[test]
    fn requests_that_are_not_upgrades_are_refused_with_the_reason() {
        let post = axum::http::Request::post("/doc")
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket");
        assert_eq!(
            check(&mut parts(post)).err().map(|r| r.status),
            Some(StatusCode::METHOD_NOT_ALLOWED)
        );
        let plain = axum::http::Request::get("/doc");
        assert_eq!(check(&mut parts(plain)).err(), Some(NOT_A_WEBSOCKET));
        let mut old = parts(upgrade_request());
        old.headers
            .insert(header::SEC_WEBSOCKET_VERSION, HeaderValue::from_static("8"));
        assert_eq!(
            check(&mut old).err().map(|r| r.kind),
            Some("unsupported-websocket-version")
        );
        let mut keyless = parts(upgrade_request());
        keyless.headers.remove(header::SEC_WEBSOCKET_KEY);
        assert_eq!(
            check(&mut keyless).err().map(|r| r.kind),
            Some("missing-websocket-key")
        );
        // A well-formed upgrade on a connection that cannot be upgraded (no hyper upgrade).
        let rejection = check(&mut parts(upgrade_request())).err();
        assert_eq!(
            rejection.map(|r| r.status),
            Some(StatusCode::UPGRADE_REQUIRED)
        );
        let resp = NOT_A_WEBSOCKET.into_response();
        assert_eq!(
            resp.headers().get(header::UPGRADE).map(|v| v.as_bytes()),
            Some(&b"websocket"[..])
        );
    }
}
