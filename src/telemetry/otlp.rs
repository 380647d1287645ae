//! An OTLP/HTTP span exporter for the process (cargo feature `otlp`): what `outboxd` installs
//! when `otel.exporter.otlp.endpoint` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set. The other standard variables apply
//! (`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME`,
//! `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`); `OTEL_SDK_DISABLED=true` turns it off.
//! Spans leave in batches from a thread of the SDK's own: a collector that is down costs
//! dropped spans (counted by the SDK, logged), never a stalled relay.

use opentelemetry::global;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

/// The installed exporter: dropping it flushes the spans in hand and shuts it down.
pub struct OtlpGuard(SdkTracerProvider);

impl Drop for OtlpGuard {
    fn drop(&mut self) {
        if let Err(e) = self.0.shutdown() {
            log::warn!("OpenTelemetry: flushing the last spans failed: {e}");
        }
    }
}

/// Whether the standard variables ask for OTLP export.
fn from_environment() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Installs the exporter as OpenTelemetry's global tracer provider, sending to `endpoint`
/// (`http://collector:4318`; `/v1/traces` is added) or, with `None`, where the standard
/// variables say. `Ok(None)`: nothing asks for export (or `OTEL_SDK_DISABLED=true`).
pub fn install(endpoint: Option<&str>, service_name: &str) -> Result<Option<OtlpGuard>, String> {
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let endpoint = endpoint.map(str::trim).filter(|e| !e.is_empty());
    if endpoint.is_none() && !from_environment() {
        return Ok(None);
    }
    let mut builder = SpanExporter::builder().with_http();
    if let Some(e) = endpoint {
        let e = e.trim_end_matches('/');
        let url = if e.ends_with("/v1/traces") {
            e.to_string()
        } else {
            format!("{e}/v1/traces")
        };
        builder = builder.with_endpoint(url);
    }
    let exporter = builder
        .build()
        .map_err(|e| format!("the OTLP span exporter could not be built: {e}"))?;
    let mut resource = Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service_name.to_string());
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    global::set_tracer_provider(provider.clone());
    Ok(Some(OtlpGuard(provider)))
}
