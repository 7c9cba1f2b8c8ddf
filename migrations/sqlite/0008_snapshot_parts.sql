-- A snapshot is stored in parts of at most 1 MiB (`storage::SNAPSHOT_PART_BYTES`), each part
-- a row, so a large document's snapshot can be written in short transactions that other
-- documents' appends (and the document's own) commit between: one transaction of 20 MB held
-- SQLite's single writer, and every commit behind it, for up to 90 ms.
--
-- A snapshot's parts share a `generation` (a random number chosen by the writer); the parts
-- are written first (staged), invisible to readers, and `documents.snapshot_generation` names
-- the generation that is the snapshot once the version-checked final write sets it. That
-- write deletes every other generation of the document (the previous snapshot, and parts a
-- writer staged but never finished).
CREATE TABLE doc_snapshot_parts (
    doc_id     INTEGER NOT NULL REFERENCES documents(id),
    generation INTEGER NOT NULL,
    part       INTEGER NOT NULL,
    bytes      BLOB    NOT NULL,
    PRIMARY KEY (doc_id, generation, part)
);
ALTER TABLE documents ADD COLUMN snapshot_generation INTEGER;
INSERT INTO doc_snapshot_parts (doc_id, generation, part, bytes)
    SELECT doc_id, 0, 0, snapshot FROM doc_snapshots;
UPDATE documents SET snapshot_generation = 0
    WHERE id IN (SELECT doc_id FROM doc_snapshots);
DROP TABLE doc_snapshots;
