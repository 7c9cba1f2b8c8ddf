//! Tokens and permissions: HS256 JWTs scoped to a user, a document pattern and a permission.
//!
//! - Signing uses the first configured key; verification accepts any configured key, chosen by
//!   the token's `kid` header (rotation: add the new key first, keep the old one until its
//!   tokens expire).
//! - A caller holding the server's admin key is an administrator.
//! - Revocations (by token id or by user) live in the database; [`Auth::apply_revocation`]
//!   records them in memory for fast checks, and the revocation watcher closes live sockets.
//! - With no key configured Quire runs in open development mode: every caller is the `dev`
//!   administrator.
//!
//! Every check takes `now` (seconds since the epoch) as a parameter, so tests control time.

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use crate::config::Secret;

/// The per-address limit on failed authentications (`limits::PerAddress`): `check` tells
/// whether `ip` may try now, `take` counts a failure; both answer how long to wait when not.
pub trait FailureLimit {
    fn check(&self, ip: std::net::IpAddr, now: tokio::time::Instant) -> Result<(), Duration>;
    fn take(&self, ip: std::net::IpAddr, now: tokio::time::Instant) -> Result<(), Duration>;
}

/// Why [`Auth::verify_from`] refused.
#[derive(Debug)]
pub enum VerifyError {
    /// The address failed too often lately: retry after this long.
    Limited(Duration),
    Invalid(AuthError),
}

/// The token of an `Authorization: Bearer` header.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<String> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}
use crate::storage::api::{Revocation, Role};

/// What a token allows on the documents it covers. Ordered: admin > write > read.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    Read,
    Write,
    Admin,
}

impl Permission {
    pub fn parse(s: &str) -> Option<Permission> {
        match s {
            "read" => Some(Permission::Read),
            "write" => Some(Permission::Write),
            "admin" => Some(Permission::Admin),
            _ => None,
        }
    }

    /// The most a document role allows.
    pub fn of_role(role: Role) -> Permission {
        match role {
            Role::Viewer => Permission::Read,
            Role::Editor => Permission::Write,
            Role::Owner => Permission::Admin,
        }
    }
}

/// The claims Quire puts in a token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// User id.
    pub sub: String,
    /// Document name, or a pattern ending in `*` (`team/*`, or `*` for every document).
    pub doc: String,
    pub perm: Permission,
    /// Expiry and issue time, seconds since the epoch.
    pub exp: i64,
    pub iat: i64,
    /// Token id, for revocation.
    pub jti: String,
}

/// Who is calling, once their credentials are checked. (Serialized only into a forwarded
/// request's envelope: the verified caller, in place of the credential.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    pub user: String,
    pub token_id: Option<String>,
    /// Issue time of the token (seconds); 0 for the admin key and open mode.
    pub issued_at: i64,
    pub doc_pattern: String,
    pub perm: Permission,
    /// When the credential stops being valid (seconds since the epoch); `None` for the admin
    /// key and open mode. A socket opened with it is closed then (4401).
    pub expires_at: Option<i64>,
}

impl Principal {
    /// The open-mode caller and the admin-key holder.
    pub fn admin(user: &str) -> Principal {
        Principal {
            user: user.to_owned(),
            token_id: None,
            issued_at: 0,
            doc_pattern: "*".to_owned(),
            perm: Permission::Admin,
            expires_at: None,
        }
    }

    /// The caller in open mode (no keys configured): everything is allowed, and what they
    /// write is attributed to `anonymous@ADDRESS` (the history's author), a stable id for a
    /// client that does not say who it is.
    pub fn open(ip: Option<std::net::IpAddr>) -> Principal {
        let user = match ip {
            Some(ip) => format!("anonymous@{ip}"),
            None => "anonymous".to_owned(),
        };
        Principal::admin(&user)
    }

    /// Who owns an idempotency key: token holders by user, the admin key and open mode apart
    /// from any token whose subject happens to share their name.
    pub fn scope(&self) -> String {
        match &self.token_id {
            Some(_) => format!("user:{}", self.user),
            None => format!("key:{}", self.user),
        }
    }

    pub fn covers(&self, doc: &str) -> bool {
        pattern_matches(&self.doc_pattern, doc)
    }

    /// Server-wide administration (admin routes, issuing tokens for anyone).
    pub fn is_admin(&self) -> bool {
        self.perm == Permission::Admin && self.doc_pattern == "*"
    }

    /// The permission on `doc`, capped by the user's role on it if they have one.
    pub fn permission_on(&self, doc: &str, role: Option<Role>) -> Option<Permission> {
        if !self.covers(doc) {
            return None;
        }
        Some(match role {
            Some(role) if !self.is_admin() => self.perm.min(Permission::of_role(role)),
            _ => self.perm,
        })
    }
}

