package io.outbox;

/**
 * Told of every event the relay dead-letters (status FAIL), for alerting. Called on a relay
 * thread: keep it short and never block on the relay. An exception it throws is printed and
 * ignored. It must not hold a reference to the {@link Outbox}, or the Cleaner backstop cannot
 * run for a relay that is never closed.
 */
@FunctionalInterface
public interface DeadLetterListener {
    /**
     * Called once for each event the relay dead-letters.
     *
     * @param letter the event, with its last error
     */
    void onDeadLetter(DeadLetter letter);
}
