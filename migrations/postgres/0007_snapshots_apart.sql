-- Snapshots move out of `documents` into a table of their own (the same schema as
-- migrations/sqlite, where a large BLOB stored inline made every read of a later column walk
-- the whole snapshot; PostgreSQL keeps a large bytea out of line already, so here the move
-- only keeps the two schemas alike).
CREATE TABLE doc_snapshots (
    doc_id   BIGINT PRIMARY KEY REFERENCES documents(id),
    snapshot BYTEA  NOT NULL
);
INSERT INTO doc_snapshots (doc_id, snapshot)
    SELECT id, snapshot FROM documents WHERE snapshot IS NOT NULL;
ALTER TABLE documents DROP COLUMN snapshot;
