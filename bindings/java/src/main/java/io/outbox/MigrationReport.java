package io.outbox;

import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/** What a migration did. */
public final class MigrationReport {
    private final List<Integer> applied;
    private final int current;

    /** {@code r = [current, applied...]} from the native library. */
    MigrationReport(int[] r) {
        this.current = r[0];
        List<Integer> a = new ArrayList<>();
        for (int i = 1; i < r.length; i++) {
            a.add(r[i]);
        }
        this.applied = Collections.unmodifiableList(a);
    }

    /**
     * Versions applied by this call, in order (empty when the schema was up to date).
     *
     * @return versions applied by this call, in order (empty when the schema was up to date)
     */
    public List<Integer> applied() {
        return applied;
    }

    /**
     * The schema version after the call.
     *
     * @return the schema version after the call
     */
    public int current() {
        return current;
    }

    @Override
    public String toString() {
        return "MigrationReport{applied=" + applied + ", current=" + current + "}";
    }
}
