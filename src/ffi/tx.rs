//! `outbox_tx`: a library-owned transaction on a pooled connection, for hosts whose own
//! database access cannot join the library's (C, C++, or Go/Java hosts that accept it).

use std::ffi::c_char;
use std::sync::Arc;

use mysql::prelude::Queryable;

use super::boundary::{arg_str, ffi_boundary, Failure};
use super::event::{outbox_event, outbox_param};
use super::relay::outbox_relay;
use super::relay::Shared;
use super::result::outbox_result::{self, *};
use crate::host::statement::ends_transaction;

/// A database transaction owned by the library, holding one connection of the relay's pool.
/// Begun by `outbox_tx_begin`, ended by `outbox_tx_commit` or `outbox_tx_rollback`, always
/// freed by `outbox_tx_free` (which rolls back if it was not ended).
///
/// A consumer's handler callback gets a borrowed one instead (`outbox_consumer_start`): the
/// consumer's transaction, which the consumer commits or rolls back after the callback.
pub struct outbox_tx {
    kind: TxKind,
}

enum TxKind {
    /// Begun by `outbox_tx_begin` on a relay's pool; `None` once committed or rolled back.
    Owned {
        shared: Arc<Shared>,
        tx: Option<crate::host::owned_tx::OwnedTx>,
    },
    /// The consumer's transaction, lent to its handler callback for the callback's duration;
    /// `transient` once a statement through it failed with a transient database error (the
    /// callback's failure is then retried without using an attempt, whatever it returns).
    Borrowed {
        tx: *mut mysql::Transaction<'static>,
        transient: bool,
    },
}

// SAFETY: an owned tx is `Send` (its parts are); a borrowed one is only reachable from the
// callback it was lent to, on the consumer thread that lent it.
unsafe impl Send for outbox_tx {}

impl outbox_tx {
    /// A handle on `tx` for a consumer callback; valid while `tx` is.
    pub(crate) fn borrowed(tx: &mut mysql::Transaction<'_>) -> outbox_tx {
        let p: *mut mysql::Transaction<'static> = (tx as *mut mysql::Transaction<'_>).cast();
        outbox_tx {
            kind: TxKind::Borrowed {
                tx: p,
                transient: false,
            },
        }
    }

    /// Whether a statement through this borrowed transaction failed with a transient database
    /// error (a lock wait timeout, a deadlock, a lost connection).
    pub(crate) fn saw_transient_failure(&self) -> bool {
        matches!(self.kind, TxKind::Borrowed { transient: true, .. })
    }

    /// Refuses a statement that would end the transaction behind the library's back: COMMIT,
    /// ROLLBACK, BEGIN and the like on any transaction, and, on a consumer's, the statements that
    /// commit implicitly (DDL), which would commit the inbox marks with half of the handler's
    /// work.
    fn check_statement(&self, sql: &str) -> Result<(), Failure> {
        let borrowed = matches!(self.kind, TxKind::Borrowed { .. });
        match ends_transaction(sql, borrowed) {
            None => Ok(()),
            Some(what) => Err(Failure::new(
                OUTBOX_ERR_INVALID_ARGUMENT,
                format!(
                    "{what} is not allowed through outbox_tx_execute: it would end the transaction \
                     behind the library ({})",
                    if borrowed {
                        "a consumer's handler returns 0 to commit, non-zero to roll back"
                    } else {
                        "use outbox_tx_commit or outbox_tx_rollback"
                    }
                ),
            )),
        }
    }

    /// Runs `f` on the live transaction; a transient failure of a borrowed one is remembered
    /// (see [`outbox_tx::saw_transient_failure`]).
    pub(crate) fn run<T>(
        &mut self,
        f: impl FnOnce(&mut mysql::Transaction<'static>) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let result = f(self.live()?);
        if let (Err(failure), TxKind::Borrowed { transient, .. }) = (&result, &mut self.kind) {
            if failure.code.is_retriable() {
                *transient = true;
            }
        }
        result
    }

    pub(crate) fn live(&mut self) -> Result<&mut mysql::Transaction<'static>, Failure> {
        match &mut self.kind {
            // SAFETY: the consumer keeps the transaction alive while the callback runs.
            TxKind::Borrowed { tx, .. } => Ok(unsafe { &mut **tx }),
            TxKind::Owned { tx, .. } => tx.as_deref_mut().ok_or_else(|| {
                Failure::new(
                    OUTBOX_ERR_TX_FINISHED,
                    "the transaction was already committed or rolled back",
                )
            }),
        }
    }

    /// The relay and the owned transaction, or an error for a consumer's transaction (which only
    /// the consumer ends).
    fn owned(&mut self, what: &str) -> Result<(&Arc<Shared>, &mut Option<crate::host::owned_tx::OwnedTx>), Failure> {
        match &mut self.kind {
            TxKind::Owned { shared, tx } => Ok((shared, tx)),
            TxKind::Borrowed { .. } => Err(Failure::new(
                OUTBOX_ERR_INVALID_ARGUMENT,
                format!(
                    "{what} is not allowed on a consumer's transaction: return 0 from the handler \
                     callback to commit it, non-zero to roll it back"
                ),
            )),
        }
    }
}

