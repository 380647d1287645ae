package io.outbox;

import java.util.Map;
import java.util.Optional;
import java.util.OptionalLong;

/**
 * A snapshot of an {@link OutboxConsumer}'s counters (totals since it started). {@link #json()}
 * is the library's JSON as is; {@link #get(String)} reads any counter by its JSON name, so
 * counters added by later library versions are readable before this class names them.
 */
public final class OutboxConsumerStats {
    private final String json;
    private final Map<String, Object> fields;

    OutboxConsumerStats(String json) {
        this.json = json;
        this.fields = Json.object(json);
    }

    /**
     * The counter {@code name} as the JSON names it ({@code processed}, {@code failed_attempts}, ...); 0 when absent.
     *
     * @param name the counter's JSON name
     * @return the counter {@code name} as the JSON names it ({@code processed}, {@code failed_attempts}, ...); 0 when absent
     */
    public long get(String name) {
        Object v = fields.get(name);
        return v instanceof Number ? ((Number) v).longValue() : 0L;
    }

    /**
     * Messages taken from the broker.
     *
     * @return messages taken from the broker
     */
    public long received() {
        return get("received");
    }

    /**
     * Messages whose handler ran and whose transaction committed.
     *
     * @return messages whose handler ran and whose transaction committed
     */
    public long processed() {
        return get("processed");
    }

    /**
     * Copies whose key the group had already processed: acknowledged without running the handler.
     *
     * @return copies whose key the group had already processed: acknowledged without running the handler
     */
    public long duplicates() {
        return get("duplicates");
    }

    /**
     * Handler attempts that failed (each retried or, the last, parked); transient failures are not counted here.
     *
     * @return handler attempts that failed (each retried or, the last, parked); transient failures are not counted here
     */
    public long failedAttempts() {
        return get("failed_attempts");
    }

    /**
     * Messages parked in the dead-letter table.
     *
     * @return messages parked in the dead-letter table
     */
    public long deadLettered() {
        return get("dead_lettered");
    }

    /**
     * Later copies of a parked key added to its dead letter.
     *
     * @return later copies of a parked key added to its dead letter
     */
    public long parkedCopies() {
        return get("parked_copies");
    }

    /**
     * Dead letters handled again after a replay request.
     *
     * @return dead letters handled again after a replay request
     */
    public long replayed() {
        return get("replayed");
    }

    /**
     * Transient failures (database trouble, {@link OutboxTransientException}) retried without using an attempt.
     *
     * @return transient failures (database trouble, {@link OutboxTransientException}) retried without using an attempt
     */
    public long dbErrors() {
        return get("db_errors");
    }

    /**
     * Messages without an {@code eventKey} property (deduplicated on a fallback key).
     *
     * @return messages without an {@code eventKey} property (deduplicated on a fallback key)
     */
    public long fallbackKeys() {
        return get("fallback_keys");
    }

    /**
     * Handler transactions committed (one per batch).
     *
     * @return handler transactions committed (one per batch)
     */
    public long transactions() {
        return get("transactions");
    }

    /**
     * Batches rolled back and handled again one message per transaction.
     *
     * @return batches rolled back and handled again one message per transaction
     */
    public long batchFallbacks() {
        return get("batch_fallbacks");
    }

    /**
     * @return batches rolled back by a deadlock or a lock wait timeout and run again as a batch
     *     (no attempt used)
     */
    public long batchRetries() {
        return get("batch_retries");
    }

    /**
     * Messages taken and not yet done.
     *
     * @return messages taken and not yet done
     */
    public long inFlight() {
        return get("in_flight");
    }

    /**
     * Messages on the assigned queues not yet committed; empty until known.
     *
     * @return messages on the assigned queues not yet committed; empty until known
     */
    public OptionalLong lag() {
        Object v = fields.get("lag");
        return v instanceof Number ? OptionalLong.of(((Number) v).longValue()) : OptionalLong.empty();
    }

    /**
     * Whether the consumer can take messages now.
     *
     * @return whether the consumer can take messages now
     */
    public boolean isHealthy() {
        return Boolean.TRUE.equals(fields.get("healthy"));
    }

    /**
     * Why the consumer cannot take messages now (the name server or broker unreachable, ...).
     *
     * @return why the consumer cannot take messages now (the name server or broker unreachable, ...)
     */
    public Optional<String> unhealthyReason() {
        Object v = fields.get("unhealthy");
        return v == null ? Optional.empty() : Optional.of(v.toString());
    }

    /**
     * Whether these are the final counts of a stopped consumer.
     *
     * @return whether these are the final counts of a stopped consumer
     */
    public boolean isStopped() {
        return Boolean.TRUE.equals(fields.get("stopped"));
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

    @Override
    public String toString() {
        return json;
    }
}
