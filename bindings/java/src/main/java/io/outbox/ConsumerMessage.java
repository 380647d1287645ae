package io.outbox;

import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A message as an {@link OutboxConsumer}'s handler sees it: where it came from, its dedup key,
 * its properties (the relay sets {@code eventKey}, {@code eventId}, {@code eventType},
 * {@code bizNo}, plus the event's headers) and its body (the event's payload). Immutable.
 */
public final class ConsumerMessage {
    private final String key;
    private final String topic;
    private final String broker;
    private final int queueId;
    private final long queueOffset;
    private final String msgId;
    private final String tag;
    private final Map<String, String> properties;
    private final byte[] body;

    /** Built by the native library. */
    ConsumerMessage(String key, String topic, String broker, int queueId, long queueOffset, String msgId, String tag,
            String[] propertyNames, String[] propertyValues, byte[] body) {
        this.key = key;
        this.topic = topic;
        this.broker = broker;
        this.queueId = queueId;
        this.queueOffset = queueOffset;
        this.msgId = msgId;
        this.tag = tag;
        LinkedHashMap<String, String> p = new LinkedHashMap<>();
        for (int i = 0; i < propertyNames.length; i++) {
            p.put(propertyNames[i], propertyValues[i]);
        }
        this.properties = Collections.unmodifiableMap(p);
        this.body = body;
    }

    /**
     * The dedup key the consumer marked in the inbox: the {@code eventKey} property (else
     * {@code <topic>#<eventId>}, else {@code msg:<message id>}, for messages from other publishers).
      *
     * @return the message's dedup key
     */
    public String key() {
        return key;
    }

    /**
     * The topic the message came from.
     *
     * @return the topic
     */
    public String topic() {
        return topic;
    }

    /**
     * The broker (name) the message came from.
     *
     * @return the broker (name) the message came from
     */
    public String broker() {
        return broker;
    }

    /**
     * The id of the queue (of its broker) the message came from.
     *
     * @return the queue id
     */
    public int queueId() {
        return queueId;
    }

    /**
     * The message's offset in its queue.
     *
     * @return the message's offset in its queue
     */
    public long queueOffset() {
        return queueOffset;
    }

    /**
     * The broker's message id, or {@code null}.
     *
     * @return the broker's message id, or {@code null}
     */
    public String msgId() {
        return msgId;
    }

    /**
     * The tag, or {@code null}.
     *
     * @return the tag, or {@code null}
     */
    public String tag() {
        return tag;
    }

    /**
     * The user properties, unmodifiable, by name.
     *
     * @return the user properties, unmodifiable, by name
     */
    public Map<String, String> properties() {
        return properties;
    }

    /**
     * The property {@code name}, or {@code null}.
     *
     * @param name the property's name
     * @return the property {@code name}, or {@code null}
     */
    public String property(String name) {
        return properties.get(name);
    }

    /**
     * The {@code bizNo} property: the event's business number, or {@code null}.
     *
     * @return the {@code bizNo} property: the event's business number, or {@code null}
     */
    public String bizNo() {
        return properties.get("bizNo");
    }

    /**
     * The {@code eventType} property, or {@code null}.
     *
     * @return the {@code eventType} property, or {@code null}
     */
    public String eventType() {
        return properties.get("eventType");
    }

    /**
     * A copy of the body (the event's payload).
     *
     * @return a copy of the body (the event's payload)
     */
    public byte[] body() {
        return body.clone();
    }

    /**
     * The body decoded as UTF-8.
     *
     * @return the body decoded as UTF-8
     */
    public String bodyAsString() {
        return new String(body, StandardCharsets.UTF_8);
    }

    /**
     * The body's length in bytes.
     *
     * @return the body's length in bytes
     */
    public int bodyLength() {
        return body.length;
    }

    @Override
    public String toString() {
        return "ConsumerMessage{key=" + key + ", topic=" + topic + ", queue=" + broker + "#" + queueId + ", offset=" + queueOffset
                + ", msgId=" + msgId + ", tag=" + tag + ", properties=" + properties + ", body=" + body.length + " bytes}";
    }
}
