-- idx_biz_no without status: every status change (claim, ack, retry) had to move the row's entry
-- in this index too, one more index write per transition on the relay's hot path. A key holds a
-- handful of rows, so lookups by biz_no read them all and check the status on the row; the index
-- still ends with the primary key, which the per-biz-no ordering check ("an earlier id of this
-- key still pending?") needs. In place, without blocking writers.
ALTER TABLE t_event_record DROP INDEX idx_biz_no, ADD INDEX idx_biz_no (biz_no), ALGORITHM = INPLACE, LOCK = NONE;
