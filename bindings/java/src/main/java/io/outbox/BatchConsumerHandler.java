package io.outbox;

import java.util.List;

/**
 * An {@link OutboxConsumer}'s batch handler ({@link OutboxConsumer#startBatch}): the new messages
 * of a batch (duplicates left out), in queue order, at once, inside the consumer's transaction
 * that holds their inbox marks, for handlers that write many rows in one statement.
 *
 * <p>Returning normally commits the batch. Throwing rolls it back, and the consumer calls the
 * handler again with one message at a time, so only the failing message is retried and parked:
 * a batch handler must also handle a list of one. Transient exceptions are as for
 * {@link ConsumerHandler}. The list is valid for the call only.
 */
@FunctionalInterface
public interface BatchConsumerHandler {
    void handle(OutboxTransaction tx, List<ConsumerMessage> messages) throws Exception;
}
