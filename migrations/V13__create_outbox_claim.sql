-- The journal of held claim rounds (claim.strategy = held, docs/guarantees.md "The claim
-- strategies"). A held round locks its rows in a transaction and writes nothing to them while it
-- sends; before it sends, it commits one row here (on another connection) naming the rows, then
-- locks that row in its own transaction, and deletes it in the COMMIT that records the sends. A
-- row found here unlocked, older than a short grace, is a round whose connection died: its
-- events may have been sent, so a relay counts an attempt on each one still pending and audits
-- each as claim-lost (outbox_audit), then deletes the row.
CREATE TABLE IF NOT EXISTS outbox_claim (
  token      BIGINT UNSIGNED NOT NULL,
  table_name VARCHAR(64)     NOT NULL,
  owner      VARCHAR(128)    NOT NULL,
  ids        TEXT            NOT NULL,
  events     INT UNSIGNED    NOT NULL,
  claimed_at DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (token),
  KEY idx_claim_table_time (table_name, claimed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
