-- Lookups by business key: the per-biz-no ordering check (is an earlier event of this biz_no
-- still pending?) and operators' searches (dead letters of one order).
CREATE INDEX idx_biz_no ON t_event_record (biz_no, status);
