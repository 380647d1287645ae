package io.outbox;

/** What {@link Outbox#stop} did. */
public final class StopReport {
    private final long released;
    private final long inFlightAtDeadline;
    private final boolean timedOut;
    private final boolean alreadyStopped;

    StopReport(long[] r) {
        this.released = r[0];
        this.inFlightAtDeadline = r[1];
        this.timedOut = r[2] != 0;
        this.alreadyStopped = r[3] != 0;
    }

    /**
     * Claimed-but-unsent events returned to WAIT during the stop.
     *
     * @return claimed-but-unsent events returned to WAIT during the stop
     */
    public long released() {
        return released;
    }

    /**
     * Events still held at the deadline (their leases expire and they are relayed again).
     *
     * @return events still held at the deadline (their leases expire and they are relayed again)
     */
    public long inFlightAtDeadline() {
        return inFlightAtDeadline;
    }

    /**
     * Whether some relay thread was still running at the deadline.
     *
     * @return whether some relay thread was still running at the deadline
     */
    public boolean timedOut() {
        return timedOut;
    }

    /**
     * Whether an earlier call had stopped the relay already.
     *
     * @return whether an earlier call had stopped the relay already
     */
    public boolean alreadyStopped() {
        return alreadyStopped;
    }

    @Override
    public String toString() {
        return "StopReport{released=" + released + ", inFlightAtDeadline=" + inFlightAtDeadline + ", timedOut=" + timedOut
                + ", alreadyStopped=" + alreadyStopped + "}";
    }
}
