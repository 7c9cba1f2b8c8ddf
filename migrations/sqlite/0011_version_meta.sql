-- A version's metadata without its state: `created_at` follows the state in each row, and
-- SQLite reaches a column after a large blob only by walking the blob's overflow pages
-- (about 7 ms per read of a 20 MiB document's version, on every version route). This index
-- covers the metadata reads (the list in its order, and one version: `+id` in that query
-- keeps SQLite from going to the row by its rowid), so they never touch the row.
CREATE INDEX doc_versions_meta ON doc_versions (doc_id, seq, id, kind, label, author, created_at);
-- Building it reads every stored version once (the columns after each state), at the first
-- start of this release: on a store with many large versions that start takes longer.
