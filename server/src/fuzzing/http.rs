//! The HTTP harness: the API router with the state `run_with_stores` builds, on an in-memory
//! SQLite database, fed one request at a time ([`HttpHarness`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use bytes::Bytes;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::app::AppState;
use crate::auth::{Auth, Permission};
use crate::config::Secret;
use crate::limits;
use crate::room::Registry;

use super::{
    clear_history, fuzz_config, record, registry, runtime, stop, HTTP_REQUESTS_PER_DB, PATIENCE,
};

/// Credentials the HTTP harness sends.
const ADMIN_KEY: &str = "fuzz-admin-key-0123456789";
const SIGNING_KEY: &str = "fuzz:0123456789abcdef0123456789abcdef";

/// The routes [`HttpHarness::request`] picks from with the first byte of an input (`route %
/// ROUTES.len()`). Every route that takes a request body is here.
pub const ROUTES: [&str; 7] = [
    "POST /api/v1/docs",
    "PATCH /api/v1/docs/{name}",
    "PUT /api/v1/docs/{name}/access/{user}",
    "PATCH /api/v1/users/{id}",
    "POST /api/v1/tokens",
    "POST /api/v1/tokens/revoke",
    "POST /api/v1/docs/{name}/update",
];

/// Set once a 503 was reported, so a run prints it once.
static REPORTED_503: AtomicBool = AtomicBool::new(false);

/// The real router (`http::router`) over the state `run_with_stores` builds, on an in-memory
/// SQLite database, with a signing key and an admin key configured.
pub struct HttpHarness {
    rt: Runtime,
    api: Option<ApiState>,
}

struct ApiState {
    router: axum::Router,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
    /// A document created at the start, the target of the `{id}` routes.
    /// The name of the document the routes with a `{name}` address.
    doc_name: String,
    /// Bearer credentials: the admin key, a writer token and a viewer token for `fuzz*`.
    credentials: [String; 3],
    requests: u32,
}

/// A response, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub body: Bytes,
}

impl Default for HttpHarness {
    fn default() -> Self {
        HttpHarness::new()
    }
}

impl HttpHarness {
    pub fn new() -> HttpHarness {
        HttpHarness {
            rt: runtime(),
            api: None,
        }
    }

    /// Sends `body` to the route `selector % ROUTES.len()`; the higher part of `selector`
    /// picks the variant: which credential (admin key, writer token, viewer token), whether an
    /// `Idempotency-Key` is sent, and for the PATCH routes which `If-Match` (the current
    /// version, none, or a stale one). Checks, and panics if any fails:
    /// - no status 5xx but 503 (the only server error a request may cause on purpose; an
    ///   in-memory database should never give it, so the first one is printed);
    /// - an error is `application/problem+json` whose `status` is the response's;
    /// - a success has a JSON body (`POST /docs`: a document that reads back with its name).
    pub fn request(&mut self, selector: u8, body: &[u8]) -> StatusCode {
        if self.api.is_none() {
            self.api = Some(self.rt.block_on(ApiState::open()));
        }
        let Some(api) = self.api.as_mut() else {
            unreachable!("opened above")
        };
        record(&[&[selector][..], body].concat());
        let status = self.rt.block_on(api.request(selector, body));
        api.requests += 1;
        if api.requests >= HTTP_REQUESTS_PER_DB {
            self.reset();
        }
        status
    }

    /// Starts the next request on a fresh database.
    pub fn reset(&mut self) {
        if let Some(api) = self.api.take() {
            stop(&self.rt, &api.registry, &api.shutdown);
        }
        clear_history();
    }
}

impl Drop for HttpHarness {
    fn drop(&mut self) {
        self.reset();
    }
}

