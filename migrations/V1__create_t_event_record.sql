-- The outbox table, with the seed's table name, columns and indexes, so that a service already
-- writing to a seed-style t_event_record can switch relays on the same table.
-- Rows are inserted by the order service in its own transaction with status 'WAIT' and
-- next_retry_time = NOW(3); the relay moves them WAIT -> SENDING -> SUCCESS (or back to WAIT, or FAIL).
CREATE TABLE IF NOT EXISTS t_event_record (
  id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  biz_no          VARCHAR(64)     NOT NULL,
  event_type      VARCHAR(64)     NOT NULL,
  payload         MEDIUMBLOB      NOT NULL,
  status          VARCHAR(16)     NOT NULL DEFAULT 'WAIT',
  retry_count     INT UNSIGNED    NOT NULL DEFAULT 0,
  next_retry_time DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  claim_owner     VARCHAR(128)    NULL,
  claimed_at      DATETIME(3)     NULL,
  create_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  update_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (id),
  -- the scan: WHERE status = 'WAIT' AND next_retry_time <= NOW(3) ORDER BY next_retry_time, id
  KEY idx_status_next_retry (status, next_retry_time),
  -- the reclaim: WHERE status = 'SENDING' AND claimed_at < NOW(3) - lease ORDER BY claimed_at, id
  KEY idx_status_claimed_at (status, claimed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
