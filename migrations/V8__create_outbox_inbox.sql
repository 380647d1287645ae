-- The consumer inbox (docs/inbox.md): one row per (consumer group, event key) a consumer has
-- processed, inserted in the consumer's own transaction BEFORE its handler runs (claim-first).
-- A concurrent copy of the same event waits on the primary key and then fails with a duplicate
-- key; a rollback of the consumer's transaction removes the row again. The name is configurable
-- (outbox::inbox::migrate_inbox creates it under another name); this file uses the default.
-- consumer_group: RocketMQ's group charset, compared as bytes (ascii_bin; spaces are refused).
-- event_key: compared byte for byte, trailing spaces included (VARBINARY, no collation).
-- processed_at comes from the database clock; retention deletes along idx_processed_at in small
-- batches.
CREATE TABLE IF NOT EXISTS outbox_inbox (
  consumer_group VARCHAR(255)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  event_key      VARBINARY(255)  NOT NULL,
  topic          VARCHAR(127)    NULL,
  queue_id       INT UNSIGNED    NULL,
  queue_offset   BIGINT UNSIGNED NULL,
  msg_id         VARCHAR(128)    NULL,
  processed_at   DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (consumer_group, event_key),
  KEY idx_inbox_processed_at (processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