impl ApiState {
    async fn open() -> ApiState {
        let mut config = fuzz_config();
        config.auth_keys = vec![Secret::from(SIGNING_KEY)];
        config.admin_key = Some(Secret::from(ADMIN_KEY));
        let stores = crate::open_stores(&config)
            .await
            .unwrap_or_else(|e| panic!("cannot open the in-memory database: {e}"));
        let auth = Auth::new(&config.auth_keys, config.admin_key.clone())
            .unwrap_or_else(|e| panic!("fuzz keys are valid: {e}"));
        let shutdown = CancellationToken::new();
        let registry = registry(&config, &stores, &shutdown);
        let now = crate::auth::now_secs();
        let token = |user: &str, perm: Permission| {
            auth.issue(user, "fuzz*", perm, 24 * 3600, now)
                .map(|(token, _)| token)
                .unwrap_or_else(|e| panic!("cannot issue a token: {e}"))
        };
        let credentials = [
            ADMIN_KEY.to_owned(),
            token("fuzz-writer", Permission::Write),
            token("fuzz-viewer", Permission::Read),
        ];
        let app = AppState::new(crate::app::App {
            hooks: Default::default(),
            admin: Arc::new(crate::admin::Admin::new(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(3600),
            )),
            relay_leases: Arc::default(),
            address_limits: Arc::new(limits::AddressLimits::new(&config.limits)),
            gate: crate::gate::Gate::new(config.gate, registry.metrics.clone()),
            forward_guard: Arc::default(),
            bus: None,
            store: stores.docs.clone(),
            api: stores.api.clone(),
            auth: Arc::new(auth),
            registry: registry.clone(),
            metrics: registry.metrics.clone(),
            connections: TaskTracker::new(),
            config: Arc::new(config),
        });
        let mut api = ApiState {
            router: crate::http::router(app),
            registry,
            shutdown,
            doc_name: String::new(),
            credentials,
            requests: 0,
        };
        let created = api
            .send(
                Method::POST,
                "/api/v1/docs".to_owned(),
                0,
                Some("application/json"),
                None,
                None,
                Bytes::from_static(br#"{"name":"fuzz-doc","title":"fuzzed"}"#),
            )
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "creating the document");
        let meta: serde_json::Value = serde_json::from_slice(&created.body)
            .unwrap_or_else(|e| panic!("the created document is not JSON: {e}"));
        api.doc_name = meta["name"]
            .as_str()
            .unwrap_or_else(|| panic!("the created document has no name: {meta}"))
            .to_owned();
        // The admin's profile, the target of `PATCH /users/{id}`.
        let me = api
            .send(
                Method::GET,
                "/api/v1/me".to_owned(),
                0,
                None,
                None,
                None,
                Bytes::new(),
            )
            .await;
        assert_eq!(me.status, StatusCode::OK, "reading the admin's profile");
        api
    }

    #[allow(clippy::too_many_arguments)] // one request's parts, named at each call
    async fn send(
        &self,
        method: Method,
        uri: String,
        credential: usize,
        content_type: Option<&str>,
        if_match: Option<&str>,
        idempotency_key: Option<&str>,
        body: Bytes,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri).header(
            header::AUTHORIZATION,
            format!("Bearer {}", self.credentials[credential]),
        );
        if let Some(ct) = content_type {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        if let Some(v) = if_match {
            req = req.header(header::IF_MATCH, v);
        }
        if let Some(k) = idempotency_key {
            req = req.header("idempotency-key", k);
        }
        let req = req
            .body(Body::from(body))
            .unwrap_or_else(|e| panic!("the harness built an invalid request: {e}"));
        let served = tokio::time::timeout(PATIENCE, async {
            let resp = match self.router.clone().oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            let status = resp.status();
            let content_type = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap_or_else(|e| panic!("cannot read a response body: {e}"));
            Answer {
                status,
                content_type,
                body,
            }
        })
        .await;
        served.unwrap_or_else(|_| panic!("no response within {PATIENCE:?}"))
    }

    /// The current ETag of `uri` (read as the admin), if it reads.
    async fn etag(&self, uri: &str) -> Option<String> {
        let req = Request::builder()
            .method(Method::GET)
            .uri(uri)
            .header(header::AUTHORIZATION, format!("Bearer {ADMIN_KEY}"))
            .body(Body::empty())
            .ok()?;
        let resp = tokio::time::timeout(PATIENCE, self.router.clone().oneshot(req))
            .await
            .unwrap_or_else(|_| panic!("no response to GET {uri} within {PATIENCE:?}"))
            .unwrap_or_else(|never| match never {});
        check_status(resp.status(), &format!("GET {uri}"), b"");
        resp.headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    }

