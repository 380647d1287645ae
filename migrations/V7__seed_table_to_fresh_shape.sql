-- A table created by the seed's DDL gets the shape of one created by V1: binary payloads up to
-- 16 MiB (TEXT refuses bytes that are not UTF-8 and anything past 64 KiB), claim_owner wide
-- enough for any instance id (128 characters), unsigned ids and retry counts, millisecond times.
-- On a table created by V1 every definition below is what it already has: nothing changes and
-- the server does it instantly (metadata only).
-- claim_owner VARCHAR(64) -> VARCHAR(128) in utf8mb4 keeps its 2-byte length prefix: instant.
ALTER TABLE t_event_record MODIFY COLUMN claim_owner VARCHAR(128) NULL;
-- Column type changes: on a seed-era table MariaDB 10.11 (and MySQL 8) can only copy the table
-- (ALGORITHM=COPY): reads go on, writes wait until the copy ends. All of them in one statement,
-- so the table is copied once.
ALTER TABLE t_event_record
  MODIFY COLUMN id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  MODIFY COLUMN payload         MEDIUMBLOB      NOT NULL,
  MODIFY COLUMN retry_count     INT UNSIGNED    NOT NULL DEFAULT 0,
  MODIFY COLUMN next_retry_time DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  MODIFY COLUMN claimed_at      DATETIME(3)     NULL,
  MODIFY COLUMN create_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
  MODIFY COLUMN update_time     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  LOCK = SHARED;
