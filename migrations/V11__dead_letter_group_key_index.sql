-- The consumer's dead letters by key (docs/inbox.md, "Dead letters"): a later copy of a parked
-- key (a resend, a broker redelivery) is added to the key's dead letter instead of being parked
-- again, and an operator finds a key's dead letter without scanning the group's. In place,
-- without blocking writers.
ALTER TABLE outbox_inbox_dead_letter ADD INDEX IF NOT EXISTS idx_dead_letter_group_key (consumer_group, event_key), ALGORITHM = INPLACE, LOCK = NONE;
