package io.outbox;

/**
 * Told of every event the relay dead-letters (status FAIL), for alerting. Called on a relay
 * thread: keep it short and never block on the relay. An exception it throws is printed and
 * ignored. It must not hold a reference to the {@link Outbox}, or the Cleaner backstop cannot
 * run for a relay that is never closed.
 */
@FunctionalInterface
public interface DeadLetterListener {
    void onDeadLetter(DeadLetter letter);
}