/// Begins a transaction on a connection of the relay's pool (READ COMMITTED, like the relay's
/// own sessions). While all `db.pool.max` connections are in use it waits for one, at most
/// `db.pool.wait.ms` (default 30000; 0 waits forever), then fails with `OUTBOX_ERR_POOL_TIMEOUT`
/// (retriable): size the pool for the relay plus your concurrent transactions.
/// `OUTBOX_ERR_STOPPED` after `outbox_stop`.
/// On success `*out_tx` receives the transaction.
///
/// Thread safety: safe from any thread, concurrently with any call on the same relay except
/// `outbox_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_begin(relay: *const outbox_relay, out_tx: *mut *mut outbox_tx) -> outbox_result {
    ffi_boundary!(nonnull(relay, out_tx) {
        let shared = (*relay).shared.clone();
        shared.check_running()?;
        let tx = crate::host::owned_tx::OwnedTx::begin(shared.relay.pool(), shared.relay.config())?;
        *out_tx = Box::into_raw(Box::new(outbox_tx {
            kind: TxKind::Owned { shared, tx: Some(tx) },
        }));
        Ok(())
    })
}

/// Runs one business statement in the transaction. `sql` is NUL-terminated UTF-8 with `?`
/// placeholders; `params` holds `nparams` values bound to them in order (never interpolated;
/// `params` may be NULL when `nparams` is 0). On success writes the affected row count and the
/// last insert id (0 when none) into `out_affected` and `out_last_insert_id`, each of which may
/// be NULL when not wanted. A statement that would end the transaction (COMMIT, ROLLBACK,
/// BEGIN, START TRANSACTION, SET autocommit, XA, LOCK/UNLOCK TABLES, and on a consumer's
/// transaction also DDL, which commits implicitly) is refused with `OUTBOX_ERR_INVALID_ARGUMENT`
/// naming it, and nothing runs. A statement the database refuses is `OUTBOX_ERR_STATEMENT` (or
/// `OUTBOX_ERR_DATABASE` when transient: a lock wait timeout, a deadlock, a lost connection);
/// the transaction stays open.
///
/// Thread safety: not thread-safe for the same tx (one call at a time, from any thread).
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_execute(
    tx: *mut outbox_tx,
    sql: *const c_char,
    params: *const outbox_param,
    nparams: usize,
    out_affected: *mut u64,
    out_last_insert_id: *mut u64,
) -> outbox_result {
    ffi_boundary!(nonnull(tx, sql) {
        let sql = arg_str(sql, "sql")?;
        let params = super::event::to_params(params, nparams)?;
        (*tx).check_statement(sql)?;
        let (affected, last_id) = (*tx).run(|t| {
            let result = t.exec_iter(sql, params)?;
            Ok((result.affected_rows(), result.last_insert_id().unwrap_or(0)))
        })?;
        if !out_affected.is_null() {
            *out_affected = affected;
        }
        if !out_last_insert_id.is_null() {
            *out_last_insert_id = last_id;
        }
        Ok(())
    })
}

