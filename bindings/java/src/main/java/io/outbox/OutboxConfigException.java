package io.outbox;

import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/**
 * A configuration key or value is wrong. The message names the key and the value; {@link #kind()}
 * tells an unknown key from a bad value from values that do not work together.
 */
public class OutboxConfigException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /** What is wrong. */
    public enum Kind {
        /** The key is not a configuration key. */
        UNKNOWN_KEY,
        /** The key exists but the value is not acceptable. */
        INVALID_VALUE,
        /** Each value is fine alone, but they do not work together ({@link #keys()} names them). */
        INCONSISTENT
    }

    /** What is wrong. */
    private final Kind kind;
    /** The keys involved. */
    private final List<String> keys;
    /** The refused value. */
    private final String value;
    /** Why, without the key and value. */
    private final String reason;

    /** Called by the native library. */
    OutboxConfigException(String kind, String[] keys, String value, String reason, String message) {
        super(message);
        this.kind = Kind.valueOf(kind);
        this.keys = Collections.unmodifiableList(Arrays.asList(keys.clone()));
        this.value = value;
        this.reason = reason;
    }

    /**
     * What is wrong: an unknown key, a bad value, or values that do not work together.
     *
     * @return what is wrong
     */
    public Kind kind() {
        return kind;
    }

    /**
     * The key at fault (the first one, for {@link Kind#INCONSISTENT}).
     *
     * @return the key at fault (the first one, for {@link Kind#INCONSISTENT})
     */
    public String key() {
        return keys.isEmpty() ? null : keys.get(0);
    }

    /**
     * Every key involved.
     *
     * @return every key involved
     */
    public List<String> keys() {
        return keys;
    }

    /**
     * The refused value, for {@link Kind#INVALID_VALUE}; {@code null} otherwise.
     *
     * @return the refused value, for {@link Kind#INVALID_VALUE}; {@code null} otherwise
     */
    public String value() {
        return value;
    }

    /**
     * Why, without the key and value.
     *
     * @return why, without the key and value
     */
    public String reason() {
        return reason;
    }
}
