package io.outbox;

import java.util.Objects;
import java.util.function.Supplier;

/**
 * The W3C trace context an event carries from the order service to its consumers
 * (docs/tracing.md). An event's own {@code traceparent} and {@code tracestate} headers win;
 * else, when a supplier is registered here, its current context is added at enqueue (every path:
 * {@link OutboxEvents#enqueue}, {@link Outbox#enqueue}, {@link OutboxTransaction#enqueue}). The
 * library checks the values (W3C format; a malformed one is refused with an
 * {@link OutboxInvalidEventException} naming the header), stores them with the row and sends
 * them unchanged as message properties.
 *
 * <p>This binding does not depend on OpenTelemetry. With its API on the classpath, the adapter
 * is two lines:
 *
 * <pre>{@code
 * OutboxTracing.setContextSupplier(() -> {
 *     Map<String, String> m = new HashMap<>();
 *     W3CTraceContextPropagator.getInstance().inject(Context.current(), m, Map::put);
 *     return OutboxTracing.TraceContext.of(m.get("traceparent"), m.get("tracestate"));
 * });
 * }</pre>
 */
public final class OutboxTracing {
    /** The header (and message property) holding the W3C {@code traceparent}. */
    public static final String TRACEPARENT = "traceparent";
    /** The header (and message property) holding the W3C {@code tracestate}. */
    public static final String TRACESTATE = "tracestate";

    private static volatile Supplier<TraceContext> supplier;

    private OutboxTracing() {}

    /** A {@code traceparent} and, optionally, a {@code tracestate}. */
    public static final class TraceContext {
        private final String traceparent;
        private final String tracestate;

        private TraceContext(String traceparent, String tracestate) {
            this.traceparent = traceparent;
            this.tracestate = tracestate;
        }

        /**
         * A context, or {@code null} when {@code traceparent} is null or empty (no current
         * trace).
         *
         * @param traceparent the W3C {@code traceparent}
         * @param tracestate the W3C {@code tracestate}, or null
         * @return the context, or null
         */
        public static TraceContext of(String traceparent, String tracestate) {
            if (traceparent == null || traceparent.isEmpty()) {
                return null;
            }
            return new TraceContext(traceparent, tracestate == null || tracestate.isEmpty() ? null : tracestate);
        }

        /** @return the {@code traceparent} */
        public String traceparent() {
            return traceparent;
        }

        /** @return the {@code tracestate}, or null */
        public String tracestate() {
            return tracestate;
        }
    }

    /**
     * Registers where the current trace context comes from (for example, OpenTelemetry's current
     * span); {@code null} removes it. Called on the enqueuing thread; it may return null when
     * there is no current trace.
     *
     * @param contextSupplier the supplier, or null
     */
    public static void setContextSupplier(Supplier<TraceContext> contextSupplier) {
        supplier = contextSupplier;
    }

    /**
     * {@code event} with the supplier's current context added, when it has none of its own.
     * A supplier that throws is not the event's fault: the event goes without a context, and the
     * failure is logged.
     */
    static Event withCurrentContext(Event event) {
        Objects.requireNonNull(event, "event");
        Supplier<TraceContext> s = supplier;
        if (s == null || event.headers().containsKey(TRACEPARENT)) {
            return event;
        }
        TraceContext cx;
        try {
            cx = s.get();
        } catch (RuntimeException e) {
            System.getLogger("io.outbox").log(System.Logger.Level.WARNING,
                    "the trace context supplier failed; the event is written without a trace context", e);
            return event;
        }
        if (cx == null) {
            return event;
        }
        Event out = event.withHeader(TRACEPARENT, cx.traceparent());
        return cx.tracestate() == null ? out : out.withHeader(TRACESTATE, cx.tracestate());
    }
}
