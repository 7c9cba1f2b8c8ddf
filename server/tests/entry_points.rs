//! The entry-point table (`quire_server::entry_points`) covers every way in, and its
//! whole-document rows really pass the heavy-work gate:
//! - every route of the OpenAPI document (and the router's routes outside it), every message
//!   kind of both WebSocket protocols and every bus envelope kind has exactly one row, and no
//!   row names something that does not exist;
//! - every route of the OpenAPI document is mounted in the router;
//! - with the gate given no slot, every `PerDocument` route answers 503 with `Retry-After`
//!   while the other routes answer as usual;
//! - docs/security.md holds the table as `markdown()` renders it (`QUIRE_BLESS=1` rewrites it).

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use quire_server::entry_points::{Cost, Surface, ENTRY_POINTS};
use reqwest::StatusCode;
use serde_json::{json, Value};
use strum::IntoEnumIterator;

/// Routes the router serves outside the OpenAPI document.
const UNDOCUMENTED: &[&str] = &[
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "GET /admin",
    "GET /{web file}",
    "GET /hocuspocus",
    "GET /{document}",
    "GET /api/v1/admin/stream",
    "GET /api/v1/openapi.json",
];

fn rows(surface: Surface) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for e in ENTRY_POINTS.iter().filter(|e| e.surface == surface) {
        assert!(
            seen.insert(e.name.to_owned()),
            "{} has two rows in the table",
            e.name
        );
    }
    seen
}

fn names<T: Into<&'static str>>(kinds: impl Iterator<Item = T>) -> BTreeSet<String> {
    kinds.map(|k| k.into().to_owned()).collect()
}

/// The OpenAPI document the server serves.
async fn openapi(server: &TestServer) -> Value {
    reqwest::get(server.http("/api/v1/openapi.json"))
        .await
        .expect("openapi")
        .json()
        .await
        .expect("json")
}

#[tokio::test]
async fn every_route_message_and_envelope_has_one_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let openapi = openapi(&server).await;
    let mut routes: BTreeSet<String> = UNDOCUMENTED.iter().map(|r| r.to_string()).collect();
    for (path, item) in openapi["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            routes.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    assert_eq!(
        rows(Surface::Http),
        routes,
        "HTTP routes and the table's rows"
    );
    assert_eq!(
        rows(Surface::YWebsocket),
        names(quire_server::protocol::MessageKind::iter()),
        "y-websocket message kinds and the table's rows"
    );
    assert_eq!(
        rows(Surface::Hocuspocus),
        names(quire_server::protocol::hocuspocus::HpMessageKind::iter()),
        "Hocuspocus message kinds and the table's rows"
    );
    assert_eq!(
        rows(Surface::Bus),
        names(quire_server::bus::Kind::iter()),
        "bus envelope kinds and the table's rows"
    );
    server.stop().await;
}

/// Every route of the OpenAPI document (so every row of the table) is mounted: sent to the
/// server, none reaches the router's fallback for unknown routes or methods. (A path mistyped
/// where the routes are listed answers "no such API route" while the OpenAPI document, from
/// the handlers' attributes, still names the route.)
#[tokio::test]
async fn every_documented_route_is_mounted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let openapi = openapi(&server).await;
    let http = reqwest::Client::new();
    let mut tried = 0;
    for (path, item) in openapi["paths"].as_object().expect("paths") {
        let concrete = path
            .replace("{name}", "mounted")
            .replace("{id}", "1")
            .replace("{user}", "ann");
        for method in item.as_object().expect("path item").keys() {
            let method: reqwest::Method = method.to_uppercase().parse().expect("method");
            let mut request = http.request(method.clone(), server.http(&concrete));
            if matches!(
                method,
                reqwest::Method::POST | reqwest::Method::PUT | reqwest::Method::PATCH
            ) {
                request = request.json(&json!({}));
            }
            let response = request.send().await.expect("send");
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            assert!(
                !body.contains("no such API route") && !body.contains("does not take that method"),
                "{method} {path} is in the OpenAPI document but not mounted: {status} {body}"
            );
            tried += 1;
        }
    }
    assert!(tried > 25, "only {tried} routes tried");
    server.stop().await;
}

