-- Re-emit jobs (docs/scheduling.md#re-emit): sent events selected by type, topic, business key
-- and time written, copied back into the outbox table as new rows due now (same event key, a
-- `reemitOf` property), at a bounded rate. A job walks the ids (first_id, last_id] of its table
-- and records how far it got (`position`) in the same transaction as each batch of copies, so a
-- stopped or crashed job resumes where it stopped, never copying an event twice or skipping one.
-- One runner at a time: `runner` and its `heartbeat`, taken over once the heartbeat is stale.
CREATE TABLE IF NOT EXISTS outbox_reemit (
  id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  table_name    VARCHAR(64)     NOT NULL,
  event_type    VARCHAR(64)     NULL,
  topic         VARCHAR(127)    NULL,
  default_topic VARCHAR(127)    NULL,
  biz_no        VARCHAR(64)     NULL,
  written_since DATETIME(3)     NULL,
  written_until DATETIME(3)     NULL,
  first_id      BIGINT UNSIGNED NOT NULL,
  last_id       BIGINT UNSIGNED NOT NULL,
  position      BIGINT UNSIGNED NOT NULL,
  matched       BIGINT UNSIGNED NOT NULL,
  emitted       BIGINT UNSIGNED NOT NULL DEFAULT 0,
  rate          INT UNSIGNED    NOT NULL,
  state         VARCHAR(16)     NOT NULL DEFAULT 'STOPPED',
  runner        VARCHAR(128)    NULL,
  heartbeat     DATETIME(3)     NULL,
  created_by    VARCHAR(128)    NOT NULL,
  created_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at    DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_reemit_table (table_name, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
