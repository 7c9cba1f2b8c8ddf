//! The HTTP API as the tests call it: a secured server's keys, tokens, and small helpers.

use quire_server::auth::{Auth, Permission};
use reqwest::StatusCode;
use serde_json::{json, Value};

use super::*;

pub const KEY: &str = "k1:test-secret-0123456789";
pub const ADMIN: &str = "admin-key-for-tests";

pub fn api(server: &TestServer, path: &str) -> String {
    server.http(&format!("/api/v1{path}"))
}

pub fn secured(dir: &std::path::Path) -> quire_server::config::Config {
    let mut cfg = test_config(dir);
    cfg.auth_keys = vec![KEY.into()];
    cfg.admin_key = Some(ADMIN.into());
    cfg
}

/// A token signed with the test key, as the server would issue it.
pub fn token(user: &str, doc: &str, perm: Permission) -> String {
    let auth = Auth::new(&[KEY.into()], None).expect("key");
    auth.issue(user, doc, perm, 3600, quire_server::auth::now_secs())
        .expect("issue")
        .0
}

pub async fn create(http: &reqwest::Client, server: &TestServer, name: &str) -> Value {
    let resp = http
        .post(api(server, "/docs"))
        .json(&json!({ "name": name, "title": "t" }))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status(), StatusCode::CREATED);
    resp.json().await.expect("json")
}

pub async fn problem_type(resp: reqwest::Response) -> String {
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json")
    );
    let body: Value = resp.json().await.expect("json");
    body["type"].as_str().unwrap_or("").to_owned()
}

pub fn urlencode(s: &str) -> String {
    s.replace('+', "%2B")
        .replace('/', "%2F")
        .replace('=', "%3D")
}

pub trait SvBytes {
    fn encode_v1_bytes(&self) -> Vec<u8>;
}
impl SvBytes for yrs::StateVector {
    fn encode_v1_bytes(&self) -> Vec<u8> {
        use yrs::updates::encoder::Encode;
        self.encode_v1()
    }
}
