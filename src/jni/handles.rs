//! Registries behind the `long` handles given to Java. A handle is an index, never a pointer:
//! handles come from one counter and are never reused, so a stale handle finds nothing.
//!
//! Transactions are of two kinds behind the same `OutboxTransaction` handles: library-owned ones
//! (`txBegin`, ended by `txCommit`/`txRollback`), and a consumer's transaction lent to its Java
//! handler for the duration of one call ([`lend_tx`]): statements run on it, but only the
//! consumer ends it, and its handle is revoked when the call returns.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};

use mysql::Transaction;

use crate::host::owned_tx::OwnedTx;
use crate::host::statement::ends_transaction;
use parking_lot::Mutex;

use super::boundary::{Failure, JResult};
use crate::relay::{DeadLetterHook, Relay};

static NEXT: AtomicI64 = AtomicI64::new(1);
static RELAYS: LazyLock<Mutex<HashMap<i64, Arc<RelayEntry>>>> = LazyLock::new(Default::default);
static TXS: LazyLock<Mutex<HashMap<i64, Arc<TxEntry>>>> = LazyLock::new(Default::default);
static LENT: LazyLock<Mutex<HashMap<i64, Arc<LentEntry>>>> = LazyLock::new(Default::default);

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

/// A consumer's transaction lent to its handler: the pointer is `Some` only while [`lend_tx`]
/// runs its callback (and the consumer's thread waits for it with the transaction borrowed).
struct LentEntry {
    tx: Mutex<Option<LentPtr>>,
    /// A statement through it failed with a transient database error.
    transient: AtomicBool,
}

struct LentPtr(*mut Transaction<'static>);

// SAFETY: the pointer is dereferenced only under `LentEntry::tx`'s lock while `lend_tx` keeps
// the transaction borrowed (on the consumer's thread, which waits for the callback); the
// transaction and its connection are `Send`.
unsafe impl Send for LentPtr {}

pub(super) fn next() -> i64 {
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

/// Runs `f` on the open library-owned transaction `handle` (with its relay), one call at a time.
/// A consumer's transaction is refused: it belongs to no relay.
pub(crate) fn with_tx<T>(
    handle: i64,
    what: &str,
    f: impl FnOnce(&Relay, &mut Transaction<'static>) -> JResult<T>,
) -> JResult<T> {
    refuse_if_lent(handle, what)?;
    let entry = TXS.lock().get(&handle).cloned().ok_or_else(|| finished(handle))?;
    let mut guard = entry.tx.lock();
    let tx = guard.as_deref_mut().ok_or_else(|| finished(handle))?;
    f(&entry.relay, tx)
}

/// Runs the statement `sql` through `f` on the transaction `handle`: a library-owned one, or a
/// consumer's lent to its handler (where a statement that would end the transaction is refused,
/// and a transient database failure is remembered for the consumer, see [`lend_tx`]).
pub(crate) fn with_statement_tx<T>(
    handle: i64,
    sql: Option<&str>,
    f: impl FnOnce(&mut Transaction<'static>) -> JResult<T>,
) -> JResult<T> {
    let lent = LENT.lock().get(&handle).cloned();
    let Some(entry) = lent else {
        return with_tx(handle, "a statement", |_, t| f(t));
    };
    if let Some(what) = sql.and_then(|s| ends_transaction(s, true)) {
        return Err(Failure::IllegalArgument(format!(
            "{what} is not allowed on the consumer's transaction: it would end the transaction behind \
             the consumer (return from the handler to commit, throw to roll back)"
        )));
    }
    let mut slot = entry.tx.lock();
    let Some(ptr) = slot.as_mut() else {
        return Err(lent_over(handle));
    };
    // SAFETY: `Some` only while `lend_tx` holds the transaction borrowed and waits for its
    // callback; revoking takes this lock, so the transaction outlives this use.
    let tx = unsafe { &mut *ptr.0 };
    let result = f(tx);
    if let Err(Failure::Core(e)) = &result {
        if e.is_retriable() {
            entry.transient.store(true, Ordering::SeqCst);
        }
    }
    result
}

fn lent_over(handle: i64) -> Failure {
    Failure::IllegalState(format!(
        "the consumer's transaction (handle {handle}) is only usable during the handler call it was given to"
    ))
}

/// Refuses `what` (commit, rollback, enqueue) on a consumer's transaction, which only the
/// consumer ends and which belongs to no relay.
pub(crate) fn refuse_if_lent(handle: i64, what: &str) -> JResult<()> {
    if LENT.lock().contains_key(&handle) {
        return Err(Failure::IllegalState(format!(
            "{what} is not allowed on the consumer's transaction: the consumer commits it when the handler \
             returns and rolls it back when the handler throws"
        )));
    }
    Ok(())
}

/// Removes `handle` and hands back its transaction to commit or roll back.
pub(crate) fn take_tx(handle: i64) -> Option<(Arc<RelayEntry>, OwnedTx)> {
    let entry = TXS.lock().remove(&handle)?;
    let tx = entry.tx.lock().take()?;
    Some((entry.relay.clone(), tx))
}

/// Lends `tx` (a consumer's transaction) to `f` as a transaction handle, valid until `f`
/// returns (or unwinds): then the handle is revoked, waiting for a statement still running on it
/// from another thread. Returns `f`'s value and whether a statement through the handle failed
/// with a transient database error (a lock wait timeout, a deadlock, a lost connection).
pub(crate) fn lend_tx<R>(tx: &mut Transaction<'_>, f: impl FnOnce(i64) -> R) -> (R, bool) {
    /// Revokes the handle when dropped, so an unwinding `f` cannot leave it usable.
    struct Revoke(i64, Arc<LentEntry>);
    impl Drop for Revoke {
        fn drop(&mut self) {
            LENT.lock().remove(&self.0);
            *self.1.tx.lock() = None;
        }
    }
    let handle = next();
    let entry = Arc::new(LentEntry {
        tx: Mutex::new(Some(LentPtr((tx as *mut Transaction<'_>).cast()))),
        transient: AtomicBool::new(false),
    });
    LENT.lock().insert(handle, entry.clone());
    let revoke = Revoke(handle, entry);
    let value = f(handle);
    let transient = revoke.1.transient.load(Ordering::SeqCst);
    drop(revoke);
    (value, transient)
}

/// `(relays, transactions)` open now (library-owned, and consumers' lent to a handler now).
pub(crate) fn live() -> (usize, usize) {
    (RELAYS.lock().len(), TXS.lock().len() + LENT.lock().len())
}
