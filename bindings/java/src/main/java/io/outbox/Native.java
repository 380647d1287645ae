package io.outbox;

import java.lang.System.Logger.Level;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The native methods of {@code liboutbox} (Rust, {@code src/jni}) and how the library is found.
 * Not public API: its methods change with {@link #ABI_VERSION}.
 */
final class Native {
    /** Must equal {@code JNI_ABI_VERSION} in src/jni/mod.rs. */
    static final int ABI_VERSION = 2;

    /** System property naming the library file, or a directory holding it. */
    static final String PATH_PROPERTY = "outbox.library.path";
    /** Environment variable used when the system property is not set. */
    static final String PATH_ENV = "OUTBOX_LIBRARY_PATH";

    private static final Object LOCK = new Object();
    /** Where the library was loaded from; {@code null} until it is. */
    private static volatile String loadedFrom;

    private Native() {}

    /** Loads the library if no one has yet: the property, the environment variable, then java.library.path. */
    static void ensureLoaded() {
        if (loadedFrom != null) {
            return;
        }
        synchronized (LOCK) {
            if (loadedFrom != null) {
                return;
            }
            String prop = System.getProperty(PATH_PROPERTY);
            if (prop != null && !prop.trim().isEmpty()) {
                load(Paths.get(prop.trim()), "system property " + PATH_PROPERTY);
                return;
            }
            String env = System.getenv(PATH_ENV);
            if (env != null && !env.trim().isEmpty()) {
                load(Paths.get(env.trim()), "environment variable " + PATH_ENV);
                return;
            }
            String name = System.mapLibraryName("outbox");
            try {
                System.loadLibrary("outbox");
            } catch (UnsatisfiedLinkError e) {
                throw new OutboxLibraryException(
                        "could not load the outbox native library: " + name + " is not in java.library.path = "
                                + System.getProperty("java.library.path") + " (" + e.getMessage() + "), and neither -D"
                                + PATH_PROPERTY + " nor $" + PATH_ENV + " is set. Build it with "
                                + "`cargo build --release --features jni` and pass -Djava.library.path=<dir with " + name
                                + ">, -D" + PATH_PROPERTY + "=<file or dir>, or call Outbox.loadLibrary(path)",
                        e);
            }
            checkAbi("java.library.path (" + name + ")");
            installLogger();
            loadedFrom = "java.library.path";
        }
    }

    /** Loads the library from {@code path}: the file itself, or a directory holding {@code liboutbox.so}. */
    static void load(Path path, String source) {
        Path file = Files.isDirectory(path) ? path.resolve(System.mapLibraryName("outbox")) : path;
        file = file.toAbsolutePath().normalize();
        if (!Files.isRegularFile(file)) {
            throw new OutboxLibraryException("no outbox native library at " + file + " (from " + source + "); build it with "
                    + "`cargo build --release --features jni` (target/release/" + System.mapLibraryName("outbox") + ")", null);
        }
        synchronized (LOCK) {
            String where = file.toString();
            if (loadedFrom != null) {
                if (loadedFrom.equals(where)) {
                    return;
                }
                throw new IllegalStateException("the outbox native library is already loaded (from " + loadedFrom
                        + "); a JVM loads it once, so " + where + " cannot be loaded too");
            }
            try {
                System.load(where);
            } catch (UnsatisfiedLinkError e) {
                throw new OutboxLibraryException("could not load the outbox native library " + where + " (from " + source
                        + "): " + e.getMessage(), e);
            }
            checkAbi(where);
            installLogger();
            loadedFrom = where;
        }
    }

    static String loadedFrom() {
        return loadedFrom;
    }

    private static void checkAbi(String where) {
        int abi;
        try {
            abi = abiVersion();
        } catch (UnsatisfiedLinkError e) {
            throw new OutboxLibraryException("the library loaded from " + where + " has no JNI entry points: it was built "
                    + "without the cargo feature `jni` (build it with `cargo build --release --features jni`)", e);
        }
        if (abi != ABI_VERSION) {
            throw new OutboxLibraryException("the library loaded from " + where + " speaks JNI ABI version " + abi
                    + " but this outbox.jar needs version " + ABI_VERSION + "; use the jar and library of one release", null);
        }
    }

    // --- logging

    private static final ConcurrentHashMap<String, System.Logger> LOGGERS = new ConcurrentHashMap<>();

    /**
     * The {@code System.Logger} name of a native log target: {@code outbox::relay} becomes
     * {@code outbox.relay}; targets of the library's dependencies go under {@code outbox.}
     * ({@code mysql::conn} becomes {@code outbox.mysql.conn}).
     */
    static String loggerName(String target) {
        String name = target.replace("::", ".");
        return name.equals("outbox") || name.startsWith("outbox.") ? name : "outbox." + name;
    }

    /**
     * Called by the native library for each log record, on the thread that logged (a relay
     * thread or the caller's). Never throws: a failing logger is the native side's problem to
     * report on stderr.
     */
    static void log(int level, String target, String message) {
        System.Logger logger = LOGGERS.computeIfAbsent(target, t -> System.getLogger(loggerName(t)));
        Level l;
        switch (level) {
            case 1:
                l = Level.ERROR;
                break;
            case 2:
                l = Level.WARNING;
                break;
            case 3:
                l = Level.INFO;
                break;
            case 4:
                l = Level.DEBUG;
                break;
            default:
                l = Level.TRACE;
                break;
        }
        logger.log(l, message);
    }

    /** Routes the library's log records to {@link #log}. */
    static native void installLogger();

    /** 0 off, 1 error, 2 warn, 3 info, 4 debug, 5 trace. */
    static native void setLogLevel(int level);

    /** Logs {@code message} at WARN (target {@code outbox::self_test}) from a new native thread. */
    static native void selfTestLog(String message);

    // --- library
    static native int abiVersion();

    static native String version();

    static native String[] features();

    static native String[] configKeyDocs();

    static native String configDefault(String key);

    static native void configCheck(String key, String value);

    static native void configValidate(String[] keys, String[] values);

    static native String insertStatement(String table);

    static native String[] insertParams();

    static native String checkEvent(String bizNo, String eventType, byte[] payload, String topic, String tag,
            String[] headerKeys, String[] headerValues, long payloadMaxBytes);

    static native int[] migrateConfig(String[] keys, String[] values);

    static native long[] liveHandles();

    static native void selfTestPanic();

    static native boolean selfTestDeadLetter(long handle);

    // --- relay
    static native long start(String[] keys, String[] values, DeadLetterListener deadLetters);

    static native void notifyRelay(long handle);

    static native String stats(long handle, boolean withGauges);

    static native String instanceId(long handle);

    static native boolean isRelaying(long handle);

    static native String relayConfigGet(long handle, String key);

    static native int[] migrate(long handle);

    static native long[] stop(long handle, long timeoutMs);

    static native long[] close(long handle, long timeoutMs);

    // --- library-owned transactions
    static native long txBegin(long relay);

    static native long txExecute(long tx, String sql, byte[] kinds, long[] ints, double[] doubles, Object[] blobs);

    static native long[] txQueryLong(long tx, String sql, byte[] kinds, long[] ints, double[] doubles, Object[] blobs);

    static native long txLastInsertId(long tx);

    static native long txEnqueue(long tx, String bizNo, String eventType, byte[] payload, String topic, String tag,
            String[] headerKeys, String[] headerValues);

    static native void txCommit(long tx);

    static native void txRollback(long tx);
}
