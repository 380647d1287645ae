package io.outbox;

/** An event that ended FAIL after its last attempt, as handed to a {@link DeadLetterListener}. */
public final class DeadLetter {
    private final long id;
    private final String bizNo;
    private final String eventType;
    private final int retryCount;
    private final String lastError;

    /** Called by the native library. */
    DeadLetter(long id, String bizNo, String eventType, int retryCount, String lastError) {
        this.id = id;
        this.bizNo = bizNo;
        this.eventType = eventType;
        this.retryCount = retryCount;
        this.lastError = lastError;
    }

    /**
     * The row's id.
     *
     * @return the row's id
     */
    public long id() {
        return id;
    }

    /**
     * The event's business number.
     *
     * @return the event's business number
     */
    public String bizNo() {
        return bizNo;
    }

    /**
     * The event's type.
     *
     * @return the event's type
     */
    public String eventType() {
        return eventType;
    }

    /**
     * Attempts made, counting the last one.
     *
     * @return attempts made, counting the last one
     */
    public int retryCount() {
        return retryCount;
    }

    /**
     * Why the last attempt failed.
     *
     * @return why the last attempt failed
     */
    public String lastError() {
        return lastError;
    }

    @Override
    public String toString() {
        return "DeadLetter{id=" + id + ", bizNo=" + bizNo + ", eventType=" + eventType + ", retryCount=" + retryCount
                + ", lastError=" + lastError + "}";
    }
}
