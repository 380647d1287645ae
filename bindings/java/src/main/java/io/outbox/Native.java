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
    static final int ABI_VERSION = 7;

    /** System property naming the library file, or a directory holding it. */
    static final String PATH_PROPERTY = "outbox.library.path";
    /** Environment variable used when the system property is not set. */
    static final String PATH_ENV = "OUTBOX_LIBRARY_PATH";
    /** System property naming the directory the bundled library is extracted to. */
    static final String NATIVE_DIR_PROPERTY = "outbox.native.dir";
    /** Where a jar carries the library: {@code <this>/<os>-<arch>/liboutbox.so} and its {@code .sha256}. */
    static final String BUNDLE_ROOT = "/io/outbox/native/";

    private static final Object LOCK = new Object();
    /** Where the library was loaded from; {@code null} until it is. */
    private static volatile String loadedFrom;

    private Native() {}

    /**
     * Loads the library if no one has yet: the property, the environment variable, the library
     * this jar carries for the platform, then java.library.path.
     */
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
            if (loadBundled(name)) {
                return;
            }
            try {
                System.loadLibrary("outbox");
            } catch (UnsatisfiedLinkError e) {
                throw new OutboxLibraryException(
                        "could not load the outbox native library: " + name + " is not in java.library.path = "
                                + System.getProperty("java.library.path") + " (" + e.getMessage() + "), and neither -D"
                                + PATH_PROPERTY + " nor $" + PATH_ENV + " is set, and this jar carries no library for " + platform()
                                + ". Use the jar built with `build.sh --native`, or build the library with "
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

    /** {@code linux-x86_64}, {@code linux-aarch64}, {@code macos-aarch64}, ...: the bundle directory of this JVM. */
    static String platform() {
        String os = System.getProperty("os.name", "").toLowerCase(java.util.Locale.ROOT);
        String arch = System.getProperty("os.arch", "").toLowerCase(java.util.Locale.ROOT);
        if (os.startsWith("linux")) {
            os = "linux";
        } else if (os.startsWith("mac") || os.startsWith("darwin")) {
            os = "macos";
        } else if (os.startsWith("windows")) {
            os = "windows";
        }
        if (arch.equals("amd64") || arch.equals("x86_64")) {
            arch = "x86_64";
        } else if (arch.equals("arm64") || arch.equals("aarch64")) {
            arch = "aarch64";
        }
        return os + "-" + arch;
    }

    /**
     * Loads the library this jar carries for this platform, if it carries one: extracted once
     * into {@code -Doutbox.native.dir} (default {@code <java.io.tmpdir>/outbox-native-<user>}) under
     * a name holding its SHA-256, checked against the jar's {@code .sha256} before every load
     * (a file that does not match is replaced, never loaded).
     */
    private static boolean loadBundled(String name) {
        String resource = BUNDLE_ROOT + platform() + "/" + name;
        java.net.URL lib = Native.class.getResource(resource);
        java.net.URL sum = Native.class.getResource(resource + ".sha256");
        if (lib == null || sum == null) {
            return false;
        }
        String where = resource;
        try {
            String expected;
            try (java.io.InputStream in = sum.openStream()) {
                expected = new String(in.readAllBytes(), java.nio.charset.StandardCharsets.US_ASCII).trim().split("\\s+")[0];
            }
            String dirProp = System.getProperty(NATIVE_DIR_PROPERTY);
            Path dir = dirProp != null && !dirProp.trim().isEmpty() ? Paths.get(dirProp.trim())
                    : Paths.get(System.getProperty("java.io.tmpdir"), "outbox-native-" + System.getProperty("user.name", "user"));
            Files.createDirectories(dir);
            String base = name.replace(".so", "").replace(".dylib", "").replace(".dll", "");
            String ext = name.substring(base.length());
            Path file = dir.resolve(base + "-" + expected.substring(0, Math.min(16, expected.length())) + ext);
            where = file + " (extracted from " + resource + ")";
            if (!Files.isRegularFile(file) || !expected.equals(sha256(file))) {
                Path tmp = Files.createTempFile(dir, base, ".part");
                try {
                    try (java.io.InputStream in = lib.openStream()) {
                        Files.copy(in, tmp, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
                    }
                    String got = sha256(tmp);
                    if (!expected.equals(got)) {
                        throw new OutboxLibraryException("the native library in the jar (" + resource + ") has SHA-256 " + got
                                + " but the jar says " + expected + ": the jar is damaged", null);
                    }
                    try {
                        Files.move(tmp, file, java.nio.file.StandardCopyOption.ATOMIC_MOVE);
                    } catch (java.nio.file.AtomicMoveNotSupportedException e) {
                        Files.move(tmp, file, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
                    }
                } finally {
                    Files.deleteIfExists(tmp);
                }
                if (!expected.equals(sha256(file))) {
                    throw new OutboxLibraryException("the extracted native library " + file + " does not match the jar's SHA-256 "
                            + expected + " (changed by another process?); not loaded", null);
                }
            }
            System.load(file.toString());
        } catch (java.io.IOException e) {
            throw new OutboxLibraryException("could not extract the native library carried by the jar (" + resource + ") to "
                    + where + ": " + e + "; set -D" + NATIVE_DIR_PROPERTY + " to a writable directory, or -D" + PATH_PROPERTY
                    + " to a library file", e);
        } catch (UnsatisfiedLinkError e) {
            throw new OutboxLibraryException("could not load the native library " + where + ": " + e.getMessage(), e);
        }
        checkAbi(where);
        installLogger();
        loadedFrom = where;
        return true;
    }

    private static String sha256(Path file) throws java.io.IOException {
        java.security.MessageDigest md;
        try {
            md = java.security.MessageDigest.getInstance("SHA-256");
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
        try (java.io.InputStream in = Files.newInputStream(file)) {
            byte[] buf = new byte[1 << 16];
            for (int n; (n = in.read(buf)) > 0;) {
                md.update(buf, 0, n);
            }
        }
        StringBuilder hex = new StringBuilder();
        for (byte b : md.digest()) {
            hex.append(String.format("%02x", b));
        }
        return hex.toString();
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
     * Whether {@code System.Logger} is backed by {@code java.util.logging} (the JDK's default, no
     * SLF4J/Log4j bridge installed). Then records go to {@code java.util.logging} directly, with
     * the logger name as their source: its formatters print the record's source, which through
     * {@code System.Logger} would be this class's {@code log} method for every record.
     */
    private static final boolean JUL = System.LoggerFinder.getLoggerFinder().getClass().getName()
            .equals("sun.util.logging.internal.LoggingProviderImpl");

    /** Held strongly: {@code java.util.logging} keeps its loggers weakly. */
    private static final ConcurrentHashMap<String, java.util.logging.Logger> JUL_LOGGERS = new ConcurrentHashMap<>();

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
        if (JUL) {
            String name = loggerName(target);
            java.util.logging.Logger jul = JUL_LOGGERS.computeIfAbsent(name, java.util.logging.Logger::getLogger);
            jul.logp(julLevel(l), name, null, message);
            return;
        }
        LOGGERS.computeIfAbsent(target, t -> System.getLogger(loggerName(t))).log(l, message);
    }

    /** The {@code java.util.logging} level of a {@code System.Logger} level (the JDK's own mapping). */
    private static java.util.logging.Level julLevel(Level l) {
        switch (l) {
            case ERROR:
                return java.util.logging.Level.SEVERE;
            case WARNING:
                return java.util.logging.Level.WARNING;
            case INFO:
                return java.util.logging.Level.INFO;
            case DEBUG:
                return java.util.logging.Level.FINE;
            default:
                return java.util.logging.Level.FINER;
        }
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

    /** {@code [key0, doc0, redaction0, key1, ...]}: a redaction is {@code secret}, {@code url} or empty. */
    static native String[] configKeyDocs();

    static native String configDefault(String key);

    static native void configCheck(String key, String value);

    static native void configValidate(String[] keys, String[] values);

    static native String insertStatement(String table, boolean scheduled);

    static native String[] insertParams(boolean scheduled);

    static native String checkEvent(String bizNo, String eventType, byte[] payload, String topic, String tag,
            String[] headerKeys, String[] headerValues, long deliverAtMs, long delayMs, long payloadMaxBytes);

    static native int[] migrateConfig(String[] keys, String[] values);

    static native int[] migrateConsumerConfig(String[] keys, String[] values);

    /** {@code [relays, transactions, consumers]} open in this process. */
    static native long[] liveHandles();

    static native void selfTestPanic();

    static native boolean selfTestDeadLetter(long handle);

    // --- relay
    static native long start(String[] keys, String[] values, DeadLetterListener deadLetters);

    static native void notifyRelay(long handle);

    static native int cancel(long handle, long eventId);

    static native long cancelByBizNo(long handle, String bizNo, String eventType);

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
            String[] headerKeys, String[] headerValues, long deliverAtMs, long delayMs);

    static native void txCommit(long tx);

    static native void txRollback(long tx);

    // --- consumer runtime (OutboxConsumer)

    /** Starts a consumer; {@code dispatcher.dispatch} runs on its threads. Returns its handle. */
    static native long consumerStart(String[] keys, String[] values, String topic, String group,
            OutboxConsumer.Dispatcher dispatcher, boolean batch);

    /** The consumer's counters as JSON. */
    static native String consumerStats(long handle);

    /** Stops the consumer (blocking) and returns its final counters as JSON; the handle stays open. */
    static native String consumerStop(long handle);

    /** Stops (if needed) and releases the consumer; its final counters as JSON, or null for a handle not open. */
    static native String consumerClose(long handle);
}
