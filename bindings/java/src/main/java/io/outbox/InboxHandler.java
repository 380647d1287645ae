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
 */
@FunctionalInterface
public interface InboxHandler<T, E extends Exception> {
    T handle(Connection conn) throws E;
}
