-- What stored log rows held that does not integrate into their document (docs/durability.md,
-- "Only updates that integrate"): logged by a Quire that did not check updates, found when
-- the document loads, kept out of it, and listed for operators (`quire doctor`,
-- `GET /api/v1/admin/set-aside`). `data` is the whole row when its blocks depend on content
-- never stored, or only the deletions it named of content no one holds (a Yjs v1 update).
CREATE TABLE set_aside (
    doc_id     BIGINT NOT NULL REFERENCES documents(id),
    seq        BIGINT NOT NULL,
    data       BYTEA    NOT NULL,
    reason     TEXT    NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (doc_id, seq)
);
