//! Registries behind the `long` handles given to Java. A handle is an index, never a pointer:
//! handles come from one counter and are never reused, so a stale handle finds nothing.
//!
//! Transactions are of two kinds behind the same `OutboxTransaction` handles: library-owned ones
//! (`txBegin`, ended by `txCommit`/`txRollback`), and a consumer's transaction lent to its Java
//! handler for the duration of one call ([`lend_tx`]): statements run on it, but only the
//! consumer ends it, and its handle is revoked when the call returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};

use mysql::Transaction;
use parking_lot::Mutex;

use super::boundary::{Failure, JResult};
use crate::host::error::{HostError, HostResult};
use crate::host::relay::HostRelay;
use crate::host::tx::{HostTx, Transience};

static NEXT: AtomicI64 = AtomicI64::new(1);
static RELAYS: LazyLock<Mutex<HashMap<i64, Arc<HostRelay>>>> = LazyLock::new(Default::default);
static TXS: LazyLock<Mutex<HashMap<i64, Arc<TxEntry>>>> = LazyLock::new(Default::default);

/// A transaction behind a handle, used by one call at a time; `None` once finished (owned) or
/// revoked (lent) while a call on another thread still held the entry.
struct TxEntry {
    lent: bool,
    tx: Mutex<Option<HostTx>>,
}

pub(super) fn next() -> i64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub(crate) fn add_relay(relay: HostRelay) -> i64 {
    let h = next();
    RELAYS.lock().insert(h, Arc::new(relay));
    h
}

/// The relay of `handle`, or `OutboxStoppedException`.
pub(crate) fn relay(handle: i64) -> JResult<Arc<HostRelay>> {
    RELAYS
        .lock()
        .get(&handle)
        .cloned()
        .ok_or_else(|| Failure::Stopped(format!("the outbox relay is closed (handle {handle} is not open)")))
}

pub(crate) fn remove_relay(handle: i64) -> Option<Arc<HostRelay>> {
    RELAYS.lock().remove(&handle)
}

pub(crate) fn add_tx(tx: HostTx) -> i64 {
    insert_tx(tx, false).0
}

fn insert_tx(tx: HostTx, lent: bool) -> (i64, Arc<TxEntry>) {
    let h = next();
    let entry = Arc::new(TxEntry {
        lent,
        tx: Mutex::new(Some(tx)),
    });
    TXS.lock().insert(h, entry.clone());
    (h, entry)
}

fn finished(handle: i64) -> Failure {
    Failure::IllegalState(format!("the transaction is finished (handle {handle} is not open)"))
}

/// Runs `f` on the open transaction `handle`, one call at a time.
pub(crate) fn with_tx<T>(handle: i64, f: impl FnOnce(&mut HostTx) -> HostResult<T>) -> JResult<T> {
    let entry = TXS.lock().get(&handle).cloned().ok_or_else(|| finished(handle))?;
    let mut slot = entry.tx.lock();
    let Some(tx) = slot.as_mut() else {
        return Err(if entry.lent {
            Failure::IllegalState(format!(
                "the consumer's transaction (handle {handle}) is only usable during the handler call it was given \
                 to"
            ))
        } else {
            finished(handle)
        });
    };
    Ok(f(tx)?)
}

/// Ends the transaction `handle` with `f` (commit, rollback) and releases the handle, whatever
/// the outcome; a consumer's transaction refuses and keeps its handle. `None` when the handle is
/// not open.
pub(crate) fn end_tx(handle: i64, f: impl FnOnce(&mut HostTx) -> HostResult<()>) -> Option<JResult<()>> {
    let entry = TXS.lock().get(&handle).cloned()?;
    let mut slot = entry.tx.lock();
    let tx = slot.as_mut()?;
    let result = f(tx);
    if !matches!(result, Err(HostError::ConsumerTx(_))) {
        slot.take();
        TXS.lock().remove(&handle);
    }
    Some(result.map_err(Failure::from))
}

/// Lends `tx` (a consumer's transaction) to `f` as a transaction handle, valid until `f`
/// returns (or unwinds): then the handle is revoked, waiting for a statement still running on it
/// from another thread. Returns `f`'s value and whether a statement through the handle failed
/// with a transient database error (a lock wait timeout, a deadlock, a lost connection).
pub(crate) fn lend_tx<R>(tx: &mut Transaction<'_>, f: impl FnOnce(i64) -> R) -> (R, Option<Transience>) {
    /// Revokes the handle when dropped, so an unwinding `f` cannot leave it usable.
    struct Revoke(i64, Arc<TxEntry>);
    impl Drop for Revoke {
        fn drop(&mut self) {
            TXS.lock().remove(&self.0);
            self.1.tx.lock().take();
        }
    }
    // SAFETY: revoked (taken out under the entry's lock, which waits for a call using it) before
    // this function returns, while `tx` is still borrowed.
    let (handle, entry) = insert_tx(unsafe { HostTx::lent(tx) }, true);
    let revoke = Revoke(handle, entry);
    let value = f(handle);
    let transient = revoke.1.tx.lock().as_ref().and_then(HostTx::transient_failure);
    drop(revoke);
    (value, transient)
}

/// `(relays, transactions)` open now (library-owned, and consumers' lent to a handler now).
pub(crate) fn live() -> (usize, usize) {
    (RELAYS.lock().len(), TXS.lock().len())
}
