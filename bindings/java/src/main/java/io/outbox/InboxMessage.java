package io.outbox;

import java.util.Objects;

/**
 * Where a consumed message came from, stored with its inbox mark so that an operator can trace a
 * processed key back to the broker: topic, queue id, queue offset and the broker's message id.
 * Every field is optional ({@code null}). Immutable; the {@code with*} methods return a copy.
 *
 * <p>Nothing is checked here: {@link OutboxInbox#mark} and {@link OutboxInbox#process} validate
 * before anything is sent and throw {@link OutboxInvalidEventException} naming the field
 * ({@code topic} over 127 characters, {@code msg_id} over 128, a negative {@code queue_id} or
 * {@code queue_offset}).
 *
 * <pre>{@code
 * InboxMessage meta = InboxMessage.of(msg.getTopic(), msg.getQueueId(), msg.getQueueOffset(), msg.getMsgId());
 * }</pre>
 *
 * <p>The broker's message id is for tracing only: a resend by the relay is a new message with a
 * new id, so never use it as the dedup key (use {@link OutboxInbox#eventKey}).
 */
public final class InboxMessage {
    /** No trace: every field {@code null}. */
    public static final InboxMessage NONE = new InboxMessage(null, null, null, null);

    private final String topic;
    private final Integer queueId;
    private final Long queueOffset;
    private final String msgId;

    private InboxMessage(String topic, Integer queueId, Long queueOffset, String msgId) {
        this.topic = topic;
        this.queueId = queueId;
        this.queueOffset = queueOffset;
        this.msgId = msgId;
    }

    /**
     * A message's trace; any argument may be {@code null}.
     *
     * @param topic the topic
     * @param queueId the queue id
     * @param queueOffset the offset in the queue
     * @param msgId the broker's message id
     * @return the trace
     */
    public static InboxMessage of(String topic, Integer queueId, Long queueOffset, String msgId) {
        return new InboxMessage(topic, queueId, queueOffset, msgId);
    }

    /**
     * This trace with topic {@code topic}.
     *
     * @param topic the topic
     * @return this trace with topic {@code topic}
     */
    public InboxMessage withTopic(String topic) {
        return new InboxMessage(topic, queueId, queueOffset, msgId);
    }

    /**
     * This trace with queue id {@code queueId}.
     *
     * @param queueId the queue id
     * @return this trace with queue id {@code queueId}
     */
    public InboxMessage withQueueId(Integer queueId) {
        return new InboxMessage(topic, queueId, queueOffset, msgId);
    }

    /**
     * This trace with queue offset {@code queueOffset}.
     *
     * @param queueOffset the offset in the queue
     * @return this trace with queue offset {@code queueOffset}
     */
    public InboxMessage withQueueOffset(Long queueOffset) {
        return new InboxMessage(topic, queueId, queueOffset, msgId);
    }

    /**
     * This trace with the broker's message id {@code msgId}.
     *
     * @param msgId the broker's message id
     * @return this trace with the broker's message id {@code msgId}
     */
    public InboxMessage withMsgId(String msgId) {
        return new InboxMessage(topic, queueId, queueOffset, msgId);
    }

    /**
     * The topic.
     *
     * @return the topic, or {@code null}
     */
    public String topic() {
        return topic;
    }

    /**
     * The queue id.
     *
     * @return the queue id, or {@code null}
     */
    public Integer queueId() {
        return queueId;
    }

    /**
     * The offset in the queue.
     *
     * @return the queue offset, or {@code null}
     */
    public Long queueOffset() {
        return queueOffset;
    }

    /**
     * The broker's message id.
     *
     * @return the broker's message id, or {@code null}
     */
    public String msgId() {
        return msgId;
    }

    @Override
    public boolean equals(Object o) {
        if (!(o instanceof InboxMessage)) {
            return false;
        }
        InboxMessage m = (InboxMessage) o;
        return Objects.equals(topic, m.topic) && Objects.equals(queueId, m.queueId)
                && Objects.equals(queueOffset, m.queueOffset) && Objects.equals(msgId, m.msgId);
    }

    @Override
    public int hashCode() {
        return Objects.hash(topic, queueId, queueOffset, msgId);
    }

    @Override
    public String toString() {
        return "InboxMessage{topic=" + topic + ", queueId=" + queueId + ", queueOffset=" + queueOffset + ", msgId=" + msgId + "}";
    }
}
