-- A snapshot is stored in parts of at most 1 MiB (the same schema as migrations/sqlite, where
-- one transaction of a 20 MB snapshot held the single writer and every commit behind it; here
-- it held the document's row, and so its appends, for as long).
--
-- A snapshot's parts share a `generation` (a random number chosen by the writer); the parts
-- are written first (staged), invisible to readers, and `documents.snapshot_generation` names
-- the generation that is the snapshot once the version-checked final write sets it. That
-- write deletes every other generation of the document.
CREATE TABLE doc_snapshot_parts (
    doc_id     BIGINT NOT NULL REFERENCES documents(id),
    generation BIGINT NOT NULL,
    part       BIGINT NOT NULL,
    bytes      BYTEA  NOT NULL,
    PRIMARY KEY (doc_id, generation, part)
);
ALTER TABLE documents ADD COLUMN snapshot_generation BIGINT;
INSERT INTO doc_snapshot_parts (doc_id, generation, part, bytes)
    SELECT doc_id, 0, 0, snapshot FROM doc_snapshots;
UPDATE documents SET snapshot_generation = 0
    WHERE id IN (SELECT doc_id FROM doc_snapshots);
DROP TABLE doc_snapshots;
