package io.outbox;

/**
 * An {@link OutboxConsumer}'s handler: the service's code for one message, run inside the
 * consumer's transaction {@code tx}, which already holds the message's inbox mark.
 *
 * <ul>
 *   <li>Returning normally commits {@code tx}: the handler's writes and the mark together.</li>
 *   <li>Throwing rolls both back; the message is handled again after a backoff. A transient
 *       exception ({@link OutboxTransientException}, {@link java.sql.SQLTransientException}, a
 *       retriable {@link OutboxDatabaseException}, also as a cause) does not use an attempt; any
 *       other does, and after {@code consumer.max.attempts} the message is parked in the
 *       dead-letter table with the exception's class and message as its {@code last_error}.</li>
 *   <li>A statement through {@code tx} that failed transiently (a lock wait timeout, a deadlock, a
 *       lost connection) makes the call transient even if the handler catches the exception and
 *       returns: a deadlock has rolled the whole transaction back, mark included, so nothing
 *       after it may be committed.</li>
 * </ul>
 *
 * Write through {@code tx} only: what the handler does elsewhere is not undone by a rollback and
 * may happen more than once. It runs on the consumer's threads, several at once (a queue's
 * messages one at a time, in order): it must be thread-safe. It must not refer to its
 * {@link OutboxConsumer} (that would keep it reachable and defeat its Cleaner backstop).
 */
@FunctionalInterface
public interface ConsumerHandler {
    /**
     * Handles one message in {@code tx}.
     *
     * @param tx the consumer's transaction, holding the message's inbox mark; valid for the call only
     * @param message the message
     * @throws Exception to roll back and have the message handled again (see above for which
     *     exceptions use an attempt)
     */
    void handle(OutboxTransaction tx, ConsumerMessage message) throws Exception;
}
