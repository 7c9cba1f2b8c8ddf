-- Branches (docs/branches.md): a branch is a document of its own whose first log row is its
-- parent's content at the base position. The branch's later rows, grouped by author and
-- session, are the changes a reviewer merges into the parent or rejects. Decisions and
-- updates from the parent are appended, never rewritten; the branch row itself changes only
-- through its version (optimistic check).
CREATE TABLE branches (
    doc_id     BIGINT PRIMARY KEY REFERENCES documents(id),
    parent_id  BIGINT NOT NULL REFERENCES documents(id),
    -- The parent's log position the branch's content was taken at.
    base_seq   BIGINT NOT NULL,
    state      TEXT    NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'merged', 'closed')),
    author     TEXT,
    created_at BIGINT NOT NULL,
    version    BIGINT NOT NULL DEFAULT 1
);
CREATE INDEX branches_by_parent ON branches (parent_id);

-- A change's fate: merged into the parent or rejected. `change_id` is the branch log position
-- the change starts at, `last_seq` the last position it held when decided (the author's later
-- rows form a new change).
CREATE TABLE branch_decisions (
    branch_id  BIGINT NOT NULL REFERENCES documents(id),
    change_id  BIGINT NOT NULL,
    last_seq   BIGINT NOT NULL,
    decision   TEXT    NOT NULL CHECK (decision IN ('merged', 'rejected')),
    decided_by TEXT,
    -- The parent's log position the merge reached.
    parent_seq BIGINT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (branch_id, change_id)
);

-- The parent's changes brought into the branch: the branch log row holding them and the
-- parent position they reach.
CREATE TABLE branch_pulls (
    branch_id  BIGINT NOT NULL REFERENCES documents(id),
    branch_seq BIGINT NOT NULL,
    parent_seq BIGINT NOT NULL,
    pulled_by  TEXT,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (branch_id, branch_seq)
);
