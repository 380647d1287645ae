//! Spans for the trace context an event carries (docs/tracing.md): `outbox.publish` per send
//! attempt in the relay, `outbox.process` per handling attempt in the consumer runtime, each a
//! child of the producer's stored context; and the capture of the caller's current context at
//! enqueue. With the cargo feature `otel` they go to OpenTelemetry's global tracer provider
//! (whatever the service installed; `outboxd` installs an OTLP exporter with `otlp`); without
//! it, every call here is empty and compiles away. Only events and messages that carry a trace
//! context get spans: the relay's own polling is not a trace.

#[cfg(feature = "otel")]
mod otel;
#[cfg(feature = "otel")]
pub use otel::current_trace_context;
#[cfg(feature = "otel")]
pub(crate) use otel::{ProcessSpans, PublishSpans};

#[cfg(not(feature = "otel"))]
mod off;
#[cfg(not(feature = "otel"))]
pub use off::current_trace_context;
#[cfg(not(feature = "otel"))]
pub(crate) use off::{ProcessSpans, PublishSpans};

#[cfg(feature = "otlp")]
pub mod otlp;

/// How a handling attempt ended, for its `outbox.process` span (the error's text is the span's
/// status).
#[derive(Debug, Clone, Copy)]
// Without the feature `otel` nothing reads the errors (no span to carry them).
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) enum Handled<'a> {
    /// Committed: the handler ran (or the key was a duplicate).
    Committed,
    /// Rolled back; retried without an attempt.
    Transient(&'a (dyn std::error::Error + 'a)),
    /// Rolled back; an attempt used (or parked).
    Failed(&'a (dyn std::error::Error + 'a)),
    /// A batch rolled back, handled again one message at a time (each its own span).
    BatchRetried(&'a (dyn std::error::Error + 'a)),
}