/// `*` matches everything; `prefix*` matches names starting with `prefix`; otherwise exact.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("a token is required")]
    Missing,
    #[error("the token is malformed or its signature is invalid")]
    Invalid,
    #[error("the token is signed with an unknown key")]
    UnknownKey,
    #[error("the token has expired")]
    Expired,
    #[error("the token has been revoked")]
    Revoked,
    #[error("no signing key is configured")]
    NoSigningKey,
}

/// A verification key and its id.
#[derive(Clone)]
struct Key {
    id: String,
    secret: Vec<u8>,
}

#[derive(Default)]
struct Revoked {
    tokens: HashSet<String>,
    /// user -> revocation time (ms): their tokens issued up to then are void.
    users: HashMap<String, i64>,
}

pub struct Auth {
    keys: Vec<Key>,
    /// SHA-256 of the admin key: compared in constant time, and the same length as any
    /// candidate's digest, so neither the key's bytes nor its length leak through timing.
    admin_key: Option<[u8; 32]>,
    revoked: RwLock<Revoked>,
}

impl Auth {
    /// `keys` are `kid:secret` pairs, the first one signs.
    pub fn new(keys: &[Secret], admin_key: Option<Secret>) -> Result<Auth, String> {
        // An error names the key by its place in the list, never by any part of it: a key
        // written without its `kid:` would otherwise be printed whole.
        let keys = keys
            .iter()
            .enumerate()
            .map(|(i, k)| match k.expose().split_once(':') {
                Some((id, secret)) if !id.is_empty() && secret.len() >= 16 => Ok(Key {
                    id: id.to_owned(),
                    secret: secret.as_bytes().to_vec(),
                }),
                _ => Err(format!(
                    "auth key number {} must be `kid:secret` with a secret of at least 16 bytes",
                    i + 1
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Auth {
            keys,
            admin_key: admin_key
                .filter(|k| !k.expose().is_empty())
                .map(|k| digest(k.expose().as_bytes())),
            revoked: RwLock::new(Revoked::default()),
        })
    }

    /// Open development mode: no key configured, nothing is checked.
    pub fn is_open(&self) -> bool {
        self.keys.is_empty() && self.admin_key.is_none()
    }

    /// Signs a token.
    pub fn issue(
        &self,
        user: &str,
        doc: &str,
        perm: Permission,
        ttl_secs: i64,
        now: i64,
    ) -> Result<(String, Claims), AuthError> {
        let key = self.keys.first().ok_or(AuthError::NoSigningKey)?;
        let claims = Claims {
            sub: user.to_owned(),
            doc: doc.to_owned(),
            perm,
            exp: now + ttl_secs,
            iat: now,
            jti: uuid::Uuid::new_v4().to_string(),
        };
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(key.id.clone());
        let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(&key.secret))
            .map_err(|_| AuthError::Invalid)?;
        Ok((token, claims))
    }

    /// [`Auth::verify`] for a request from `ip`. An address that has failed too often lately
    /// (`failures`) is refused before its credential is even looked at, and every failure
    /// counts against it, so guessing keys or replaying stale tokens is slow.
    pub fn verify_from(
        &self,
        failures: &dyn FailureLimit,
        ip: Option<std::net::IpAddr>,
        credential: Option<&str>,
    ) -> Result<Principal, VerifyError> {
        let now = tokio::time::Instant::now();
        if let Some(ip) = ip {
            failures.check(ip, now).map_err(VerifyError::Limited)?;
        }
        let verified = credential
            .ok_or(AuthError::Missing)
            .and_then(|t| self.verify(t, now_secs()));
        verified.map_err(|e| {
            if let Some(ip) = ip {
                let _ = failures.take(ip, now);
            }
            VerifyError::Invalid(e)
        })
    }

    /// Checks a bearer credential: the admin key, or a token. `now` in seconds.
    pub fn verify(&self, credential: &str, now: i64) -> Result<Principal, AuthError> {
        if let Some(admin) = &self.admin_key {
            if constant_time_eq(admin, &digest(credential.as_bytes())) {
                return Ok(Principal::admin("admin"));
            }
        }
        let header = jsonwebtoken::decode_header(credential).map_err(|_| AuthError::Invalid)?;
        let key = match &header.kid {
            Some(kid) => self.keys.iter().find(|k| &k.id == kid),
            None => self.keys.first(),
        }
        .ok_or(AuthError::UnknownKey)?;
        let mut validation = Validation::new(Algorithm::HS256);
        // Expiry is checked below against the injected clock.
        validation.validate_exp = false;
        validation.required_spec_claims = ["exp", "sub"].iter().map(|s| s.to_string()).collect();
        let data = jsonwebtoken::decode::<Claims>(
            credential,
            &DecodingKey::from_secret(&key.secret),
            &validation,
        )
        .map_err(|_| AuthError::Invalid)?;
        let c = data.claims;
        if c.exp <= now {
            return Err(AuthError::Expired);
        }
        if self.is_revoked(&c.jti, &c.sub, c.iat) {
            return Err(AuthError::Revoked);
        }
        Ok(Principal {
            issued_at: c.iat,
            user: c.sub,
            token_id: Some(c.jti),
            doc_pattern: c.doc,
            perm: c.perm,
            expires_at: Some(c.exp),
        })
    }

    /// Whether a token (by id, or its user's tokens issued up to a user revocation) is revoked.
    /// A user revocation also voids tokens issued later within the same second (`iat` has
    /// second precision).
    pub fn is_revoked(&self, token_id: &str, user: &str, issued_at: i64) -> bool {
        let revoked = self.revoked.read().unwrap_or_else(|p| p.into_inner());
        revoked.tokens.contains(token_id)
            || revoked
                .users
                .get(user)
                .is_some_and(|at| issued_at * 1000 <= *at)
    }

    /// Records a revocation read from the database.
    pub fn apply_revocation(&self, r: &Revocation) {
        let mut revoked = self.revoked.write().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = &r.token_id {
            revoked.tokens.insert(t.clone());
        }
        if let Some(u) = &r.user_id {
            let at = revoked.users.entry(u.clone()).or_insert(r.revoked_at);
            *at = (*at).max(r.revoked_at);
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes).into()
}

/// Compares two digests without an early exit (both are always 32 bytes).
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    crate::storage::now_ms() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Auth {
        Auth::new(
            &[
                "new:0123456789abcdef-new".into(),
                "old:0123456789abcdef-old".into(),
            ],
            Some("the-admin-key".into()),
        )
        .expect("keys")
    }

    #[test]
    fn tokens_verify_expire_and_rotate() {
        let a = auth();
        let (t, claims) = a
            .issue("ann", "team/*", Permission::Write, 60, 1000)
            .expect("issue");
        let p = a.verify(&t, 1010).expect("valid");
        assert_eq!(p.user, "ann");
        assert_eq!(p.token_id.as_deref(), Some(claims.jti.as_str()));
        assert!(p.covers("team/plan") && !p.covers("other"));
        assert_eq!(a.verify(&t, 1060), Err(AuthError::Expired));
        // A token signed with the old key still verifies while the key is configured.
        let old_only = Auth::new(&["old:0123456789abcdef-old".into()], None).expect("keys");
        let (t_old, _) = old_only
            .issue("bo", "*", Permission::Read, 60, 1000)
            .expect("issue");
        assert!(a.verify(&t_old, 1001).is_ok());
        // ...and not once it is removed.
        let new_only = Auth::new(&["new:0123456789abcdef-new".into()], None).expect("keys");
        assert_eq!(new_only.verify(&t_old, 1001), Err(AuthError::UnknownKey));
        assert_eq!(a.verify("garbage", 1001), Err(AuthError::Invalid));
        assert!(a.verify("the-admin-key", 0).expect("admin").is_admin());
    }

    #[test]
    fn a_forged_token_is_refused() {
        let a = auth();
        let other = Auth::new(&["new:another-secret-entirely".into()], None).expect("keys");
        let (t, _) = other
            .issue("eve", "*", Permission::Admin, 60, 1000)
            .expect("issue");
        assert_eq!(a.verify(&t, 1001), Err(AuthError::Invalid));
    }

    #[test]
    fn revocations_by_token_and_by_user() {
        let a = auth();
        let (t1, c1) = a
            .issue("ann", "*", Permission::Write, 600, 1000)
            .expect("issue");
        let (t2, _) = a
            .issue("ann", "*", Permission::Write, 600, 1000)
            .expect("issue");
        a.apply_revocation(&Revocation {
            id: 1,
            token_id: Some(c1.jti),
            user_id: None,
            revoked_at: 1_001_000,
        });
        assert_eq!(a.verify(&t1, 1002), Err(AuthError::Revoked));
        assert!(a.verify(&t2, 1002).is_ok());
        a.apply_revocation(&Revocation {
            id: 2,
            token_id: None,
            user_id: Some("ann".into()),
            revoked_at: 1_001_000,
        });
        assert_eq!(a.verify(&t2, 1002), Err(AuthError::Revoked));
        // A token issued after the revocation works.
        let (t3, _) = a
            .issue("ann", "*", Permission::Write, 600, 1002)
            .expect("issue");
        assert!(a.verify(&t3, 1003).is_ok());
    }

    #[test]
    fn roles_cap_token_permissions() {
        let p = Principal {
            user: "ann".into(),
            token_id: None,
            issued_at: 0,
            doc_pattern: "d*".into(),
            perm: Permission::Write,
            expires_at: None,
        };
        assert_eq!(p.permission_on("doc", None), Some(Permission::Write));
        assert_eq!(
            p.permission_on("doc", Some(Role::Viewer)),
            Some(Permission::Read)
        );
        assert_eq!(
            p.permission_on("doc", Some(Role::Owner)),
            Some(Permission::Write)
        );
        assert_eq!(p.permission_on("x", None), None);
    }
}
