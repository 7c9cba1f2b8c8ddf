-- What the admin dashboard shows that was not stored before (the same schema as
-- migrations/sqlite).
--
-- When the document's snapshot was last written, by the database's clock (ms since the epoch;
-- NULL: none since this migration).
ALTER TABLE documents ADD COLUMN snapshot_at BIGINT;

-- The nodes serving this database: each running node writes its row every few seconds
-- (`admin::heartbeat`), so the dashboard lists the nodes alive (seen lately) beside the room
-- leases they hold. A node that stops leaves its row, shown as gone once it is old.
CREATE TABLE nodes (
    id           TEXT    PRIMARY KEY,
    address      TEXT    NOT NULL,
    version      TEXT    NOT NULL,
    started_at   BIGINT  NOT NULL,
    last_seen_at BIGINT  NOT NULL
);
