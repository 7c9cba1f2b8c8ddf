//! Rows behind the HTTP API: document metadata, profiles, access, idempotency keys,
//! revocations and the webhook outbox, and the [`ApiStore`] trait that reads and writes them.
//!
//! Every versioned write is one conditional statement (`UPDATE ... WHERE id = ? AND version = ?`)
//! whose row count decides the outcome; events are inserted into the outbox in the same
//! transaction as the change they describe.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::{DocId, StorageError};

/// (Defined beside `DocStore`: the branch rows use it too, without importing this file.)
pub use super::DocMeta;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct UserProfile {
    pub id: String,
    pub display_name: String,
    pub color: String,
    pub avatar_url: String,
    pub version: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Fields a `PATCH /docs/{id}` may change.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DocPatch {
    pub title: Option<String>,
    pub owner: Option<String>,
}

/// Fields a `PATCH /users/{id}` may change.
#[derive(Debug, Clone, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    pub display_name: Option<String>,
    pub color: Option<String>,
    pub avatar_url: Option<String>,
}

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Editor,
    Owner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Editor => "editor",
            Role::Owner => "owner",
        }
    }
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "viewer" => Some(Role::Viewer),
            "editor" => Some(Role::Editor),
            "owner" => Some(Role::Owner),
            _ => None,
        }
    }
}

/// Outcome of a versioned write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Versioned<T> {
    Updated(T),
    /// The version did not match; here is the current row.
    Stale(T),
    NotFound,
}

/// Result of claiming an idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdemClaim {
    /// First use: run the request, then `idem_finish`.
    Started,
    /// Already answered: replay this.
    Replay(StoredResponse),
    /// Same key, different request.
    Mismatch,
    /// The first request with this key is still running.
    InProgress,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    /// Headers replayed with the body, as (name, value).
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A change live sockets on every node must see, from `doc_changes` (see `crate::changes`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct DocChange {
    pub id: i64,
    pub doc_name: String,
    /// `deleted` or `access`.
    pub kind: String,
    /// Whose role changed (`access` only).
    pub user_id: Option<String>,
    pub changed_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Revocation {
    pub id: i64,
    pub token_id: Option<String>,
    pub user_id: Option<String>,
    pub revoked_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct OutboxEvent {
    pub id: i64,
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The event's JSON payload, as stored.
    pub payload: String,
    pub revision: i64,
    pub status: String,
    pub attempts: i64,
    pub available_at: i64,
    /// Webhook URLs that already accepted this event.
    pub delivered_urls: Vec<String>,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub delivered_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct DeadEvent {
    pub id: i64,
    pub event_id: String,
    #[serde(rename = "type")]
    #[sqlx(rename = "type")]
    pub kind: String,
    pub payload: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub died_at: i64,
}

/// A document with what it takes in storage, for the admin dashboard's documents table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DocStats {
    pub id: DocId,
    pub name: String,
    pub title: String,
    pub created_at: i64,
    /// The log position the snapshot covers, and the snapshot's bytes (0: none).
    pub snapshot_seq: i64,
    pub snapshot_bytes: i64,
    /// When the snapshot was written (ms since the epoch, by the database's clock; `None`:
    /// no snapshot written since Quire recorded this).
    pub snapshot_at: Option<i64>,
    /// Log rows after the snapshot, and their bytes: what a load replays.
    pub log_rows: i64,
    pub log_bytes: i64,
    /// When the newest log row still stored was committed (`None`: none is stored, a
    /// snapshot covered and deleted them).
    pub last_commit: Option<i64>,
    /// The room lease on the document (several nodes): which node holds it, its epoch (the
    /// fencing token) and until when (ms; in the past: expired or released).
    pub lease_owner: Option<String>,
    pub lease_epoch: Option<i64>,
    pub lease_expires_at: Option<i64>,
}

/// A server process on this database, as its heartbeat last wrote it (`nodes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct NodeRow {
    pub id: String,
    /// The address it listens on (`--bind`).
    pub address: String,
    /// Its Quire version.
    pub version: String,
    pub started_at: i64,
    /// When its heartbeat last wrote (ms, the database's clock).
    pub last_seen_at: i64,
}

/// A live room lease: which node serves which document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LeaseRow {
    pub doc_id: DocId,
    pub doc_name: String,
    pub owner: String,
    pub epoch: i64,
    pub expires_at: i64,
}

/// The nodes and the live leases, read at the database's time `now` (ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ClusterRows {
    pub now: i64,
    pub nodes: Vec<NodeRow>,
    pub leases: Vec<LeaseRow>,
}

