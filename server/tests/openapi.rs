//! The OpenAPI document against real responses: schemathesis (from PyPI, `pip install -r
//! tests/requirements.txt`) generates requests from `/api/v1/openapi.json` and checks that every
//! response has a documented status, content type, headers and body schema, and that none is a
//! server error. Without schemathesis this test fails (it is never skipped).

mod common;

use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_responses_conform_to_the_openapi_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = TestServer::start(test_config(dir.path())).await;
    let (status, body) = http_get(server.addr, "/api/v1/openapi.json").await;
    assert_eq!(status, 200);
    let doc: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/api/v1/docs/{name}"]["patch"].is_object());

    let seed = seed();
    let out = tokio::time::timeout(
        Duration::from_secs(300),
        tokio::process::Command::new("st")
            .arg("run")
            .arg(server.http("/api/v1/openapi.json"))
            .args(["--url", &server.http("")])
            .args([
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_schema_conformance,response_headers_conformance",
            ])
            .args(["--phases", "examples,coverage,fuzzing,stateful"])
            .args(["--max-examples", "25", "--workers", "1"])
            .args(["--seed", &seed.to_string()])
            // A health check of the generator, not of the server: with some seeds (seed
            // 3654517536643646335 did, for ten operations) hypothesis filters out most of what
            // it generates for an operation and stops with an error before any request is
            // wrong. Every check above still runs on every request it sends.
            .args(["--suppress-health-check", "filter_too_much"])
            .env("NO_COLOR", "1")
            // schemathesis keeps a cache in its working directory: not in the source tree.
            .current_dir(dir.path())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("schemathesis finishes")
    .unwrap_or_else(|e| {
        panic!("cannot run schemathesis (`pip install -r tests/requirements.txt`): {e}")
    });
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "schemathesis found failures (seed {seed})"
    );
    server.stop().await;
}
