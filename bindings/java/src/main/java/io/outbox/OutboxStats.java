package io.outbox;

import java.time.Duration;
import java.util.Map;
import java.util.Optional;

/**
 * A snapshot of a relay's counters and, when the database answered, its gauges. {@link #json()}
 * is the library's JSON as is; {@link #get(String)} reads any counter by its JSON name, so
 * counters added by later library versions are readable before this class names them.
 */
public final class OutboxStats {
    /** Row counts by status, and the age of the oldest WAIT row. */
    public static final class Gauges {
        private final long waiting;
        private final long sending;
        private final long failed;
        private final Duration oldestWaitAge;

        Gauges(Map<String, Object> m) {
            this.waiting = num(m, "wait");
            this.sending = num(m, "sending");
            this.failed = num(m, "fail");
            this.oldestWaitAge = Duration.ofMillis(num(m, "oldest_wait_age_ms"));
        }

        /**
         * Rows in WAIT (due now or later).
         *
         * @return rows in WAIT (due now or later)
         */
        public long waiting() {
            return waiting;
        }

        /**
         * Rows in SENDING (claimed by some instance).
         *
         * @return rows in SENDING (claimed by some instance)
         */
        public long sending() {
            return sending;
        }

        /**
         * Rows in FAIL (dead letters).
         *
         * @return rows in FAIL (dead letters)
         */
        public long failed() {
            return failed;
        }

        /**
         * How long the oldest due WAIT row has been due (zero when none is).
         *
         * @return the age of the oldest due WAIT row
         */
        public Duration oldestWaitAge() {
            return oldestWaitAge;
        }

        @Override
        public String toString() {
            return "Gauges{wait=" + waiting + ", sending=" + sending + ", fail=" + failed + ", oldestWaitAge=" + oldestWaitAge + "}";
        }
    }

    /**
     * Commit → broker-ack times of the events this relay delivered (measured by the relay from
     * the row's commit time to the broker's acknowledgement).
     */
    public static final class Latency {
        private final long count;
        private final double meanMs;
        private final double maxMs;
        private final long p50Ms;
        private final long p99Ms;

        Latency(Map<String, Object> m) {
            this.count = num(m, "count");
            this.meanMs = dbl(m, "mean_ms");
            this.maxMs = dbl(m, "max_ms");
            this.p50Ms = num(m, "p50_ms");
            this.p99Ms = num(m, "p99_ms");
        }

        /**
         * Deliveries measured (0 before the first).
         *
         * @return deliveries measured (0 before the first)
         */
        public long count() {
            return count;
        }

        /**
         * The mean commit → ack time, in milliseconds (0 before the first delivery).
         *
         * @return the mean, in milliseconds
         */
        public double meanMillis() {
            return meanMs;
        }

        /**
         * The longest commit → ack time, in milliseconds (0 before the first delivery).
         *
         * @return the maximum, in milliseconds
         */
        public double maxMillis() {
            return maxMs;
        }

        /**
         * Upper bound (a power of two, in ms) of the bucket holding the median.
         *
         * @return upper bound (a power of two, in ms) of the bucket holding the median
         */
        public long p50Millis() {
            return p50Ms;
        }

        /**
         * Upper bound (a power of two, in ms) of the bucket holding the 99th percentile.
         *
         * @return upper bound (a power of two, in ms) of the bucket holding the 99th percentile
         */
        public long p99Millis() {
            return p99Ms;
        }

        @Override
        public String toString() {
            return "Latency{count=" + count + ", meanMs=" + meanMs + ", maxMs=" + maxMs + ", p50Ms<=" + p50Ms + ", p99Ms<="
                    + p99Ms + "}";
        }
    }

    private final String json;
    private final Map<String, Object> fields;
    private final Gauges gauges;
    private final Latency latency;

