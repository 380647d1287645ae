//! Registries behind the `long` handles given to Java. A handle is an index, never a pointer:
//! handles come from one counter and are never reused, so a stale handle finds nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};

use mysql::Transaction;

use crate::host::owned_tx::OwnedTx;
use parking_lot::Mutex;

use super::boundary::{Failure, JResult};
use crate::relay::{DeadLetterHook, Relay};

static NEXT: AtomicI64 = AtomicI64::new(1);
static RELAYS: LazyLock<Mutex<HashMap<i64, Arc<RelayEntry>>>> = LazyLock::new(Default::default);
static TXS: LazyLock<Mutex<HashMap<i64, Arc<TxEntry>>>> = LazyLock::new(Default::default);

/// A relay, and the dead-letter hook it was started with (kept for the binding's self-test).
pub(crate) struct RelayEntry {
    pub(crate) relay: Relay,
    pub(crate) dead_letter: Option<DeadLetterHook>,
    pub(crate) latency: Arc<crate::latency::LatencyStats>,
}

impl std::ops::Deref for RelayEntry {
    type Target = Relay;

    fn deref(&self) -> &Relay {
        &self.relay
    }
}

/// A library-owned transaction, and the relay whose config and pool it uses.
struct TxEntry {
    relay: Arc<RelayEntry>,
    /// `None` once committed or rolled back by a concurrent call.
    tx: Mutex<Option<OwnedTx>>,
}

fn next() -> i64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn add_relay(
    relay: Relay,
    dead_letter: Option<DeadLetterHook>,
    latency: Arc<crate::latency::LatencyStats>,
) -> i64 {
    let h = next();
    RELAYS.lock().insert(
        h,
        Arc::new(RelayEntry {
            relay,
            dead_letter,
            latency,
        }),
    );
    h
}

/// The relay of `handle`, or `OutboxStoppedException`.
pub(crate) fn relay(handle: i64) -> JResult<Arc<RelayEntry>> {
    RELAYS
        .lock()
        .get(&handle)
        .cloned()
        .ok_or_else(|| Failure::Stopped(format!("the outbox relay is closed (handle {handle} is not open)")))
}

pub(crate) fn remove_relay(handle: i64) -> Option<Arc<RelayEntry>> {
    RELAYS.lock().remove(&handle)
}

pub(crate) fn add_tx(relay: Arc<RelayEntry>, tx: OwnedTx) -> i64 {
    let h = next();
    TXS.lock().insert(
        h,
        Arc::new(TxEntry {
            relay,
            tx: Mutex::new(Some(tx)),
        }),
    );
    h
}

fn finished(handle: i64) -> Failure {
    Failure::IllegalState(format!("the transaction is finished (handle {handle} is not open)"))
}

/// Runs `f` on the open transaction `handle`, one call at a time.
pub(crate) fn with_tx<T>(handle: i64, f: impl FnOnce(&Relay, &mut Transaction<'static>) -> JResult<T>) -> JResult<T> {
    let entry = TXS.lock().get(&handle).cloned().ok_or_else(|| finished(handle))?;
    let mut guard = entry.tx.lock();
    let tx = guard.as_deref_mut().ok_or_else(|| finished(handle))?;
    f(&entry.relay, tx)
}

/// Removes `handle` and hands back its transaction to commit or roll back.
pub(crate) fn take_tx(handle: i64) -> Option<(Arc<RelayEntry>, OwnedTx)> {
    let entry = TXS.lock().remove(&handle)?;
    let tx = entry.tx.lock().take()?;
    Some((entry.relay.clone(), tx))
}

/// `(relays, transactions)` open now.
pub(crate) fn live() -> (usize, usize) {
    (RELAYS.lock().len(), TXS.lock().len())
}
