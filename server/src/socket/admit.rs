//! The checks made before a socket is upgraded, for both protocols: the per-address
//! connection limit, where a socket's credential is found, and what the verified principal
//! may do on a document (the credential itself is checked by `auth`, through
//! `App::verify`).

use axum::http::{header, HeaderMap, Uri};
use axum::response::Response;

use crate::app::AppState;
use crate::auth::{Permission, Principal};
use crate::problem::{too_many, ApiError};
use crate::room::{DocName, PeerAuth};

/// The per-address limit on new connections (`connections_per_minute_per_addr`): 429 when
/// `ip` opened too many lately.
pub(crate) fn admit_address(
    app: &AppState,
    ip: Option<std::net::IpAddr>,
) -> Result<(), Box<Response>> {
    let Some(ip) = ip else { return Ok(()) };
    match app
        .address_limits
        .connections
        .take(ip, tokio::time::Instant::now())
    {
        Ok(()) => Ok(()),
        Err(wait) => {
            app.metrics.addr_limited.inc();
            Err(Box::new(too_many(
                "too-many-connections",
                "too many new connections from this address; retry later",
                wait,
            )))
        }
    }
}

/// A WebSocket client's token: `?token=`, `Authorization: Bearer`, or an entry of the
/// `Sec-WebSocket-Protocol` list (browsers cannot set headers; offer `["quire", token]`).
pub(crate) fn socket_token(uri: &Uri, headers: &HeaderMap) -> Option<(String, bool)> {
    if let Some(query) = uri.query() {
        for pair in query.split('&') {
            if let Some(v) = pair.strip_prefix("token=") {
                let v = percent_encoding::percent_decode_str(v).decode_utf8().ok()?;
                return Some((v.into_owned(), false));
            }
        }
    }
    if let Some(t) = crate::auth::bearer(headers) {
        return Some((t, false));
    }
    let protocols = headers.get(header::SEC_WEBSOCKET_PROTOCOL)?.to_str().ok()?;
    protocols
        .split(',')
        .map(str::trim)
        .find(|p| p.matches('.').count() == 2)
        .map(|p| (p.to_owned(), true))
}

/// What `principal` may do on document `name` over a socket: read at least, or 403.
pub(crate) async fn socket_permission(
    app: &AppState,
    principal: &Principal,
    name: &DocName,
) -> Result<PeerAuth, ApiError> {
    // Read before the role: a role change with this id or older is in what is read next.
    let seen_change = app.api.last_doc_change().await?;
    let existing = app.api.get_doc_by_name(name.as_str()).await?;
    let role = match &existing {
        Some(doc) => app.api.get_role(doc.id, &principal.user).await?,
        None => None,
    };
    let perm = principal
        .permission_on(name.as_str(), role)
        .ok_or_else(|| ApiError::forbidden("the token does not cover this document"))?;
    // Opening an unknown name creates the document: that takes write permission.
    if existing.is_none() && perm < Permission::Write {
        return Err(ApiError::not_found("document"));
    }
    // The profile's name and colour go into the identity stamped on the peer's presence.
    let profile = app
        .api
        .get_user(&principal.user)
        .await?
        .map(|p| (p.display_name.into(), p.color.into()));
    Ok(PeerAuth {
        user: Some(principal.user.as_str().into()),
        token_id: principal.token_id.as_deref().map(Into::into),
        issued_at: principal.issued_at,
        can_write: perm >= Permission::Write,
        expires_at: principal.expires_at,
        seen_change,
        hocuspocus: false,
        profile,
    })
}