/// Filter and page of `GET /docs`.
#[derive(Debug, Clone, Default)]
pub struct DocQuery {
    pub owner: Option<String>,
    pub name_prefix: Option<String>,
    pub after_id: Option<DocId>,
    pub limit: u32,
    pub include_deleted: bool,
}

/// Document metadata rows (`documents`), implemented in `sql_api/documents.rs`.
#[async_trait]
pub trait DocumentStore: Send + Sync {
    /// Creates a document owned by `owner` (also given the owner role), with a
    /// `document.created` event. `Ok(None)` if the name is taken.
    async fn create_doc(
        &self,
        name: &str,
        title: &str,
        owner: Option<&str>,
    ) -> Result<Option<DocMeta>, StorageError> {
        self.create_doc_with(name, title, owner, None).await
    }
    /// [`DocumentStore::create_doc`] with the document's first log row (position 1) written in
    /// the same transaction: a document created with content (a fork) exists with it or not
    /// at all. No room can hold a document that does not exist yet, so the row is its first
    /// content as a room would have logged it.
    async fn create_doc_with(
        &self,
        name: &str,
        title: &str,
        owner: Option<&str>,
        first: Option<super::LogEntry>,
    ) -> Result<Option<DocMeta>, StorageError>;
    async fn get_doc(&self, id: DocId) -> Result<Option<DocMeta>, StorageError>;
    async fn get_doc_by_name(&self, name: &str) -> Result<Option<DocMeta>, StorageError>;
    async fn list_docs(&self, q: &DocQuery) -> Result<Vec<DocMeta>, StorageError>;
    async fn update_doc(
        &self,
        id: DocId,
        expected_version: i64,
        patch: &DocPatch,
    ) -> Result<Versioned<DocMeta>, StorageError>;
    /// Soft delete (with a `document.deleted` event and a `doc_changes` row); `Stale` if
    /// already deleted.
    async fn delete_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError>;
    /// Undo a soft delete; `Stale` if it was not deleted.
    async fn restore_doc(&self, id: DocId) -> Result<Versioned<DocMeta>, StorageError>;
}

/// User profiles (`users`), implemented in `sql_api/profiles.rs`.
#[async_trait]
pub trait ProfileStore: Send + Sync {
    async fn get_user(&self, id: &str) -> Result<Option<UserProfile>, StorageError>;
    /// The profile, created empty if it does not exist yet.
    async fn ensure_user(&self, id: &str) -> Result<UserProfile, StorageError>;
    /// Versioned profile update, with a `profile.updated` event.
    async fn update_user(
        &self,
        id: &str,
        expected_version: i64,
        patch: &UserPatch,
    ) -> Result<Versioned<UserProfile>, StorageError>;
}

/// Roles on documents (`document_access`), implemented in `sql_api/access.rs`.
#[async_trait]
pub trait AccessStore: Send + Sync {
    async fn get_role(&self, doc: DocId, user: &str) -> Result<Option<Role>, StorageError>;
    /// Sets (or with `None` removes) a user's role on a document, with a `doc_changes` row in
    /// the same transaction; returns that row's id.
    async fn set_role(
        &self,
        doc: DocId,
        user: &str,
        role: Option<Role>,
    ) -> Result<i64, StorageError>;
    async fn list_access(&self, doc: DocId) -> Result<Vec<(String, Role)>, StorageError>;
}

