package io.outbox;

/** An event field is wrong: {@link #field()} names it ({@code biz_no}, {@code payload}, ...). */
public class OutboxInvalidEventException extends OutboxException {
    private static final long serialVersionUID = 1L;

    /** The field at fault. */
    private final String field;
    /** Why the field was refused. */
    private final String reason;

    /** Called by the native library. */
    OutboxInvalidEventException(String field, String reason, String message) {
        super(message);
        this.field = field;
        this.reason = reason;
    }

    /**
     * The field at fault, as named in the outbox table: biz_no, event_type, payload, topic, tag, headers.
     *
     * @return the field at fault, as named in the outbox table: biz_no, event_type, payload, topic, tag, headers
     */
    public String field() {
        return field;
    }

    /**
     * Why the field was refused, without the field's name.
     *
     * @return why the field was refused
     */
    public String reason() {
        return reason;
    }
}
