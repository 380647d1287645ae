-- What the relay adds to the seed's table:
--   claim_token    a fresh random token per claim; every later transition must match it, so a late
--                  ack from an earlier claim (even by the same instance) changes nothing;
--   topic, tag     per-row overrides (NULL: the configured default topic, the event type as tag);
--   headers        extra message properties, a JSON object of strings;
--   sent_at        when the broker acknowledged the message (DB clock);
--   broker_msg_id  the message id the broker returned;
--   last_error     why the last attempt failed.
-- New nullable columns only: instant (metadata only, no copy, writers never wait). The widening of
-- a seed-era table's columns is V7, one table copy for all of it.
ALTER TABLE t_event_record
  ADD COLUMN claim_token   BIGINT UNSIGNED NULL AFTER claimed_at,
  ADD COLUMN topic         VARCHAR(127)    NULL,
  ADD COLUMN tag           VARCHAR(127)    NULL,
  ADD COLUMN headers       TEXT            NULL,
  ADD COLUMN sent_at       DATETIME(3)     NULL,
  ADD COLUMN broker_msg_id VARCHAR(128)    NULL,
  ADD COLUMN last_error    VARCHAR(1024)   NULL,
  ALGORITHM = INSTANT;
