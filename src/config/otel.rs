//! Where `outboxd` exports spans (`otel.*` keys of [`super::Config`]; docs/tracing.md). The
//! standard `OTEL_*` variables apply too; the library itself only records spans on whatever
//! tracer provider its host installed.

/// The `service.name` of `outboxd`'s spans unless `otel.service.name` or `OTEL_SERVICE_NAME`
/// says otherwise.
pub const DEFAULT_OTEL_SERVICE_NAME: &str = "outboxd";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// OTLP/HTTP collector (`http://collector:4318`); `None`: the standard variables decide.
    pub endpoint: Option<String>,
    pub service_name: String,
}

impl Default for OtelConfig {
    /// The declared defaults of the `otel.*` keys (`settings.rs`).
    fn default() -> Self {
        super::Config::default().otel
    }
}