/// Runs a query in the transaction and reads the first column of its first row as a 64-bit
/// integer (`SELECT COUNT(*) ...`, `SELECT id ... FOR UPDATE`). Parameters as in
/// `outbox_tx_execute`. On success `*out_found` is false (and `*out_value` 0) when there was
/// no row or the value was NULL. A value that is not an integer is `OUTBOX_ERR_INVALID_ARGUMENT`.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_query_int64(
    tx: *mut outbox_tx,
    sql: *const c_char,
    params: *const outbox_param,
    nparams: usize,
    out_value: *mut i64,
    out_found: *mut bool,
) -> outbox_result {
    ffi_boundary!(nonnull(tx, sql, out_value, out_found) {
        let sql = arg_str(sql, "sql")?;
        let params = super::event::to_params(params, nparams)?;
        (*tx).check_statement(sql)?;
        let row: Option<mysql::Row> = (*tx).run(|t| Ok(t.exec_first(sql, params)?))?;
        let value = match row.and_then(|mut r| r.take::<mysql::Value, _>(0)) {
            None | Some(mysql::Value::NULL) => None,
            Some(v) => Some(mysql::from_value_opt::<i64>(v).map_err(|e| {
                Failure::new(OUTBOX_ERR_INVALID_ARGUMENT, format!("the first column is not a 64-bit integer: {e}"))
            })?),
        };
        *out_value = value.unwrap_or(0);
        *out_found = value.is_some();
        Ok(())
    })
}

/// Inserts `event` into the outbox table inside the transaction (status WAIT). Nothing is sent
/// now: the event becomes visible to relays when the transaction commits, and a rollback
/// leaves nothing. On success `*out_event_id` receives the new row's id.
/// `OUTBOX_ERR_INVALID_EVENT` names the wrong field; `OUTBOX_ERR_STOPPED` after `outbox_stop`.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_enqueue_in_tx(
    tx: *mut outbox_tx,
    event: *const outbox_event,
    out_event_id: *mut u64,
) -> outbox_result {
    ffi_boundary!(nonnull(tx, event, out_event_id) {
        let ev = super::event::to_new_event(&*event)?;
        let tx = &mut *tx;
        let shared = tx.owned("outbox_enqueue_in_tx")?.0.clone();
        shared.check_running()?;
        let id = shared.relay.enqueue_in_tx(tx.live()?, &ev)?;
        *out_event_id = id;
        Ok(())
    })
}

/// Commits the transaction, then wakes the relay so its events are dispatched at once (the
/// fast path). Afterwards the tx only accepts `outbox_tx_free` (other calls:
/// `OUTBOX_ERR_TX_FINISHED`). If the commit fails the transaction is over too (rolled back by
/// the server or lost with the connection): the events were not enqueued.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_commit(tx: *mut outbox_tx) -> outbox_result {
    ffi_boundary!(nonnull(tx) {
        let tx = &mut *tx;
        tx.live()?;
        let (shared, t) = tx.owned("outbox_tx_commit")?;
        t.take().expect("live").commit()?;
        if !shared.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            shared.relay.notify();
        }
        Ok(())
    })
}

/// Rolls the transaction back: neither the business writes nor the events remain.
/// Afterwards the tx only accepts `outbox_tx_free`.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_rollback(tx: *mut outbox_tx) -> outbox_result {
    ffi_boundary!(nonnull(tx) {
        let tx = &mut *tx;
        tx.live()?;
        tx.owned("outbox_tx_rollback")?.1.take().expect("live").rollback()?;
        Ok(())
    })
}

/// Frees a transaction, rolling it back first if it was neither committed nor rolled back, and
/// returns its connection to the pool. NULL is a no-op; freeing twice is undefined behaviour.
/// May be called after `outbox_stop` or `outbox_free` of its relay.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_free(tx: *mut outbox_tx) {
    ffi_boundary!(void, nonnull(tx) {
        let mut tx = Box::from_raw(tx);
        if let TxKind::Borrowed { .. } = tx.kind {
            // Not ours to free: the consumer frees it after the callback. Leak the box back.
            log::error!("outbox_tx_free called on a consumer's transaction; ignored");
            let _ = Box::into_raw(tx);
            return;
        }
        if let Some(t) = tx.owned("outbox_tx_free").ok().and_then(|(_, t)| t.take()) {
            // Dropping a transaction also rolls back, but ignores a failure silently.
            if let Err(e) = t.rollback() {
                log::warn!("outbox_tx_free: rollback of an unfinished transaction failed: {e}");
            }
        }
    })
}
