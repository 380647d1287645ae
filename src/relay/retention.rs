//! The retention thread (with `retention.age.ms`): deletes SUCCESS rows older than that, in small
//! batches along `idx_status_next_retry`, every `retention.interval.ms`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use crossbeam_channel::Receiver;

use super::shared::{wait, Inner};
use crate::error::panic_message;
use crate::stats::Counters;

pub(super) fn retention_loop(inner: &Inner, age: Duration, shutdown: Receiver<()>) {
    let cfg = &inner.config;
    let never = crossbeam_channel::never::<()>();
    while !inner.stopping.load(SeqCst) {
        let round = catch_unwind(AssertUnwindSafe(|| {
            crate::admin::purge(
                inner.store.pool(),
                &cfg.table,
                age,
                cfg.retention_batch,
                cfg.retention_round_max,
                |_| {},
            )
        }));
        match round {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => log::info!("retention deleted {n} rows older than {} s", age.as_secs()),
            Ok(Err(e)) => {
                Counters::add(&inner.counters.db_errors, 1);
                log::warn!("retention round failed: {e}");
            }
            Err(p) => log::error!("retention round panicked: {}", panic_message(&*p)),
        }
        wait(&never, &shutdown, cfg.retention_interval);
    }
}
