package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.logging.Handler;
import java.util.logging.Level;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import org.junit.After;
import org.junit.AfterClass;
import org.junit.Before;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The native library's log records reach System.Logger (backed here by java.util.logging, as in
 * a JVM without an SLF4J/Log4j bridge) with their level and target, from Java threads and from
 * native threads the JVM has never seen.
 */
public class LoggingTest {
    private static TestDb db;
    /** Held strongly: java.util.logging keeps loggers weakly. */
    private static final Logger OUTBOX = Logger.getLogger("outbox");
    private final List<LogRecord> records = new CopyOnWriteArrayList<>();
    private final Handler capture = new Handler() {
        @Override
        public void publish(LogRecord r) {
            records.add(r);
        }

        @Override
        public void flush() {}

        @Override
        public void close() {}
    };

    @BeforeClass
    public static void setUp() {
        db = new TestDb();
        Outbox.migrate(db.config());
    }

    @AfterClass
    public static void tearDown() {
        if (db != null) {
            db.close();
        }
    }

    @Before
    public void addHandler() {
        OUTBOX.addHandler(capture);
    }

    @After
    public void removeHandler() {
        OUTBOX.removeHandler(capture);
        Outbox.setLogLevel(System.Logger.Level.INFO);
    }

    private LogRecord find(String logger, String text) {
        for (LogRecord r : records) {
            if (r.getLoggerName().equals(logger) && r.getMessage().contains(text)) {
                return r;
            }
        }
        return null;
    }

    @Test
    public void relay_start_is_logged_at_info_with_its_target() {
        try (Outbox outbox = Outbox.start(db.config().set("service.name", "logtest"))) {
            // Logged synchronously by start, on this thread.
            LogRecord r = find("outbox.relay", "enqueue-only");
            assertTrue("records: " + records, r != null);
            assertEquals(Level.INFO, r.getLevel());
            assertTrue(r.getMessage(), r.getMessage().contains(outbox.instanceId()));
            // java.util.logging's formatters print the source: the logger's name, not the binding's method.
            assertEquals("outbox.relay", r.getSourceClassName());
            assertEquals(null, r.getSourceMethodName());
            String line = new java.util.logging.SimpleFormatter().format(r);
            assertTrue(line, line.contains("outbox.relay") && !line.contains("Native"));
        }
    }

    @Test
    public void records_from_a_native_thread_reach_the_logger() {
        Native.ensureLoaded();
        Native.selfTestLog("hello from a native thread");
        LogRecord r = find("outbox.self_test", "hello from a native thread");
        assertTrue("records: " + records, r != null);
        assertEquals(Level.WARNING, r.getLevel());
    }

    @Test
    public void log_level_key_raises_the_threshold() {
        try (Outbox outbox = Outbox.start(db.config().set("service.name", "quiet").set("log.level", "warn"))) {
            assertFalse(outbox.isRelaying());
            assertTrue(find("outbox.relay", "enqueue-only") == null);
        }
        Native.selfTestLog("a warning still passes");
        assertTrue(find("outbox.self_test", "a warning still passes") != null);
        Outbox.setLogLevel(System.Logger.Level.OFF);
        Native.selfTestLog("silenced");
        assertTrue(find("outbox.self_test", "silenced") == null);
    }

    @Test
    public void a_throwing_logger_is_harmless() {
        Handler bad = new Handler() {
            @Override
            public void publish(LogRecord r) {
                throw new IllegalStateException("this handler always fails");
            }

            @Override
            public void flush() {}

            @Override
            public void close() {}
        };
        OUTBOX.addHandler(bad);
        try {
            Native.selfTestLog("to a failing handler");
            try (Outbox outbox = Outbox.start(db.config())) {
                assertFalse(outbox.isRelaying());
            }
        } finally {
            OUTBOX.removeHandler(bad);
        }
        Native.selfTestLog("after the failing handler");
        assertTrue(find("outbox.self_test", "after the failing handler") != null);
    }

    @Test
    public void dependency_targets_stay_under_outbox() {
        assertEquals("outbox.relay", Native.loggerName("outbox::relay"));
        assertEquals("outbox.mysql.conn.pool", Native.loggerName("mysql::conn::pool"));
        assertEquals("outbox", Native.loggerName("outbox"));
    }
}
