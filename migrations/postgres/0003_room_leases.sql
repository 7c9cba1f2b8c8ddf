-- Room ownership across server nodes: one lease per document. `epoch` grows by one with
-- every grant and is the fencing token: log appends and snapshot writes name the epoch they
-- were made under and the storage refuses them, in the same statement, once it has changed.
-- `expires_at` is in milliseconds since the Unix epoch by the database server's clock (every
-- node compares against the same clock, so node clock skew does not matter).
CREATE TABLE room_leases (
    doc_id     BIGINT PRIMARY KEY REFERENCES documents(id),
    owner      TEXT   NOT NULL,
    epoch      BIGINT NOT NULL,
    expires_at BIGINT NOT NULL
);
