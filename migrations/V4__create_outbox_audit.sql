-- Who did what to which event by hand (dead-letter replay and discard), and when.
CREATE TABLE IF NOT EXISTS outbox_audit (
  id         BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  table_name VARCHAR(64)     NOT NULL,
  event_id   BIGINT UNSIGNED NOT NULL,
  action     VARCHAR(32)     NOT NULL,
  actor      VARCHAR(128)    NOT NULL,
  detail     VARCHAR(1024)   NULL,
  at         DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_audit_event (table_name, event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
