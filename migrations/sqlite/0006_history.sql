-- Version history (docs/history.md). Each log row records who sent it and how much it
-- changed; the yrs client ids an update introduces are mapped to their author, so any item of
-- the document can be attributed; versions hold the full state at a log position. With
-- `history_retention` > 0, snapshots no longer delete the rows they cover: the prune job
-- deletes them once they are older than the retention and a version stands before them.
ALTER TABLE doc_updates ADD COLUMN author TEXT;
-- Content units (characters of text, elements, entries) the update inserted and deleted.
ALTER TABLE doc_updates ADD COLUMN inserted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE doc_updates ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0;

CREATE TABLE doc_clients (
    doc_id    INTEGER NOT NULL REFERENCES documents(id),
    client_id INTEGER NOT NULL,
    author    TEXT    NOT NULL,
    first_seq INTEGER NOT NULL,
    PRIMARY KEY (doc_id, client_id)
) WITHOUT ROWID;

CREATE TABLE doc_versions (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    doc_id     INTEGER NOT NULL REFERENCES documents(id),
    -- The log position whose content `state` is.
    seq        INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('auto', 'named', 'restore')),
    label      TEXT,
    author     TEXT,
    -- Yjs v2 encoded state of the document at `seq`.
    state      BLOB    NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE INDEX doc_versions_by_doc ON doc_versions (doc_id, seq);

-- Background jobs' persisted status (one row per job).
CREATE TABLE jobs (
    name        TEXT    PRIMARY KEY,
    state       TEXT    NOT NULL,
    started_at  INTEGER,
    finished_at INTEGER,
    runs        INTEGER NOT NULL DEFAULT 0,
    items       INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT
);
