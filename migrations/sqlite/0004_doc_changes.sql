-- Changes that close or downgrade live sockets on every node: a document deleted, a user's
-- role changed. Written in the transaction of the change; the server reads the rows after the
-- last it has seen (every `changes::POLL`), so a change reaches every socket even when the bus
-- loses its announcement. Rows older than a day are pruned.
CREATE TABLE doc_changes (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id     INTEGER NOT NULL REFERENCES documents(id),
    kind       TEXT    NOT NULL CHECK (kind IN ('deleted', 'access')),
    user_id    TEXT,
    changed_at INTEGER NOT NULL
);
