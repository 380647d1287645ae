package io.outbox;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Collections;
import java.util.Map;
import java.util.Objects;
import java.util.TreeMap;

/**
 * An event to write into the outbox table: business key, type, payload, and optionally a topic,
 * a tag and message headers. Immutable; the {@code with*} methods return a copy.
 *
 * <p>Nothing is checked here: {@code enqueue} validates with the library's own rules and throws
 * {@link OutboxInvalidEventException} naming the field ({@code biz_no} blank, {@code payload} empty or
 * larger than {@code payload.max.bytes}, ...).
 */
public final class Event {
    private final String bizNo;
    private final String eventType;
    private final byte[] payload;
    private final String topic;
    private final String tag;
    private final Map<String, String> headers;
    /** When to send it (docs/scheduling.md): at most one of the two is set. */
    private final Instant deliverAt;
    private final Duration deliverAfter;

    private Event(String bizNo, String eventType, byte[] payload, String topic, String tag, Map<String, String> headers) {
        this(bizNo, eventType, payload, topic, tag, headers, null, null);
    }

    private Event(String bizNo, String eventType, byte[] payload, String topic, String tag, Map<String, String> headers,
            Instant deliverAt, Duration deliverAfter) {
        this.bizNo = bizNo;
        this.eventType = eventType;
        this.payload = payload;
        this.topic = topic;
        this.tag = tag;
        this.headers = headers;
        this.deliverAt = deliverAt;
        this.deliverAfter = deliverAfter;
    }

    /**
     * An event with a binary payload (copied).
     *
     * @param bizNo the business number (the order number, say): the key of per-key ordering
     * @param eventType the event's type, the message's tag unless {@link #withTag} sets one
     * @param payload the message body (copied)
     * @return the event
     */
    public static Event of(String bizNo, String eventType, byte[] payload) {
        return new Event(bizNo, eventType, payload == null ? null : payload.clone(), null, null, Collections.emptyMap());
    }

    /**
     * An event whose payload is {@code payload} in UTF-8 (JSON, typically).
     *
     * @param bizNo the business number (the order number, say): the key of per-key ordering
     * @param eventType the event's type, the message's tag unless {@link #withTag} sets one
     * @param payload the message body, as text
     * @return the event
     */
    public static Event of(String bizNo, String eventType, String payload) {
        // UTF-8 encoding would turn an unpaired surrogate into '?' silently.
        checkString("payload", payload);
        return of(bizNo, eventType, payload == null ? null : payload.getBytes(StandardCharsets.UTF_8));
    }

    /**
     * Refuses text that cannot be stored as UTF-8 faithfully: a string with an unpaired UTF-16
     * surrogate (e.g. {@code "ORD-\uD800"}) would be stored altered by the driver, as the
     * library refuses a NUL character. Checked before anything is written.
     */
    static void checkText(Event e) {
        checkString("biz_no", e.bizNo);
        checkString("event_type", e.eventType);
        checkString("topic", e.topic);
        checkString("tag", e.tag);
        for (Map.Entry<String, String> h : e.headers.entrySet()) {
            checkString("headers", h.getKey());
            checkString("headers", h.getValue());
        }
    }

