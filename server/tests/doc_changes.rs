//! The `doc_changes` rows every node reads to learn of deletes and role changes the bus may
//! have lost (`quire_server::changes`), on the database of the pass (SQLite or PostgreSQL):
//! written with the change, read back in order with the document's name, pruned by age.

mod common;

use common::*;
use quire_server::storage::api::Role;
use quire_server::storage::now_ms;

#[tokio::test]
async fn role_changes_and_deletes_are_read_back_in_order_and_pruned_by_age() {
    let dir = tempfile::tempdir().expect("tempdir");
    let api = open_test_stores(dir.path()).await.api;
    let start = api.last_doc_change().await.expect("last");
    let doc = api
        .create_doc("changing", "", None)
        .await
        .expect("create")
        .expect("created");

    let first = api
        .set_role(doc.id, "ann", Some(Role::Viewer))
        .await
        .expect("set");
    let second = api.set_role(doc.id, "ann", None).await.expect("remove");
    assert!(second > first && first > start, "{start} {first} {second}");
    api.delete_doc(doc.id).await.expect("delete");
    let last = api.last_doc_change().await.expect("last");
    assert!(last > second);

    let rows = api.doc_changes_after(start, 10).await.expect("read");
    let seen: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.id,
                r.doc_name.as_str(),
                r.kind.as_str(),
                r.user_id.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (first, "changing", "access", Some("ann")),
            (second, "changing", "access", Some("ann")),
            (last, "changing", "deleted", None),
        ]
    );
    assert_eq!(
        api.doc_changes_after(start, 2).await.expect("read").len(),
        2
    );
    assert!(api
        .doc_changes_after(last, 10)
        .await
        .expect("read")
        .is_empty());

    assert_eq!(
        api.doc_changes_cleanup(rows[0].changed_at)
            .await
            .expect("prune"),
        0
    );
    assert_eq!(
        api.doc_changes_cleanup(now_ms() + 1).await.expect("prune"),
        3
    );
    assert!(api
        .doc_changes_after(start, 10)
        .await
        .expect("read")
        .is_empty());
}
