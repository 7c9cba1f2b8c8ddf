//! `quire serve` serves the built web editor to plain GET requests while every WebSocket
//! upgrade still opens the document its path names.

mod common;

use common::*;

#[tokio::test]
async fn plain_gets_serve_the_web_root_and_upgrades_open_documents() {
    let dir = tempfile::tempdir().expect("tempdir");
    let web = dir.path().join("web");
    std::fs::create_dir_all(web.join("assets")).expect("mkdir");
    std::fs::write(web.join("index.html"), "<title>editor</title>").expect("write");
    std::fs::write(web.join("assets/app.js"), "console.log(1)").expect("write");
    let mut cfg = test_config(dir.path());
    cfg.web_root = Some(web.clone());
    let server = TestServer::start(cfg).await;

    let (status, body) = http_get(server.addr, "/").await;
    assert_eq!((status, body.as_str()), (200, "<title>editor</title>"));
    let js = reqwest::get(server.http("/assets/app.js"))
        .await
        .expect("get");
    assert_eq!(js.status(), 200);
    let content_type = js.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .to_owned();
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );

    // The same path as a WebSocket is a document: edits there are stored under that name.
    let mut a = Client::connect(&server.url("assets/app.js"), 1).await;
    a.insert(0, "doc").await;
    a.durable_ack(1).await;
    assert_eq!(log_rows(dir.path(), "assets/app.js").await, 1);

    // A path with no file is answered as a document request: bad names still get 400.
    let long = format!("/{}", "x".repeat(300));
    for path in ["/bad%0Aname", long.as_str()] {
        let (status, body) = http_get(server.addr, path).await;
        assert_eq!(status, 400, "{path}");
        assert!(body.contains("invalid-document-name"), "{body}");
    }
    // Nothing outside the web root is served, however the path is spelt.
    std::fs::write(dir.path().join("secret.txt"), "do not serve").expect("write");
    for path in [
        "/..%2Fsecret.txt",
        "/%2E%2E/secret.txt",
        "/assets/..%2F..%2Fsecret.txt",
    ] {
        let (status, body) = http_get(server.addr, path).await;
        assert_ne!(status, 200, "{path}");
        assert!(!body.contains("do not serve"), "{path}: {body}");
    }
    // The API and health routes are unaffected.
    assert_eq!(http_get(server.addr, "/healthz").await.0, 200);
    server.stop().await;

    // Without a built editor, / says how to build one.
    let mut cfg = test_config(dir.path());
    cfg.web_root = Some(dir.path().join("nothing-here"));
    let server = TestServer::start(cfg).await;
    let (status, body) = http_get(server.addr, "/").await;
    assert_eq!(status, 404);
    assert!(body.contains("web/build.sh"), "{body}");
    server.stop().await;
}
