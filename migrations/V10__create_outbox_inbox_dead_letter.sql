-- The consumer's dead letters (docs/inbox.md): a message whose handler kept failing is parked
-- here, with its body and properties, after the consumer's last attempt, and the queue moves on.
-- `outboxd dead-letters replay --consumer-group G` sets status REPLAY; the group's running
-- consumers then handle the row again (inbox mark + handler + delete, one transaction).
-- The name is configurable (outbox::consumer::dead_letter::migrate_dead_letter); this file
-- uses the default.
CREATE TABLE IF NOT EXISTS outbox_inbox_dead_letter (
  id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer_group VARCHAR(255)    CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  event_key      VARBINARY(255)  NOT NULL,
  topic          VARCHAR(127)    NOT NULL,
  broker         VARCHAR(128)    NULL,
  queue_id       INT UNSIGNED    NULL,
  queue_offset   BIGINT UNSIGNED NULL,
  msg_id         VARCHAR(128)    NULL,
  tag            VARCHAR(128)    NULL,
  properties     TEXT            NULL,
  body           MEDIUMBLOB      NOT NULL,
  attempts       INT UNSIGNED    NOT NULL,
  last_error     VARCHAR(1024)   NOT NULL,
  status         VARCHAR(16)     CHARACTER SET ascii NOT NULL DEFAULT 'DEAD',
  created_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  updated_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  KEY idx_dead_letter_group_status (consumer_group, status, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