    async fn request(&self, selector: u8, body: &[u8]) -> StatusCode {
        let route = usize::from(selector) % ROUTES.len();
        let variant = usize::from(selector) / ROUTES.len();
        let credential = variant % 3;
        let idempotency_key = (variant / 3 % 2 == 1).then(|| format!("fuzz-key-{route}"));
        let if_match_mode = variant / 6 % 3;
        let id = crate::http::doc_path(&self.doc_name);
        let (method, uri, content_type) = match route {
            0 => (Method::POST, "/api/v1/docs".to_owned(), "application/json"),
            1 => (
                Method::PATCH,
                format!("/api/v1/docs/{id}"),
                "application/json",
            ),
            2 => (
                Method::PUT,
                format!("/api/v1/docs/{id}/access/fuzz-user"),
                "application/json",
            ),
            3 => (
                Method::PATCH,
                "/api/v1/users/admin".to_owned(),
                "application/json",
            ),
            4 => (
                Method::POST,
                "/api/v1/tokens".to_owned(),
                "application/json",
            ),
            5 => (
                Method::POST,
                "/api/v1/tokens/revoke".to_owned(),
                "application/json",
            ),
            _ => (
                Method::POST,
                format!("/api/v1/docs/{id}/update"),
                "application/octet-stream",
            ),
        };
        let if_match = if method == Method::PATCH {
            match if_match_mode {
                0 => self.etag(&uri).await,
                1 => None,
                _ => Some("\"0\"".to_owned()),
            }
        } else {
            None
        };
        let body = Bytes::copy_from_slice(body);
        let answer = self
            .send(
                method.clone(),
                uri.clone(),
                credential,
                Some(content_type),
                if_match.as_deref(),
                idempotency_key.as_deref(),
                body.clone(),
            )
            .await;
        let what = format!("{method} {uri}");
        check_status(answer.status, &what, &body);
        check_answer(&answer, &what, &body);
        if route == 0 && answer.status == StatusCode::CREATED {
            self.check_created(&answer, &body).await;
        }
        answer.status
    }

    /// A created document reads back, under the name the request gave.
    async fn check_created(&self, answer: &Answer, request: &[u8]) {
        let meta: serde_json::Value = serde_json::from_slice(&answer.body)
            .unwrap_or_else(|e| panic!("201 without a JSON body: {e}"));
        let id = meta["name"]
            .as_str()
            .map(crate::http::doc_path)
            .unwrap_or_else(|| panic!("201 without a name: {meta}"));
        let read = self
            .send(
                Method::GET,
                format!("/api/v1/docs/{id}"),
                0,
                None,
                None,
                None,
                Bytes::new(),
            )
            .await;
        assert_eq!(
            read.status,
            StatusCode::OK,
            "a created document does not read back: {}",
            String::from_utf8_lossy(&read.body)
        );
        let read: serde_json::Value = serde_json::from_slice(&read.body)
            .unwrap_or_else(|e| panic!("GET /docs/{id} is not JSON: {e}"));
        let asked: Option<serde_json::Value> = serde_json::from_slice(request).ok();
        if let Some(name) = asked.as_ref().and_then(|a| a.get("name")) {
            assert_eq!(
                &read["name"], name,
                "the created document's name differs from the request's"
            );
        }
        assert_eq!(
            read["name"], meta["name"],
            "201 and GET disagree on the name"
        );
    }
}

/// No server error but 503, which is printed once (an in-memory database should not give it).
fn check_status(status: StatusCode, what: &str, body: &[u8]) {
    if status == StatusCode::SERVICE_UNAVAILABLE {
        if !REPORTED_503.swap(true, Ordering::Relaxed) {
            eprintln!(
                "note: {what} answered 503 (storage unavailable) for the body {:02x?}",
                body
            );
        }
        return;
    }
    assert!(
        !status.is_server_error(),
        "{what} answered {status} for the body {:02x?} ({:?})",
        body,
        String::from_utf8_lossy(body)
    );
}

/// Errors are problem+json with the response's status; successes are JSON.
fn check_answer(answer: &Answer, what: &str, request: &[u8]) {
    let json: Result<serde_json::Value, _> = serde_json::from_slice(&answer.body);
    let shown = || String::from_utf8_lossy(&answer.body).into_owned();
    if answer.status.is_client_error() || answer.status.is_server_error() {
        assert!(
            answer.content_type.starts_with("application/problem+json"),
            "{what} answered {} as {:?}, not problem+json, for the body {:02x?}: {}",
            answer.status,
            answer.content_type,
            request,
            shown()
        );
        let json = json.unwrap_or_else(|e| {
            panic!(
                "{what}: the problem body is not JSON ({e}) for the body {request:02x?}: {}",
                shown()
            )
        });
        assert_eq!(
            json["status"].as_u64(),
            Some(u64::from(answer.status.as_u16())),
            "{what}: the problem's status differs from the response's: {json}"
        );
    } else if answer.status != StatusCode::NO_CONTENT {
        assert!(
            json.is_ok(),
            "{what} answered {} with a body that is not JSON: {}",
            answer.status,
            shown()
        );
    }
}
