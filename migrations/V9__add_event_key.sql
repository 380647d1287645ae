-- event_key: the event's dedup key, unique across outbox tables and databases (docs/inbox.md).
-- The relay sets it when it first claims a row that has none (a UUID, version 7: time-ordered,
-- 74 random bits) and never changes it afterwards, so every copy of the event it sends carries
-- the same key (message property `eventKey`). Producers may also set it themselves at INSERT.
-- Nullable and last: ALGORITHM=INSTANT on MariaDB 10.3+ and MySQL 8, on any table.
ALTER TABLE t_event_record ADD COLUMN event_key CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NULL;