    @SuppressWarnings("unchecked")
    OutboxStats(String json) {
        this.json = json;
        this.fields = Json.object(json);
        Object g = fields.get("gauges");
        this.gauges = g instanceof Map ? new Gauges((Map<String, Object>) g) : null;
        Object l = fields.get("latency");
        this.latency = new Latency(l instanceof Map ? (Map<String, Object>) l : java.util.Collections.emptyMap());
    }

    private static double dbl(Map<String, Object> m, String name) {
        Object v = m.get(name);
        return v instanceof Number ? ((Number) v).doubleValue() : 0.0;
    }

    /**
     * Commit → broker-ack latency of this relay's deliveries.
     *
     * @return commit → broker-ack latency of this relay's deliveries
     */
    public Latency latency() {
        return latency;
    }

    private static long num(Map<String, Object> m, String name) {
        Object v = m.get(name);
        return v instanceof Number ? ((Number) v).longValue() : 0L;
    }

    /**
     * The counter {@code name} as the JSON names it ({@code sent}, {@code db_errors}, ...); 0 when absent.
     *
     * @param name the counter's JSON name
     * @return the counter {@code name} as the JSON names it ({@code sent}, {@code db_errors}, ...); 0 when absent
     */
    public long get(String name) {
        return num(fields, name);
    }

    /**
     * Every field of the snapshot, as parsed.
     *
     * @return every field of the snapshot, as parsed
     */
    public Map<String, Object> fields() {
        return fields;
    }

    /**
     * The library's JSON.
     *
     * @return the library's JSON
     */
    public String json() {
        return json;
    }

    /**
     * The instance id this relay writes as {@code claim_owner}.
     *
     * @return the instance id, or {@code null} when absent
     */
    public String instanceId() {
        Object v = fields.get("instance_id");
        return v == null ? null : v.toString();
    }

    /**
     * Rows this instance claimed.
     *
     * @return rows this instance claimed
     */
    public long claimed() {
        return get("claimed");
    }

    /**
     * Events acknowledged by the broker and marked SUCCESS.
     *
     * @return events acknowledged by the broker and marked SUCCESS
     */
    public long sent() {
        return get("sent");
    }

    /**
     * Failed attempts returned to WAIT with backoff.
     *
     * @return failed attempts returned to WAIT with backoff
     */
    public long retried() {
        return get("retried");
    }

    /**
     * Events marked FAIL.
     *
     * @return events marked FAIL
     */
    public long deadLettered() {
        return get("dead_lettered");
    }

    /**
     * Expired leases this instance returned.
     *
     * @return expired leases this instance returned
     */
    public long reclaimed() {
        return get("reclaimed");
    }

    /**
     * Events released without using an attempt (broker outage, shutdown).
     *
     * @return events released without using an attempt (broker outage, shutdown)
     */
    public long releasedUnsent() {
        return get("released_unsent");
    }

    /**
     * Calls to the broker's publish (one may carry a batch of events).
     *
     * @return calls to the broker's publish
     */
    public long publishCalls() {
        return get("publish_calls");
    }

    /**
     * Database errors this relay met (claims, acks, reclaims, retention), each tried again later.
     *
     * @return database errors met
     */
    public long dbErrors() {
        return get("db_errors");
    }

    /**
     * Claimed events not yet acked, released or failed.
     *
     * @return claimed events not yet acked, released or failed
     */
    public long inFlight() {
        return get("in_flight");
    }

    /**
     * {@code closed}, {@code open} or {@code half-open}.
     *
     * @return {@code closed}, {@code open} or {@code half-open}
     */
    public String breakerState() {
        Object v = fields.get("breaker_state");
        return v == null ? null : v.toString();
    }

    /**
     * The database gauges, empty when they were not asked for or the database did not answer.
     *
     * @return the database gauges, empty when they were not asked for or the database did not answer
     */
    public Optional<Gauges> gauges() {
        return Optional.ofNullable(gauges);
    }

    @Override
    public String toString() {
        return json;
    }
}
