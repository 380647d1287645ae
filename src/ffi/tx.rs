//! `outbox_tx`: a library-owned transaction on a pooled connection, for hosts whose own
//! database access cannot join the library's (C, C++, or Go/Java hosts that accept it).

use std::ffi::c_char;

use super::boundary::{arg_str, ffi_boundary, Failure};
use super::event::{outbox_event, outbox_param, outbox_schedule, to_new_event, to_params, to_schedule};
use super::relay::outbox_relay;
use super::result::outbox_result;
use crate::host::error::HostError;
use crate::host::tx::HostTx;

/// A database transaction owned by the library, holding one connection of the relay's pool.
/// Begun by `outbox_tx_begin`, ended by `outbox_tx_commit` or `outbox_tx_rollback`, always
/// freed by `outbox_tx_free` (which rolls back if it was not ended).
///
/// A consumer's handler callback gets a borrowed one instead (`outbox_consumer_start`): the
/// consumer's transaction, which the consumer commits or rolls back after the callback.
pub struct outbox_tx {
    pub(crate) tx: HostTx,
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
        let host = &(*relay).host;
        // Only the C ABI refuses it after a stop (Java's transactions outlive `stop`).
        host.check_running()?;
        *out_tx = Box::into_raw(Box::new(outbox_tx { tx: HostTx::begin(host.clone())? }));
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
        let (affected, last_id) = (*tx).tx.execute(arg_str(sql, "sql")?, to_params(params, nparams)?)?;
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
        let value = (*tx).tx.query_i64(arg_str(sql, "sql")?, to_params(params, nparams)?)?;
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
        *out_event_id = (*tx).tx.enqueue(&to_new_event(&*event)?)?;
        Ok(())
    })
}

/// Like `outbox_enqueue_in_tx`, for an event sent at a later time (`schedule`; NULL or both
/// fields 0: as soon as it commits). A scheduled event uses no attempt while it waits.
/// `OUTBOX_ERR_INVALID_EVENT` names a wrong schedule (both fields set, a negative value, more
/// than 366 days ahead) and nothing is written.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_enqueue_scheduled_in_tx(
    tx: *mut outbox_tx,
    event: *const outbox_event,
    schedule: *const outbox_schedule,
    out_event_id: *mut u64,
) -> outbox_result {
    ffi_boundary!(nonnull(tx, event, out_event_id) {
        let mut ev = to_new_event(&*event)?;
        ev.schedule = to_schedule(schedule)?;
        *out_event_id = (*tx).tx.enqueue(&ev)?;
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
    ffi_boundary!(nonnull(tx) { Ok((*tx).tx.commit()?) })
}

/// Rolls the transaction back: neither the business writes nor the events remain.
/// Afterwards the tx only accepts `outbox_tx_free`.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_rollback(tx: *mut outbox_tx) -> outbox_result {
    ffi_boundary!(nonnull(tx) { Ok((*tx).tx.rollback()?) })
}

/// Frees a transaction, rolling it back first if it was neither committed nor rolled back, and
/// returns its connection to the pool. NULL is a no-op; freeing twice is undefined behaviour.
/// May be called after `outbox_stop` or `outbox_free` of its relay.
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_tx_free(tx: *mut outbox_tx) {
    ffi_boundary!(void, nonnull(tx) {
        if (*tx).tx.is_lent() {
            // Not ours to free: the consumer frees it after the callback.
            log::error!("outbox_tx_free called on a consumer's transaction; ignored");
            return;
        }
        // Dropping a transaction also rolls back, but ignores a failure silently.
        match Box::from_raw(tx).tx.rollback() {
            Ok(()) | Err(HostError::TxFinished) => {}
            Err(e) => log::warn!(
                "outbox_tx_free: rollback of an unfinished transaction failed: {}",
                Failure::from(e).message
            ),
        }
    })
}
