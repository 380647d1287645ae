//! [`HostTx`]: a transaction a host runs statements through, of one of two kinds: owned by the
//! library (begun on a relay's pool, ended by the host's commit or rollback), or a consumer's,
//! lent to the host's handler for one call (only the consumer ends it). The operations on it:
//! execute, query, enqueue, the inbox mark, commit, rollback; the statement rule of
//! [`ends_transaction`]; and, on a lent one, whether a statement failed transiently (the
//! consumer then retries the message without using an attempt).

use std::sync::Arc;

use mysql::prelude::Queryable;
use mysql::{Params, Transaction, Value};

use super::error::{HostError, HostResult};
use super::owned_tx::OwnedTx;
use super::relay::HostRelay;
use super::statement::ends_transaction;
use crate::event::NewEvent;
use crate::inbox::{Inbox, MessageMeta};

/// A transaction a host runs statements through.
pub(crate) struct HostTx {
    kind: Kind,
}

enum Kind {
    /// Begun on a relay's pool; `None` once committed or rolled back.
    Owned { relay: Arc<HostRelay>, tx: Option<OwnedTx> },
    /// A consumer's transaction, lent for one handler call (see [`HostTx::lent`]); `transient`
    /// once a statement through it failed with a transient database error.
    Lent {
        tx: *mut Transaction<'static>,
        transient: Option<Transience>,
    },
}

/// How a statement through a lent transaction failed transiently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transience {
    /// A deadlock or a lock wait timeout.
    LockConflict,
    /// Any other transient failure (a lost connection, a server going read-only).
    Other,
}

// SAFETY: an owned transaction is `Send` (its parts are). A lent one is used only while its
// lender keeps the transaction borrowed and waits for the handler call (see `HostTx::lent`);
// the transaction and its connection are `Send`.
unsafe impl Send for HostTx {}

impl HostTx {
    /// Begins a transaction on a connection of `relay`'s pool, waiting at most `db.pool.wait.ms`
    /// for one (`Error::PoolTimeout` past it).
    pub(crate) fn begin(relay: Arc<HostRelay>) -> HostResult<HostTx> {
        let tx = OwnedTx::begin(relay.relay.pool(), relay.relay.config())?;
        Ok(HostTx {
            kind: Kind::Owned { relay, tx: Some(tx) },
        })
    }

