-- Per-key ordering (ordering = per-biz-no), see docs/ordering.md.
--
-- idx_biz_no gets status and id back: the ordered claim asks, for the keys of a round's
-- candidates, "the smallest pending id of each key" as a loose index scan (GROUP BY biz_no,
-- status with MIN(id): one or two index reads per key and status, whatever the key's backlog or
-- history), then reads the pending ids of the claimable runs as ranges of this index. Without
-- status in the index each such lookup read every row the key ever had. The cost: claim and ack
-- move the row's entry in this index too (measured in benches/README.md). In place, without
-- blocking writers (MariaDB and MySQL both build a secondary index online).
ALTER TABLE t_event_record DROP INDEX idx_biz_no, ADD INDEX idx_biz_no (biz_no, status, id), ALGORITHM = INPLACE, LOCK = NONE;
-- The stable queue set of ordered topics: every (broker, queue) a relay has seen in a topic's
-- route, so a key hashes over the same set whether or not a broker is up right now. Shared by
-- every relay instance that publishes the topic; rows are only ever added.
CREATE TABLE IF NOT EXISTS outbox_topic_queue (
  topic       VARCHAR(127) NOT NULL,
  broker_name VARCHAR(127) NOT NULL,
  queue_id    INT UNSIGNED NOT NULL,
  first_seen  DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  PRIMARY KEY (topic, broker_name, queue_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4;
