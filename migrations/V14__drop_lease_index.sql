-- The lease's own index goes: a lease claim now sets a SENDING row's next_retry_time to the end
-- of its lease (and a renew moves it on), so the reclaim of expired leases walks
-- idx_status_next_retry like the scan does. Every INSERT writes one index entry less, and every
-- lease claim and renew moves one entry less (benches/README.md, "What we cost the order
-- database"). Queries name the indexes they use, so none names this one any more; a table
-- without it (dropped here, or never created) is the same to every relay. In place, without
-- blocking writers.
ALTER TABLE t_event_record DROP INDEX IF EXISTS idx_status_claimed_at, ALGORITHM = INPLACE, LOCK = NONE;
