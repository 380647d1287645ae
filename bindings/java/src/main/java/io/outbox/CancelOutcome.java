package io.outbox;

/** What {@link Outbox#cancel(long)} did to an event (docs/scheduling.md). */
public enum CancelOutcome {
    /** Deleted before it was sent (audited as {@code cancel}). */
    CANCELLED,
    /** An earlier cancel removed it. */
    ALREADY_CANCELLED,
    /** Claimed by a relay under a lease: it will be sent. */
    IN_FLIGHT,
    /** Sent (kept as SUCCESS, or deleted as sent while the cancel waited for its relay). */
    ALREADY_SENT,
    /** Dead-lettered (FAIL): not sent. */
    DEAD_LETTERED,
    /** Not in the table: sent and deleted ({@code sent.rows = delete}), purged, or never committed. */
    GONE
}
