-- Room ownership across server nodes: one lease per document. `epoch` grows by one with
-- every grant and is the fencing token: log appends and snapshot writes name the epoch they
-- were made under and the storage refuses them, in the same statement, once it has changed.
-- `expires_at` is in milliseconds since the Unix epoch; a lease past it may be granted anew.
-- (One SQLite file serves one node, so this table matters for PostgreSQL clusters; it exists
-- here too so both backends have the same schema and the same contract.)
CREATE TABLE room_leases (
    doc_id     INTEGER PRIMARY KEY REFERENCES documents(id),
    owner      TEXT    NOT NULL,
    epoch      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL
);