    static void checkString(String field, String s) {
        if (s == null) {
            return;
        }
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                String reason = String.format("contains an unpaired UTF-16 surrogate (U+%04X at index %d), which is not "
                        + "valid Unicode text and cannot be stored as UTF-8", (int) c, i);
                throw new OutboxInvalidEventException(field, reason, "invalid event: " + field + " " + reason);
            }
        }
    }

    /**
     * This event sent to {@code topic} instead of the configured default topic.
     *
     * @param topic the topic
     * @return this event sent to {@code topic} instead of the configured default topic
     */
    public Event withTopic(String topic) {
        return new Event(bizNo, eventType, payload, topic, tag, headers, deliverAt, deliverAfter);
    }

    /**
     * This event sent at {@code at} rather than as soon as it commits: the database's clock
     * decides when it is due, and a time already past sends it at once. At most 366 days ahead
     * (checked by {@code enqueue}). Replaces a {@link #deliverAfter} delay.
     *
     * @param at when to send it
     * @return this event scheduled at {@code at}
     */
    public Event deliverAt(Instant at) {
        return new Event(bizNo, eventType, payload, topic, tag, headers, Objects.requireNonNull(at, "at"), null);
    }

    /**
     * This event sent {@code delay} after its INSERT (the database's clock) rather than as soon
     * as it commits; it uses no attempt while it waits. At most 366 days (checked by
     * {@code enqueue}). Replaces a {@link #deliverAt} time.
     *
     * @param delay how long after the INSERT to send it
     * @return this event scheduled {@code delay} after its INSERT
     */
    public Event deliverAfter(Duration delay) {
        return new Event(bizNo, eventType, payload, topic, tag, headers, null, Objects.requireNonNull(delay, "delay"));
    }

    /**
     * The time set by {@link #deliverAt}, or {@code null}.
     *
     * @return the time set by {@link #deliverAt}, or {@code null}
     */
    public Instant deliverAtTime() {
        return deliverAt;
    }

    /**
     * The delay set by {@link #deliverAfter}, or {@code null}.
     *
     * @return the delay set by {@link #deliverAfter}, or {@code null}
     */
    public Duration deliverAfterDelay() {
        return deliverAfter;
    }

    /** The schedule as the library takes it: milliseconds since the epoch, 0 when not set. */
    long deliverAtMs() {
        return deliverAt == null ? 0 : deliverAt.toEpochMilli();
    }

    /** The delay in milliseconds, 0 when not set (negative stays negative, for the library to refuse). */
    long delayMs() {
        if (deliverAfter == null) {
            return 0;
        }
        try {
            return deliverAfter.toMillis();
        } catch (ArithmeticException e) {
            return deliverAfter.isNegative() ? -1 : Long.MAX_VALUE;
        }
    }

    /**
     * This event with message tag {@code tag} (by default the event type).
     *
     * @param tag the tag
     * @return this event with message tag {@code tag} (by default the event type)
     */
    public Event withTag(String tag) {
        return new Event(bizNo, eventType, payload, topic, tag, headers, deliverAt, deliverAfter);
    }

    /**
     * This event with one more message property.
     *
     * @param key the property's name
     * @param value its value
     * @return this event with one more message property
     */
    public Event withHeader(String key, String value) {
        TreeMap<String, String> h = new TreeMap<>(headers);
        h.put(Objects.requireNonNull(key, "header key"), Objects.requireNonNull(value, "header value"));
        return new Event(bizNo, eventType, payload, topic, tag, Collections.unmodifiableMap(h), deliverAt, deliverAfter);
    }

    /**
     * The business number.
     *
     * @return the business number
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
     * A copy of the payload ({@code null} if none was given).
     *
     * @return a copy of the payload ({@code null} if none was given)
     */
    public byte[] payload() {
        return payload == null ? null : payload.clone();
    }

    byte[] payloadUnsafe() {
        return payload;
    }

    /**
     * The topic, or {@code null} for the configured default.
     *
     * @return the topic, or {@code null} for the configured default
     */
    public String topic() {
        return topic;
    }

    /**
     * The tag, or {@code null} for the event type.
     *
     * @return the tag, or {@code null} for the event type
     */
    public String tag() {
        return tag;
    }

    /**
     * The headers, sorted by key.
     *
     * @return the headers, sorted by key
     */
    public Map<String, String> headers() {
        return headers;
    }

    String[] headerKeys() {
        return headers.keySet().toArray(new String[0]);
    }

    String[] headerValues() {
        return headers.values().toArray(new String[0]);
    }

    @Override
    public String toString() {
        return "Event{bizNo=" + bizNo + ", eventType=" + eventType + ", payload=" + (payload == null ? "null" : payload.length + " bytes")
                + (topic == null ? "" : ", topic=" + topic) + (tag == null ? "" : ", tag=" + tag)
                + (headers.isEmpty() ? "" : ", headers=" + headers)
                + (deliverAt == null ? "" : ", deliverAt=" + deliverAt) + (deliverAfter == null ? "" : ", deliverAfter=" + deliverAfter) + "}";
    }
}