#[test]
fn the_threat_model_in_docs_security_md_is_the_table() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md");
    let text = std::fs::read_to_string(&path).expect("docs/security.md");
    let (begin, end) = ("<!-- entry-points:begin -->\n", "<!-- entry-points:end -->");
    let start = text.find(begin).expect("the begin marker") + begin.len();
    let stop = text.find(end).expect("the end marker");
    let table = quire_server::entry_points::markdown();
    if std::env::var_os("QUIRE_BLESS").is_some() {
        let new = format!("{}{table}{}", &text[..start], &text[stop..]);
        std::fs::write(&path, new).expect("write docs/security.md");
        return;
    }
    assert!(
        text[start..stop] == table,
        "docs/security.md's entry-point table differs from the code's: run \
         QUIRE_BLESS=1 cargo test -p quire-server --test entry_points"
    );
}

/// The requests that exercise a whole-document route (each of its ways to be heavy).
fn heavy_requests(route: &str, version: i64) -> Vec<(reqwest::Method, String, Option<Value>)> {
    let (method, path) = route.split_once(' ').expect("METHOD /path");
    let path = path
        .replace("{name}", "big")
        .replace("{id}", &version.to_string());
    let requests = match (method, path.as_str()) {
        ("GET", p) if p.ends_with("/diff") => vec![(format!("{p}?from={version}"), None)],
        ("GET", p) if p.ends_with("/json") && !p.contains("/versions/") => {
            vec![(p.to_owned(), None), (format!("{p}?at_position=1"), None)]
        }
        // The state vector of a client that has seen nothing of client 5.
        ("GET", p) if p.ends_with("/update") => {
            vec![(p.to_owned(), None), (format!("{p}?sv=AQEA"), None)]
        }
        ("POST", p) if p.ends_with("/fork") => {
            vec![(p.to_owned(), Some(json!({"name": "copy"})))]
        }
        ("POST", p) if p.ends_with("/branches") => {
            vec![(p.to_owned(), Some(json!({"name": "a-branch"})))]
        }
        ("POST", p) if p.ends_with("/edits") => {
            vec![(
                p.to_owned(),
                Some(json!({"ops": [{"text": "text", "insert": "x"}]})),
            )]
        }
        ("POST", p) if p.ends_with("/versions") => {
            vec![(p.to_owned(), Some(json!({"label": "named"})))]
        }
        (_, p) => vec![(p.to_owned(), None)],
    };
    requests
        .into_iter()
        .map(|(path, body)| (method.parse().expect("method"), path, body))
        .collect()
}

#[tokio::test]
async fn with_no_heavy_slot_every_whole_document_route_is_refused_and_the_rest_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = secured(dir.path());
    cfg.gate.per_node = 0;
    cfg.gate.queue = 0;
    cfg.room.history.version_idle = Duration::from_millis(100);
    let server = TestServer::start(cfg).await;
    let http = reqwest::Client::new();
    // Content and an automatic version (the room records it, not a request).
    let resp = http
        .post(api(&server, "/docs"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "big"}))
        .send()
        .await
        .expect("create");
    assert_eq!(resp.status(), StatusCode::CREATED);
    let doc = yrs::Doc::with_client_id(5);
    let update = {
        use yrs::{Text, Transact};
        let text = doc.get_or_insert_text("text");
        let mut txn = doc.transact_mut();
        text.insert(&mut txn, 0, "whole");
        txn.encode_update_v1()
    };
    let resp = http
        .post(api(&server, "/docs/big/update"))
        .bearer_auth(ADMIN)
        .body(update)
        .send()
        .await
        .expect("post update");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut version = None;
    for _ in 0..200 {
        let list: Value = http
            .get(api(&server, "/docs/big/versions"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("versions")
            .json()
            .await
            .expect("json");
        version = list[0]["id"].as_i64();
        if version.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let version = version.expect("an automatic version");

    let heavy: Vec<_> = ENTRY_POINTS
        .iter()
        .filter(|e| e.surface == Surface::Http && e.cost == Cost::PerDocument)
        .collect();
    assert!(heavy.len() >= 7, "the whole-document routes: {heavy:?}");
    for (_, (method, path, body)) in heavy.iter().flat_map(|e| {
        heavy_requests(e.name, version)
            .into_iter()
            .map(move |r| (e, r))
    }) {
        let mut req = http
            .request(method.clone(), server.http(&path))
            .bearer_auth(ADMIN);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("request");
        assert_eq!(
            resp.status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {path} did not pass the gate"
        );
        assert!(resp.headers().contains_key("retry-after"), "{path}");
        assert!(problem_type(resp).await.ends_with("/server-busy"), "{path}");
    }
    // The other reads of the same document answer.
    for path in ["/docs/big", "/docs/big/versions", "/docs/big/history"] {
        let resp = http
            .get(api(&server, path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("get");
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
    }
    assert!(
        server
            .metric("quire_heavy_refused_total{why=\"node\"}")
            .await
            >= 9.0
    );
    server.stop().await;
}
