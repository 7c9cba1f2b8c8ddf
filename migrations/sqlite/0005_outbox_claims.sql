-- Several nodes share one outbox: each event is delivered by the node that claimed it, until
-- `claimed_until` (milliseconds since the epoch). A node that dies mid-delivery leaves a claim
-- that simply expires, and the event is claimed again (receivers deduplicate by event id).
ALTER TABLE outbox ADD COLUMN claimed_until INTEGER NOT NULL DEFAULT 0;