/// Idempotency keys of HTTP writes, implemented in `sql_api/idempotency.rs`.
#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    async fn idem_claim(
        &self,
        principal: &str,
        key: &str,
        request_hash: &str,
        now: i64,
        expires_before: i64,
    ) -> Result<IdemClaim, StorageError>;
    async fn idem_finish(
        &self,
        principal: &str,
        key: &str,
        response: &StoredResponse,
    ) -> Result<(), StorageError>;
    /// Forgets a claim whose request failed, so a retry runs again.
    async fn idem_abandon(&self, principal: &str, key: &str) -> Result<(), StorageError>;
    async fn idem_cleanup(&self, expires_before: i64) -> Result<u64, StorageError>;
}

/// Token revocations, implemented in `sql_api/revocations.rs`.
#[async_trait]
pub trait RevocationStore: Send + Sync {
    async fn revoke(
        &self,
        token_id: Option<&str>,
        user_id: Option<&str>,
        now: i64,
    ) -> Result<Revocation, StorageError>;
    async fn revocations_after(&self, id: i64) -> Result<Vec<Revocation>, StorageError>;
}

/// The `doc_changes` feed live sockets follow, implemented in `sql_api/changes.rs`.
#[async_trait]
pub trait DocChangeStore: Send + Sync {
    /// The newest `doc_changes` id (0 if none): where a starting node begins to watch.
    async fn last_doc_change(&self) -> Result<i64, StorageError>;
    /// `doc_changes` rows after `id`, oldest first, at most `limit`.
    async fn doc_changes_after(&self, id: i64, limit: u32) -> Result<Vec<DocChange>, StorageError>;
    /// Removes `doc_changes` rows older than `before` (ms); how many.
    async fn doc_changes_cleanup(&self, before: i64) -> Result<u64, StorageError>;
}

/// The webhook outbox and its dead letters, implemented in `sql_api/outbox.rs`.
#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Records a stateless message a Hocuspocus client sent to document `doc` (by name) as a
    /// `document.stateless` event in the outbox, for the webhooks. Nothing if events are off.
    async fn stateless_event(
        &self,
        doc: &str,
        user: Option<&str>,
        payload: &str,
    ) -> Result<(), StorageError>;

    async fn due_events(&self, now: i64, limit: u32) -> Result<Vec<OutboxEvent>, StorageError>;
    /// Claims up to `limit` events due at `now` that no node has claimed (or whose claim has
    /// expired) for `claim_ms`, oldest first: several nodes claiming at once get disjoint
    /// events. Claims are timed by the database's clock, which every node shares.
    async fn claim_due_events(
        &self,
        now: i64,
        claim_ms: i64,
        limit: u32,
    ) -> Result<Vec<OutboxEvent>, StorageError>;
    /// Gives up this node's claims on `ids` (it stops before attempting them).
    async fn release_claims(&self, ids: &[i64]) -> Result<(), StorageError>;
    /// Marks delivered if the row still has `revision` (a fold in between means deliver again);
    /// either way the claim ends.
    async fn event_delivered(&self, id: i64, revision: i64, now: i64) -> Result<(), StorageError>;
    async fn event_failed(
        &self,
        id: i64,
        revision: i64,
        delivered_urls: &[String],
        next_attempt_at: i64,
        error: &str,
    ) -> Result<(), StorageError>;
    /// Moves an event to the dead-letter table, unless a fold gave it a new revision meanwhile.
    async fn event_dead(
        &self,
        id: i64,
        revision: i64,
        error: &str,
        now: i64,
    ) -> Result<(), StorageError>;
    /// The newest `limit` outbox events and dead events, read from one snapshot so an event
    /// moving to the dead-letter table meanwhile shows in exactly one of the two lists.
    async fn outbox_view(
        &self,
        limit: u32,
    ) -> Result<(Vec<OutboxEvent>, Vec<DeadEvent>), StorageError>;
    /// Puts dead event `id` back in the outbox as a new pending event with the same event id
    /// (receivers deduplicate by it), due at `now`, its attempts counted afresh. Idempotent:
    /// an event already back in the outbox is returned as it is. `None`: no such event.
    async fn retry_dead(&self, id: i64, now: i64) -> Result<Option<OutboxEvent>, StorageError>;
}

