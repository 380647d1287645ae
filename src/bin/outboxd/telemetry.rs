//! Span export (docs/tracing.md): with the cargo feature `otlp`, an OTLP/HTTP exporter when
//! `otel.exporter.otlp.endpoint` or the standard `OTEL_EXPORTER_OTLP_*` variables ask for one;
//! without it, asking for one is a configuration error rather than silence.

use outbox::{Config, ConfigError};

#[cfg(feature = "otlp")]
pub fn export(config: &Config) -> Result<Option<outbox::telemetry::otlp::OtlpGuard>, outbox::Error> {
    let guard =
        outbox::telemetry::otlp::install(config.otel.endpoint.as_deref(), &config.otel.service_name).map_err(|e| {
            ConfigError::invalid(
                "otel.exporter.otlp.endpoint",
                config.otel.endpoint.clone().unwrap_or_default(),
                e,
            )
        })?;
    if guard.is_some() {
        log::info!(
            "spans of traced events exported over OTLP to {}",
            config
                .otel
                .endpoint
                .clone()
                .unwrap_or_else(|| "the OTEL_EXPORTER_OTLP_* endpoint".into())
        );
    }
    Ok(guard)
}

#[cfg(not(feature = "otlp"))]
pub fn export(config: &Config) -> Result<(), outbox::Error> {
    if let Some(endpoint) = &config.otel.endpoint {
        return Err(ConfigError::invalid(
            "otel.exporter.otlp.endpoint",
            endpoint.clone(),
            "this build has no OTLP export (cargo feature otlp)",
        )
        .into());
    }
    if std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").is_ok_and(|v| !v.trim().is_empty()) {
        log::warn!("OTEL_EXPORTER_OTLP_ENDPOINT is set but this build has no OTLP export (cargo feature otlp): no spans are exported");
    }
    Ok(())
}
