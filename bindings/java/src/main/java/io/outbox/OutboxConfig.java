package io.outbox;

import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;

/**
 * The relay's configuration: the library's string keys and values ({@code db.url},
 * {@code scan.interval.ms}, {@code publisher}, ...; see {@link #keys()} and the project README).
 * Unset keys keep the library's defaults.
 *
 * <p>Each {@link #set} is checked at once by the native library: an unknown key or a bad value
 * throws {@link OutboxConfigException} naming the key and the value. Checks between keys
 * ({@code send.timeout.ms} against {@code lease.ms}, ...) run in {@link #validate()} and in
 * {@link Outbox#start}.
 *
 * <pre>{@code
 * OutboxConfig config = new OutboxConfig()
 *         .set("db.url", "mysql://app:secret@127.0.0.1:3306/orders")
 *         .set("publisher", "rocketmq")
 *         .set("rocketmq.namesrv", "127.0.0.1:9876")
 *         .set("scan.interval.ms", 500);
 * }</pre>
 *
 * Not thread-safe while being built; {@link Outbox#start} takes a snapshot.
 */
public final class OutboxConfig {
    private final LinkedHashMap<String, String> values = new LinkedHashMap<>();

    /** An empty configuration: every key at its default ({@code db.url} is required). */
    public OutboxConfig() {}

    /**
     * A copy of {@code other}.
     *
     * @param other the configuration to copy
     */
    public OutboxConfig(OutboxConfig other) {
        values.putAll(other.values);
    }

    /**
     * The keys whose names start with {@code prefix} (which is removed), e.g. {@code outbox.} in a
     * Spring {@code application.properties}: {@code outbox.db.url=...}. Each is checked like {@link #set}.
     *
     * @param properties the properties
     * @param prefix the prefix of the keys to take, or {@code null} for every property
     * @return the configuration
     */
    public static OutboxConfig fromProperties(Properties properties, String prefix) {
        OutboxConfig c = new OutboxConfig();
        String p = prefix == null ? "" : prefix;
        for (String name : properties.stringPropertyNames()) {
            if (name.startsWith(p)) {
                c.set(name.substring(p.length()), properties.getProperty(name));
            }
        }
        return c;
    }

    /**
     * Sets {@code key} to {@code value}, checked now (unknown key, bad value).
     *
     * @param key the key, as {@code outboxd config example} lists them
     * @param value the value
     * @return this configuration
     */
    public OutboxConfig set(String key, String value) {
        Objects.requireNonNull(key, "key");
        Objects.requireNonNull(value, "value");
        Native.ensureLoaded();
        Native.configCheck(key, value);
        values.put(key, value);
        return this;
    }

    /**
     * Sets a numeric key.
     *
     * @param key the key
     * @param value the value
     * @return this configuration
     */
    public OutboxConfig set(String key, long value) {
        return set(key, Long.toString(value));
    }

    /**
     * Sets a boolean key.
     *
     * @param key the key
     * @param value the value
     * @return this configuration
     */
    public OutboxConfig set(String key, boolean value) {
        return set(key, Boolean.toString(value));
    }

    /**
     * For the {@code *.ms} keys.
     *
     * @param key the key
     * @param value the value, in milliseconds
     * @return this configuration
     */
    public OutboxConfig set(String key, Duration value) {
        return set(key, Long.toString(value.toMillis()));
    }

    /**
     * Shorthand for {@code set("db.url", url)}.
     *
     * @param url {@code mysql://user:pass@host:port/db}
     * @return this configuration
     */
    public OutboxConfig dbUrl(String url) {
        return set("db.url", url);
    }

    /**
     * Removes {@code key}: the default applies again.
     *
     * @param key the key
     * @return this configuration
     */
    public OutboxConfig unset(String key) {
        values.remove(key);
        return this;
    }

    /**
     * The value set for {@code key}, or the library's default.
     *
     * @param key the key
     * @return the value set for {@code key}, or the library's default
     */
    public String get(String key) {
        String v = values.get(key);
        if (v != null) {
            return v;
        }
        Native.ensureLoaded();
        return Native.configDefault(key);
    }

    /**
     * Whether {@code key} was set.
     *
     * @param key the key
     * @return whether {@code key} was set
     */
    public boolean isSet(String key) {
        return values.containsKey(key);
    }

    /**
     * The keys set so far and their values, in the order set.
     *
     * @return the keys set so far and their values, in the order set
     */
    public Map<String, String> asMap() {
        return Collections.unmodifiableMap(new LinkedHashMap<>(values));
    }

    /**
     * Every key the library knows, with what it means, in documentation order.
     *
     * @return every key the library knows, with what it means, in documentation order
     */
    public static Map<String, String> keys() {
        return Keys.ofLibrary().docs;
    }

    /** The library's keys, read from it once: their docs and how their values are shown. */
    private static final class Keys {
        private static volatile Keys read;

        final Map<String, String> docs;
        /** {@code secret} (shown as {@code ***}) or {@code url} (its password hidden), by key. */
        final Map<String, String> redactions;

        private Keys(String[] flat) {
            LinkedHashMap<String, String> d = new LinkedHashMap<>();
            Map<String, String> r = new HashMap<>();
            for (int i = 0; i + 2 < flat.length; i += 3) {
                d.put(flat[i], flat[i + 1]);
                if (!flat[i + 2].isEmpty()) {
                    r.put(flat[i], flat[i + 2]);
                }
            }
            docs = Collections.unmodifiableMap(d);
            redactions = Collections.unmodifiableMap(r);
        }

        static Keys ofLibrary() {
            Keys k = read;
            if (k == null) {
                Native.ensureLoaded();
                k = new Keys(Native.configKeyDocs());
                read = k;
            }
            return k;
        }
    }

    /**
     * Checks the whole configuration, the values against each other too (what {@link Outbox#start} does first).
     *
     * @return this configuration
     * @throws OutboxConfigException a value is wrong or values do not work together
     */
    public OutboxConfig validate() {
        Native.ensureLoaded();
        Native.configValidate(keyArray(), valueArray());
        return this;
    }

    String[] keyArray() {
        return values.keySet().toArray(new String[0]);
    }

    String[] valueArray() {
        return values.values().toArray(new String[0]);
    }

    /** The settings, with secrets and the database password masked. */
    @Override
    public String toString() {
        StringBuilder b = new StringBuilder("OutboxConfig{");
        boolean first = true;
        for (Map.Entry<String, String> e : values.entrySet()) {
            if (!first) {
                b.append(", ");
            }
            first = false;
            b.append(e.getKey()).append('=').append(masked(e.getKey(), e.getValue()));
        }
        return b.append('}').toString();
    }

    /** {@code value} as the library shows it: a secret as {@code ***}, a URL (or each URL of a list) without its password. */
    static String masked(String key, String value) {
        String redaction = Keys.ofLibrary().redactions.getOrDefault(key, "");
        if (redaction.equals("secret") && !value.isEmpty()) {
            return "***";
        }
        if (redaction.equals("url")) {
            return value.replaceFirst("^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@]*@", "$1:***@");
        }
        if (redaction.equals("urls")) {
            // A list of URLs (shards), separated by spaces or commas: each one's password.
            return value.replaceAll("([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\\s,]*):[^@\\s,]*@", "$1:***@");
        }
        return value;
    }
}
