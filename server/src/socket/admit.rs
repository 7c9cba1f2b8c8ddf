//! The checks made before a socket is upgraded, for both protocols: the per-address
//! connection limit, the credential (with the per-address failure limit), and what the
//! verified principal may do on a document.

use axum::http::{header, HeaderMap, Uri};
use axum::response::{IntoResponse, Response};

use crate::app::AppState;
use crate::auth::{AuthError, Permission, Principal};
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

/// Verifies a bearer credential for a request from `ip`. An address that has failed too
/// often lately is refused (429) before its credential is even looked at, and every failure
/// counts against it, so guessing keys or replaying stale tokens is slow.
pub(crate) fn verify_from(
    app: &AppState,
    ip: Option<std::net::IpAddr>,
    credential: Option<&str>,
) -> Result<Principal, Box<Response>> {
    verify_credential(app, ip, credential).map_err(|e| {
        Box::new(match e {
            VerifyError::Limited(wait) => too_many(
                "too-many-failed-logins",
                "too many failed authentications from this address; retry later",
                wait,
            ),
            VerifyError::Invalid(e) => ApiError::unauthorized(e).into_response(),
        })
    })
}

/// Why [`verify_credential`] refused.
pub(crate) enum VerifyError {
    /// The address failed too often lately: retry after this long.
    Limited(std::time::Duration),
    Invalid(AuthError),
}

/// [`verify_from`] for callers that answer in their own protocol (the Hocuspocus endpoint's
/// Auth messages): the same per-address failure limit and the same count of failures.
pub(crate) fn verify_credential(
    app: &AppState,
    ip: Option<std::net::IpAddr>,
    credential: Option<&str>,
) -> Result<Principal, VerifyError> {
    let now = tokio::time::Instant::now();
    let failures = &app.address_limits.auth_failures;
    if let Some(ip) = ip {
        if let Err(wait) = failures.check(ip, now) {
            app.metrics.addr_limited.inc();
            return Err(VerifyError::Limited(wait));
        }
    }
    let verified = credential
        .ok_or(AuthError::Missing)
        .and_then(|t| app.auth.verify(t, crate::auth::now_secs()));
    verified.map_err(|e| {
        if let Some(ip) = ip {
            let _ = failures.take(ip, now);
        }
        VerifyError::Invalid(e)
    })
}

pub(crate) fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
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
    if let Some(t) = bearer(headers) {
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
