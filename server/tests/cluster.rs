//! Several `quire` processes on one PostgreSQL database: one owner per document, enforced by
//! room leases whose epochs fence the storage. These tests always run on PostgreSQL (several
//! nodes need it), whichever backend the rest of the suite uses.

mod common;

use std::time::Duration;

use common::*;

/// A pool on the cluster's database.
async fn pg_pool(url: &str) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect")
}

/// The fencing case from the shared-state literature, made to happen on purpose. Node A owns
/// the document; A is paused (SIGSTOP) and its lease runs out (the test moves its expiry into
/// the past instead of waiting); node B takes the document over under a new epoch and writes;
/// A resumes (SIGCONT) and writes under its old epoch. The storage refuses that write, A gives
/// the room up (its client is closed with 1012 and reconnects through B), and the log holds
/// every acknowledged update exactly once.
#[tokio::test]
async fn a_paused_owner_that_resumes_is_fenced_by_the_storage_and_gives_the_room_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg_database_url(dir.path());
    // A long lease: A's own renewal is not due when it resumes, so what stops A is the
    // storage refusing its write.
    let a = ServerProcess::start_url(&url, &["--node-id", "node-a", "--lease-ttl", "60s"]).await;
    let b = ServerProcess::start_url(&url, &["--node-id", "node-b", "--lease-ttl", "60s"]).await;

    let mut on_a = Client::connect(&a.url("fenced"), 1).await;
    on_a.insert(0, "a1 ").await;
    on_a.durable_ack(1).await;

    // While A holds the lease, B refuses the document instead of serving a second copy.
    let mut turned_away = Client::connect_unsynced(&b.url("fenced"), 2).await;
    assert_eq!(turned_away.wait_closed().await, Some(1013));

    let pool = pg_pool(&url).await;
    let (owner, epoch_a): (String, i64) =
        sqlx::query_as("SELECT l.owner, l.epoch FROM room_leases l JOIN documents d ON d.id = l.doc_id WHERE d.name = 'fenced'")
            .fetch_one(&pool)
            .await
            .expect("lease row");
    assert_eq!(owner, "node-a");

    // A is paused past its lease.
    a.signal("STOP");
    sqlx::query("UPDATE room_leases SET expires_at = 0")
        .execute(&pool)
        .await
        .expect("expire");

    // B takes over under a new epoch, sees what A committed, and writes.
    let mut on_b = Client::connect(&b.url("fenced"), 3).await;
    assert_eq!(on_b.text(), "a1 ");
    on_b.insert(3, "b2 ").await;
    on_b.durable_ack(2).await;
    let (owner, epoch_b): (String, i64) =
        sqlx::query_as("SELECT l.owner, l.epoch FROM room_leases l JOIN documents d ON d.id = l.doc_id WHERE d.name = 'fenced'")
            .fetch_one(&pool)
            .await
            .expect("lease row");
    assert_eq!((owner.as_str(), epoch_b), ("node-b", epoch_a + 1));

    // A resumes and its client's next update reaches A's room, which appends under epoch_a.
    a.signal("CONT");
    on_a.insert(0, "a3 ").await;
    assert_eq!(
        on_a.wait_closed().await,
        Some(1012),
        "the stale owner gives the room up and tells its clients to reconnect"
    );
    assert_eq!(a.metric("quire_fenced_writes_total").await, 1.0);
    assert_eq!(a.metric("quire_lease_losses_total").await, 1.0);

    // The log holds A's write from before the pause and B's, nothing under the stale epoch.
    let rows: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM doc_updates u JOIN documents d ON d.id = u.doc_id WHERE d.name = 'fenced'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(rows, 2);

    // A's client reconnects through B with the edit the stale owner could not commit; it is
    // committed once, and everyone converges.
    let mut back = Client::connect_with_doc(&b.url("fenced"), on_a.doc.clone()).await;
    back.sync().await;
    back.durable_ack(3).await;
    let expected = back.text();
    assert!(expected.contains("a1 ") && expected.contains("b2 ") && expected.contains("a3 "));
    assert!(
        on_b.pump_until(PATIENCE, |c| c.text() == expected).await,
        "B's client converges"
    );
    let rows: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM doc_updates u JOIN documents d ON d.id = u.doc_id WHERE d.name = 'fenced'",
    )
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(rows, 3, "every acknowledged update exactly once");
    pool.close().await;
    a.signal("TERM");
    b.signal("TERM");
}

/// An owner whose renewal is refused (another node was granted the document: the test plays
/// that node by moving the lease row on) gives the room up within a renewal period, without
/// having to attempt a write, and closes its clients with 1012.
#[tokio::test]
async fn an_owner_whose_renewal_is_refused_gives_the_room_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg_database_url(dir.path());
    let a = ServerProcess::start_url(&url, &["--node-id", "node-a", "--lease-ttl", "600ms"]).await;
    let mut on_a = Client::connect(&a.url("renewed"), 1).await;
    on_a.insert(0, "x").await;
    on_a.durable_ack(1).await;
    // Renewals keep the lease while nothing else happens.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(a.metric("quire_lease_losses_total").await, 0.0);
    let pool = pg_pool(&url).await;
    sqlx::query(
        "UPDATE room_leases SET owner = 'node-z', epoch = epoch + 1, \
         expires_at = (extract(epoch from clock_timestamp()) * 1000)::bigint + 600000",
    )
    .execute(&pool)
    .await
    .expect("take over");
    assert_eq!(on_a.wait_closed().await, Some(1012));
    assert_eq!(a.metric("quire_lease_losses_total").await, 1.0);
    assert_eq!(a.metric("quire_fenced_writes_total").await, 0.0);
    pool.close().await;
    a.signal("TERM");
}

/// A graceful shutdown releases the leases at once: another node serves the document
/// immediately instead of after the lease time.
#[tokio::test]
async fn a_graceful_shutdown_hands_documents_over_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = pg_database_url(dir.path());
    let mut a =
        ServerProcess::start_url(&url, &["--node-id", "node-a", "--lease-ttl", "60s"]).await;
    let b = ServerProcess::start_url(&url, &["--node-id", "node-b", "--lease-ttl", "60s"]).await;
    let mut on_a = Client::connect(&a.url("handover"), 1).await;
    on_a.insert(0, "kept").await;
    on_a.durable_ack(1).await;
    a.signal("TERM");
    assert_eq!(on_a.wait_closed().await, Some(1001));
    let status = tokio::time::timeout(PATIENCE, a.child.wait())
        .await
        .expect("exits")
        .expect("status");
    assert!(status.success());
    // With a 60 s lease, only the release lets B in now.
    let on_b = tokio::time::timeout(
        Duration::from_secs(5),
        Client::connect(&b.url("handover"), 2),
    )
    .await
    .expect("B serves the document at once");
    assert_eq!(on_b.text(), "kept");
    b.signal("TERM");
}
