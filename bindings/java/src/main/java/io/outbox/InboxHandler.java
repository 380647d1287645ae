package io.outbox;

import java.sql.Connection;

/**
 * The business effect of one event, run by {@link OutboxInbox#process} only for a key the
 * consumer group has not processed. It is given the caller's connection: make its writes through
 * it, so they commit or roll back with the inbox mark.
 *
 * <p>{@code E} is what it may throw (inferred: a lambda that throws no checked exception makes it
 * {@link RuntimeException}, one that runs JDBC statements {@link java.sql.SQLException});
 * {@code process} rethrows it unchanged.
 *
 * @param <T> what the handler returns
 * @param <E> what the handler may throw
 */
@FunctionalInterface
public interface InboxHandler<T, E extends Exception> {
    /**
     * Applies the event's effect through {@code conn}.
     *
     * @param conn the caller's connection, in the transaction that holds the inbox mark
     * @return what {@link OutboxInbox#process} hands back in {@link InboxResult#value()}
     * @throws E to roll back (the caller's transaction), rethrown unchanged by {@code process}
     */
    T handle(Connection conn) throws E;
}
