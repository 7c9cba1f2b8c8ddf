-- Documents and their append-only update log.
--
-- `version` guards snapshot writes: a snapshot is written with
-- `UPDATE documents ... WHERE id = ? AND version = ?` and bumps it.
-- `snapshot` is a Yjs v2-encoded state covering every log row with seq <= snapshot_seq.
CREATE TABLE documents (
    id           INTEGER PRIMARY KEY,
    name         TEXT    NOT NULL UNIQUE,
    version      INTEGER NOT NULL DEFAULT 0,
    snapshot     BLOB,
    snapshot_seq INTEGER NOT NULL DEFAULT 0,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);

-- One row per update that changed the document, stored as received (Yjs v1).
-- The primary key makes appends idempotent per sequence number and rejects a
-- second writer that believes it owns the same log position.
CREATE TABLE doc_updates (
    doc_id     INTEGER NOT NULL REFERENCES documents(id),
    seq        INTEGER NOT NULL,
    data       BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (doc_id, seq)
) WITHOUT ROWID;
