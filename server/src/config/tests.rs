use super::*;

#[test]
fn higher_layer_wins_and_defaults_fill_the_rest() {
    let file = Settings::from_toml(
        r#"
        bind = "127.0.0.1:9000"
        ping_interval = "5s"
        snapshot_updates = 10
        sqlite_commit_delay = "3ms"
        postgres_commit_siblings = 4
        "#,
    )
    .expect("valid toml");
    let mut flags = Settings::default();
    flags.server.bind = Some("127.0.0.1:9100".parse().expect("addr"));
    let cfg = flags.or(file).resolve();
    assert_eq!(cfg.bind.port(), 9100);
    assert_eq!(cfg.room.ping_interval, Duration::from_secs(5));
    assert_eq!(cfg.room.snapshot_updates, 10);
    assert_eq!(cfg.idle_timeout, Duration::from_secs(90));
    assert_eq!(cfg.sqlite_synchronous, SqliteSync::Full);
    assert_eq!(cfg.sqlite_commit.delay, Duration::from_millis(3));
    assert_eq!(cfg.sqlite_commit.siblings, 8);
    assert_eq!(cfg.postgres_commit.delay, Duration::from_millis(10));
    assert_eq!(cfg.postgres_commit.siblings, 4);
}

#[test]
fn secrets_never_show_in_debug_output() {
    let file = Settings::from_toml(
        r#"
        database_url = "postgres://quire:hunter2pw@db/quire"
        auth_keys = ["k1:0123456789abcdefSECRET"]
        admin_key = "ADMINKEY-0123456789"
        webhook_secret = "WEBHOOKSECRET"
        bus_url = "nats://quire:NATSPASSWORD@nats:4222"
        "#,
    )
    .expect("valid toml");
    let shown = format!("{file:?} {:?}", file.clone().resolve());
    for secret in [
        "hunter2pw",
        "SECRET",
        "ADMINKEY",
        "WEBHOOKSECRET",
        "NATSPASSWORD",
    ] {
        assert!(!shown.contains(secret), "{secret} leaked into {shown}");
    }
    assert!(shown.contains("[redacted]"));
    let cfg = file.resolve();
    assert_eq!(
        cfg.admin_key.as_ref().map(Secret::expose),
        Some("ADMINKEY-0123456789")
    );
}

#[test]
fn unknown_keys_in_the_file_are_rejected() {
    assert!(Settings::from_toml("bindd = \"x\"").is_err());
}
