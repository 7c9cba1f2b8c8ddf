-- Snapshots move out of `documents` into a table of their own.
--
-- SQLite stores a row's columns in order and the tail of a large BLOB in a chain of overflow
-- pages, so reading any column stored after `snapshot` (snapshot_seq, deleted_at, version,
-- title, ...) walked the whole snapshot: with a 20 MB document, every socket join (its
-- metadata read) and every append (its covered-position check) read 20 MB, and a metadata
-- write rewrote them. Measured before the move: 150 clients joining a 20 MB document made the
-- server read 2.9 GB from the database file.
CREATE TABLE doc_snapshots (
    doc_id   INTEGER PRIMARY KEY REFERENCES documents(id),
    snapshot BLOB    NOT NULL
);
INSERT INTO doc_snapshots (doc_id, snapshot)
    SELECT id, snapshot FROM documents WHERE snapshot IS NOT NULL;
ALTER TABLE documents DROP COLUMN snapshot;
