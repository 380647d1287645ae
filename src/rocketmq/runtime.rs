//! The client's runtime: the client never creates one, so each publisher and each consumer source
//! owns a small Tokio runtime, and blocks on it with a bound.

use std::sync::Arc;
use std::time::Duration;

use rocketmq_client_rust::{ClientRuntime, ClientRuntimeConfig};
use rocketmq_observability::TelemetryRuntimeGuard;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};

use super::classify::describe;
use crate::publisher::SendError;

/// Extra time given to the client beyond its own send timeout before the call is abandoned
/// (the client enforces the timeout itself; this only guards against a hung future).
const HARD_TIMEOUT_SLACK: Duration = Duration::from_millis(500);

/// Bound on each shutdown step (producer, client runtime, Tokio runtime).
pub(super) const SHUTDOWN_STEP: Duration = Duration::from_secs(5);

/// A Tokio runtime of its own (2 threads) with the client's runtime on it as `component`: the
/// client never creates one. `Err` says which step failed.
pub(crate) fn client_runtime(
    name: &'static str,
    component: &'static str,
) -> std::result::Result<(RuntimeOwner, TelemetryRuntimeGuard, Arc<ClientRuntime>), (&'static str, String)> {
    let owner = RuntimeOwner::plan(RuntimeConfig::for_parallelism(name, 2))
        .map_err(|e| ("runtime configuration", e.to_string()))?
        .build()
        .map_err(|e| ("runtime", e.to_string()))?;
    let telemetry = TelemetryRuntimeGuard::noop();
    let client_runtime = ClientRuntime::try_new(
        owner.root_context().component(component),
        ClientRuntimeConfig::default(),
        telemetry.handle(),
    )
    .map_err(|e| ("client runtime", describe(&e)))?;
    Ok((owner, telemetry, client_runtime))
}

/// Runs `fut` on the publisher's runtime, giving up (as a timeout) if it outlives its budget by
/// more than [`HARD_TIMEOUT_SLACK`]: the client enforces the budget itself, this is a backstop.
pub(super) fn block_on_bounded<F: std::future::Future>(
    owner: &RuntimeOwner,
    budget: Duration,
    fut: F,
) -> std::result::Result<F::Output, SendError> {
    owner.block_on(bounded(budget, fut))
}

/// `fut`, given up (as a timeout) if it outlives `budget` by more than [`HARD_TIMEOUT_SLACK`].
pub(super) async fn bounded<F: std::future::Future>(
    budget: Duration,
    fut: F,
) -> std::result::Result<F::Output, SendError> {
    tokio::time::timeout(budget + HARD_TIMEOUT_SLACK, fut)
        .await
        .map_err(|_| {
            SendError::timeout(format!(
                "the client did not return within {} ms",
                (budget + HARD_TIMEOUT_SLACK).as_millis()
            ))
        })
}

pub(super) fn millis(d: Duration) -> u64 {
    (d.as_millis() as u64).max(1)
}