/// Admin figures, nodes and leases, implemented in `sql_api/cluster.rs`.
#[async_trait]
pub trait ClusterStore: Send + Sync {
    /// A page of live documents (name prefix, after id, limit of `q`; deleted ones left out)
    /// with their storage figures and leases.
    async fn doc_stats(&self, q: &DocQuery) -> Result<Vec<DocStats>, StorageError>;
    /// Bytes the database takes (SQLite: its pages; PostgreSQL: `pg_database_size`).
    async fn store_size(&self) -> Result<i64, StorageError>;
    /// Writes this node's row in `nodes`, seen now by the database's clock, and drops the rows
    /// of nodes not seen for a day.
    async fn node_heartbeat(
        &self,
        id: &str,
        address: &str,
        version: &str,
        started_at: i64,
    ) -> Result<(), StorageError>;
    /// The nodes' rows and the leases not yet expired (at most `limit` of each, by node id and
    /// document name).
    async fn cluster_rows(&self, limit: u32) -> Result<ClusterRows, StorageError>;
}

/// Every row behind the HTTP API: one trait per resource, each implemented beside its SQL in
/// `sql_api/`; the history and branch rows are in `history.rs` and `branches.rs`.
pub trait ApiStore:
    DocumentStore
    + ProfileStore
    + AccessStore
    + IdempotencyStore
    + RevocationStore
    + DocChangeStore
    + OutboxStore
    + ClusterStore
    + super::history::HistoryStore
    + super::branches::BranchStore
    + Send
    + Sync
    + 'static
{
    /// Keeps log rows for `retention` after a snapshot covers them (zero: snapshots delete
    /// them); shared with the document store of the same database.
    fn set_history_retention(&self, retention: std::time::Duration);
}

/// Checks shared by the backends' unit tests.
#[cfg(test)]
pub(crate) mod checks {
    use std::future::Future;
    use std::pin::Pin;

    use super::*;

    /// A move between the view's two reads, as `outbox_view_with` takes it.
    pub type Between<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

    /// An event moved to the dead-letter table between the outbox view's two reads (by
    /// `view`, the backend's `outbox_view_with`) shows in exactly one of its lists: the
    /// outbox, as the first read saw it.
    pub async fn a_move_between_the_view_reads_shows_once<'a, S, V, F>(store: &'a S, view: V)
    where
        S: ApiStore,
        V: FnOnce(Between<'a>) -> F,
        F: Future<Output = Result<(Vec<OutboxEvent>, Vec<DeadEvent>), StorageError>>,
    {
        store
            .create_doc("moving", "", None)
            .await
            .expect("create")
            .expect("a new name");
        let (events, dead) = store.outbox_view(10).await.expect("view");
        assert!(dead.is_empty(), "{dead:?}");
        let event = events
            .iter()
            .find(|e| e.kind == "document.created")
            .cloned()
            .expect("the document.created event");
        let id = event.id;
        let (events, dead) = view(Box::pin(async move {
            store
                .event_dead(event.id, event.revision, "gone", super::super::now_ms())
                .await
                .expect("move to the dead-letter table");
        }))
        .await
        .expect("view");
        assert!(events.iter().any(|e| e.id == id), "read before the move");
        assert!(
            dead.is_empty(),
            "the dead-letter table is read in the outbox's snapshot: {dead:?}"
        );
        let (events, dead) = store.outbox_view(10).await.expect("view");
        assert!(!events.iter().any(|e| e.id == id), "{events:?}");
        assert_eq!(dead.iter().map(|d| d.id).collect::<Vec<_>>(), vec![id]);
        assert_eq!(dead[0].kind, "document.created");
        assert_eq!(dead[0].last_error.as_deref(), Some("gone"));
    }
}
