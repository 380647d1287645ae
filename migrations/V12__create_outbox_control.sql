-- Operator controls of an outbox table (docs/console.md): while `paused` is 1 for a table, every
-- relay of that table stops claiming (rows in flight finish normally; nothing is lost or sent
-- twice), and claims again within a second of it going back to 0. Set by `outboxd control
-- pause|resume` or the console, each change audited in outbox_audit.
CREATE TABLE IF NOT EXISTS outbox_control (
  table_name VARCHAR(64)   NOT NULL,
  paused     TINYINT(1)    NOT NULL DEFAULT 0,
  reason     VARCHAR(512)  NULL,
  changed_by VARCHAR(128)  NULL,
  changed_at DATETIME(3)   NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (table_name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
