-- The journal of held claim rounds (claim.strategy = held, docs/guarantees.md "The claim
-- strategies"). A held round locks its rows in a transaction and writes nothing to them while it
-- sends; before it sends, it commits one row here (on another connection) naming the rows, then
-- deletes it in its own transaction: the uncommitted DELETE holds the row until the COMMIT that
-- records the sends, or brings it back if the round's connection dies. A row found here
-- unlocked, older than a short grace, is such a round: its
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
