package io.outbox;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.junit.internal.TextListener;
import org.junit.runner.Description;
import org.junit.runner.JUnitCore;
import org.junit.runner.Result;
import org.junit.runner.notification.Failure;
import org.junit.runner.notification.RunListener;

/**
 * Runs the given test classes with {@link JUnitCore} and ends with a plain summary line
 * ({@code java: N passed, N failed, N skipped}); exits non-zero on any failure.
 */
public final class RunAll {
    private RunAll() {}

    /** Counts by test, so that a class skipped by an assumption in {@code @BeforeClass} counts all its tests as skipped. */
    static final class Counter extends RunListener {
        int started;
        int failed;
        int skipped;
        final Set<Description> notPassed = new HashSet<>();

        @Override
        public void testStarted(Description d) {
            started++;
        }

        @Override
        public void testFailure(Failure f) {
            failed += f.getDescription().isTest() ? 1 : Math.max(1, f.getDescription().testCount());
            notPassed.add(f.getDescription());
        }

        @Override
        public void testAssumptionFailure(Failure f) {
            if (f.getDescription().isTest()) {
                skipped++;
                notPassed.add(f.getDescription());
            } else {
                skipped += f.getDescription().testCount();
            }
        }

        @Override
        public void testIgnored(Description d) {
            skipped += d.isTest() ? 1 : d.testCount();
        }

        int passed() {
            int n = started;
            for (Description d : notPassed) {
                if (d.isTest()) {
                    n--;
                }
            }
            return n;
        }
    }

    public static void main(String[] args) throws Exception {
        List<Class<?>> classes = new ArrayList<>();
        for (String name : args) {
            classes.add(Class.forName(name));
        }
        JUnitCore core = new JUnitCore();
        core.addListener(new TextListener(System.out));
        Counter c = new Counter();
        core.addListener(c);
        Result r = core.run(classes.toArray(new Class<?>[0]));
        System.out.println("java: " + c.passed() + " passed, " + c.failed + " failed, " + c.skipped + " skipped");
        System.exit(r.wasSuccessful() ? 0 : 1);
    }
}
