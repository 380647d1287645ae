package io.outbox;

import java.util.Objects;

/**
 * What {@link OutboxInbox#process} did: the key was new and the handler ran ({@link #value()} is
 * what it returned), or the consumer group had already processed the key and the handler did not
 * run ({@link #isDuplicate()}). Either way, once the transaction is committed, acknowledge the
 * message to the broker.
 *
 * @param <T> what the handler returns
 */
public final class InboxResult<T> {
    private static final InboxResult<?> DUPLICATE = new InboxResult<>(true, null);

    private final boolean duplicate;
    private final T value;

    private InboxResult(boolean duplicate, T value) {
        this.duplicate = duplicate;
        this.value = value;
    }

    static <T> InboxResult<T> processed(T value) {
        return new InboxResult<>(false, value);
    }

    @SuppressWarnings("unchecked")
    static <T> InboxResult<T> duplicate() {
        return (InboxResult<T>) DUPLICATE;
    }

    /**
     * Whether the group had already processed the key (a committed mark exists): the handler did not run.
     *
     * @return whether the group had already processed the key (a committed mark exists): the handler did not run
     */
    public boolean isDuplicate() {
        return duplicate;
    }

    /**
     * What the handler returned; {@code null} for a duplicate (use {@link #isDuplicate()} to tell
     * it from a handler that returned {@code null}).
      *
     * @return what the handler returned, or {@code null}
     */
    public T value() {
        return value;
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof InboxResult)) {
            return false;
        }
        InboxResult<?> r = (InboxResult<?>) o;
        return duplicate == r.duplicate && Objects.equals(value, r.value);
    }

    @Override
    public int hashCode() {
        return Objects.hash(duplicate, value);
    }

    @Override
    public String toString() {
        return duplicate ? "Duplicate" : "Processed(" + value + ")";
    }
}
