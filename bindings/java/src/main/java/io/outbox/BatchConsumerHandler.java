package io.outbox;

import java.util.List;

/**
 * An {@link OutboxConsumer}'s batch handler ({@link OutboxConsumer#startBatch}): the new messages
 * of a batch (duplicates left out), in route order ({@code consumer.route}; by default queue
 * order), at once, inside the consumer's transaction that holds their inbox marks, for handlers that write many rows in one statement.
 *
 * <p>Returning normally commits the batch. Throwing rolls it back, and the consumer calls the
 * handler again with one message at a time, so only the failing message is retried and parked:
 * a batch handler must also handle a list of one. Transient exceptions are as for
 * {@link ConsumerHandler}. The list is valid for the call only.
 */
@FunctionalInterface
public interface BatchConsumerHandler {
    /**
     * Handles the batch's new messages in {@code tx}.
     *
     * @param tx the consumer's transaction, holding the messages' inbox marks; valid for the call only
     * @param messages the new messages of the batch, in route order (at least one)
     * @throws Exception to roll the batch back and have its messages handled one at a time
     */
    void handle(OutboxTransaction tx, List<ConsumerMessage> messages) throws Exception;
}
