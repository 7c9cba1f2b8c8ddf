-- The HTTP API: document metadata, profiles, access, idempotency keys, token revocations and
-- the webhook outbox.

-- Content snapshots and metadata each get their own optimistic version: a title change must
-- not make the room's next snapshot conflict, and a snapshot must not invalidate an ETag.
ALTER TABLE documents RENAME COLUMN version TO snapshot_version;
ALTER TABLE documents ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE documents ADD COLUMN title TEXT NOT NULL DEFAULT '';
ALTER TABLE documents ADD COLUMN owner TEXT;
ALTER TABLE documents ADD COLUMN deleted_at INTEGER;
CREATE INDEX documents_owner ON documents (owner, id);

CREATE TABLE users (
    id           TEXT    PRIMARY KEY,
    display_name TEXT    NOT NULL DEFAULT '',
    color        TEXT    NOT NULL DEFAULT '',
    avatar_url   TEXT    NOT NULL DEFAULT '',
    version      INTEGER NOT NULL DEFAULT 1,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);

CREATE TABLE document_access (
    doc_id  INTEGER NOT NULL REFERENCES documents(id),
    user_id TEXT    NOT NULL,
    role    TEXT    NOT NULL CHECK (role IN ('viewer', 'editor', 'owner')),
    PRIMARY KEY (doc_id, user_id)
) WITHOUT ROWID;

-- One row per (principal, key). `response_status` is NULL while the first request runs.
CREATE TABLE idempotency_keys (
    principal       TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    request_hash    TEXT    NOT NULL,
    response_status INTEGER,
    response_body   BLOB,
    -- JSON list of [name, value] pairs replayed with the body (content-type, etag, location).
    response_headers TEXT,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (principal, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- Revocations, in order; every node applies the rows after the last one it has seen.
CREATE TABLE revocations (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    token_id   TEXT,
    user_id    TEXT,
    revoked_at INTEGER NOT NULL,
    CHECK (token_id IS NOT NULL OR user_id IS NOT NULL)
);

-- The transactional outbox. Rows are written in the transaction of the change they describe.
-- `coalesce_key` folds repeated `document.updated` events of one document into the one pending
-- row (each fold gives it a new event id and bumps `revision`).
CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id      TEXT    NOT NULL UNIQUE,
    type          TEXT    NOT NULL,
    payload       TEXT    NOT NULL,
    coalesce_key  TEXT,
    revision      INTEGER NOT NULL DEFAULT 1,
    status        TEXT    NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    available_at  INTEGER NOT NULL,
    delivered_urls TEXT   NOT NULL DEFAULT '[]',
    last_error    TEXT,
    created_at    INTEGER NOT NULL,
    delivered_at  INTEGER
);
CREATE UNIQUE INDEX outbox_pending_coalesce ON outbox (coalesce_key) WHERE status = 'pending';
CREATE INDEX outbox_due ON outbox (status, available_at);

-- Events whose delivery attempts ran out.
CREATE TABLE outbox_dead (
    id           INTEGER PRIMARY KEY,
    event_id     TEXT    NOT NULL UNIQUE,
    type         TEXT    NOT NULL,
    payload      TEXT    NOT NULL,
    attempts     INTEGER NOT NULL,
    last_error   TEXT,
    created_at   INTEGER NOT NULL,
    died_at      INTEGER NOT NULL
);
