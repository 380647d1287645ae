package io.outbox;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;

/**
 * The native methods of {@code liboutbox} (Rust, {@code src/jni}) and how the library is found.
 * Not public API: its methods change with {@link #ABI_VERSION}.
 */
final class Native {
    /** Must equal {@code JNI_ABI_VERSION} in src/jni/mod.rs. */
    static final int ABI_VERSION = 1;

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