    /// `tx` (a consumer's transaction) lent to a host's handler.
    ///
    /// # Safety
    /// The result must not be used after the borrow of `tx` ends: the lender drops it (or stops
    /// every use of it) before the handler call returns to the consumer.
    pub(crate) unsafe fn lent(tx: &mut Transaction<'_>) -> HostTx {
        HostTx {
            kind: Kind::Lent {
                tx: (tx as *mut Transaction<'_>).cast(),
                transient: None,
            },
        }
    }

    /// Whether this is a consumer's transaction.
    pub(crate) fn is_lent(&self) -> bool {
        matches!(self.kind, Kind::Lent { .. })
    }

    /// Whether a statement through this lent transaction failed with a transient database error
    /// (a lock wait timeout, a deadlock, a lost connection), and which kind first.
    pub(crate) fn transient_failure(&self) -> Option<Transience> {
        match self.kind {
            Kind::Lent { transient, .. } => transient,
            Kind::Owned { .. } => None,
        }
    }

    /// Runs one statement; the affected row count and the last insert id (0 when none).
    /// Refuses a statement that would end the transaction (see [`HostTx::check_statement`]).
    pub(crate) fn execute(&mut self, sql: &str, params: Params) -> HostResult<(u64, u64)> {
        self.check_statement(sql)?;
        self.run(|t| {
            let result = t.exec_iter(sql, params)?;
            Ok((result.affected_rows(), result.last_insert_id().unwrap_or(0)))
        })
    }

    /// Runs a query and reads the first column of its first row as a whole number (`None`: no
    /// row, or NULL). A value that is not a whole number is `InvalidArgument`.
    pub(crate) fn query_i64(&mut self, sql: &str, params: Params) -> HostResult<Option<i64>> {
        self.check_statement(sql)?;
        let row: Option<mysql::Row> = self.run(|t| Ok(t.exec_first(sql, params)?))?;
        match row.and_then(|mut r| r.take::<Value, _>(0)) {
            None | Some(Value::NULL) => Ok(None),
            Some(v) => as_i64(&v).map(Some).ok_or_else(|| {
                HostError::InvalidArgument(format!("the first column ({v:?}) is not a 64-bit whole number"))
            }),
        }
    }

    /// The id the last INSERT through this transaction generated (0 when none; Java asks for it
    /// apart, the C ABI gets it from `execute`).
    #[cfg_attr(not(feature = "jni"), allow(dead_code))]
    pub(crate) fn last_insert_id(&mut self) -> HostResult<u64> {
        Ok(self.live()?.last_insert_id().unwrap_or(0))
    }

    /// Inserts `event` into the relay's outbox table (status WAIT), visible to relays when the
    /// transaction commits; the new row's id. `Error::Stopped` after the relay's stop.
    pub(crate) fn enqueue(&mut self, event: &NewEvent) -> HostResult<u64> {
        let (relay, tx) = self.owned("enqueue")?;
        let tx = tx.as_deref_mut().ok_or(HostError::TxFinished)?;
        Ok(relay.relay.enqueue_in_tx(tx, event)?)
    }

    /// Marks `key` as processed by `group` in the inbox `table` (`None`: the default table):
    /// true when the key is new, false for a duplicate.
    pub(crate) fn mark_inbox(
        &mut self,
        table: Option<&str>,
        group: &str,
        key: &str,
        meta: &MessageMeta,
    ) -> HostResult<bool> {
        let inbox = match table {
            Some(t) => Inbox::new(t)?,
            None => Inbox::default(),
        };
        self.run(|t| Ok(inbox.mark(t, group, key, meta)?))
    }

    /// Commits, then wakes the relay (unless stopped) so the events go out at once. The
    /// transaction is over afterwards, also when the commit fails.
    pub(crate) fn commit(&mut self) -> HostResult<()> {
        let (relay, tx) = self.owned("commit")?;
        tx.take().ok_or(HostError::TxFinished)?.commit()?;
        if !relay.relay.is_stopped() {
            relay.relay.notify();
        }
        Ok(())
    }

    /// Rolls back: neither the writes nor the events remain.
    pub(crate) fn rollback(&mut self) -> HostResult<()> {
        let (_, tx) = self.owned("rollback")?;
        tx.take().ok_or(HostError::TxFinished)?.rollback()?;
        Ok(())
    }

    /// The relay and the transaction of an owned one, or `ConsumerTx(what)` for a lent one.
    fn owned(&mut self, what: &'static str) -> HostResult<(&Arc<HostRelay>, &mut Option<OwnedTx>)> {
        match &mut self.kind {
            Kind::Owned { relay, tx } => Ok((relay, tx)),
            Kind::Lent { .. } => Err(HostError::ConsumerTx(what)),
        }
    }

    /// Refuses a statement that would end the transaction behind the library's back: COMMIT,
    /// ROLLBACK, BEGIN and the like on any transaction, and on a consumer's also the statements
    /// that commit implicitly (DDL), which would commit the inbox marks with half of the
    /// handler's work.
    fn check_statement(&self, sql: &str) -> HostResult<()> {
        let lent = self.is_lent();
        match ends_transaction(sql, lent) {
            None => Ok(()),
            Some(statement) => Err(HostError::EndsTransaction { statement, lent }),
        }
    }

    /// Runs `f` on the live transaction; a transient failure through a lent one is remembered.
    fn run<T>(&mut self, f: impl FnOnce(&mut Transaction<'static>) -> HostResult<T>) -> HostResult<T> {
        let result = f(self.live()?);
        if let (Err(e), Kind::Lent { transient, .. }) = (&result, &mut self.kind) {
            if e.is_retriable() && transient.is_none() {
                *transient = Some(if e.is_lock_conflict() {
                    Transience::LockConflict
                } else {
                    Transience::Other
                });
            }
        }
        result
    }

    fn live(&mut self) -> HostResult<&mut Transaction<'static>> {
        match &mut self.kind {
            // SAFETY: the lender keeps the transaction borrowed while this is used (`lent`).
            Kind::Lent { tx, .. } => Ok(unsafe { &mut **tx }),
            Kind::Owned { tx, .. } => tx.as_deref_mut().ok_or(HostError::TxFinished),
        }
    }
}

/// A whole number from a column value: integers, and text such as `990` or `990.00` (DECIMAL).
fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        Value::UInt(n) => i64::try_from(*n).ok(),
        Value::Bytes(b) => {
            let s = std::str::from_utf8(b).ok()?.trim();
            let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
            if !frac.bytes().all(|c| c == b'0') {
                return None;
            }
            whole.parse().ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::as_i64;
    use mysql::Value;

    #[test]
    fn whole_numbers_are_read_from_integers_and_decimal_text() {
        assert_eq!(as_i64(&Value::Int(-3)), Some(-3));
        assert_eq!(as_i64(&Value::UInt(7)), Some(7));
        assert_eq!(as_i64(&Value::UInt(u64::MAX)), None);
        assert_eq!(as_i64(&Value::Bytes(b"990".to_vec())), Some(990));
        assert_eq!(as_i64(&Value::Bytes(b"990.00".to_vec())), Some(990));
        assert_eq!(as_i64(&Value::Bytes(b"990.50".to_vec())), None);
        assert_eq!(as_i64(&Value::Bytes(b"abc".to_vec())), None);
        assert_eq!(as_i64(&Value::Double(1.0)), None);
    }
}
