//! A transaction that owns its pooled connection, begun with a bounded wait for the pool
//! (`db.pool.wait.ms`), for the C ABI's and the Java binding's library-owned transactions.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use mysql::{Pool, PooledConn, Transaction, TxOpts};

use crate::config::Config;
use crate::error::Error;

/// A transaction on a connection taken from the pool. Dropping it rolls back (if it was not
/// finished) and returns the connection to the pool.
pub(crate) struct OwnedTx {
    /// Borrows `*conn`; always dropped before it (see `Drop`).
    tx: Option<Transaction<'static>>,
    /// Heap-allocated so its address is stable while `tx` borrows it; freed in `Drop`.
    conn: NonNull<PooledConn>,
}

// SAFETY: the connection and the transaction on it are `Send`; `OwnedTx` is their only owner
// and is used by one thread at a time (`&mut` access only).
unsafe impl Send for OwnedTx {}

impl OwnedTx {
    /// Begins a transaction on a connection of `pool`, waiting at most `config.db_pool_wait`
    /// for one to become free (`Error::PoolTimeout` past it).
    pub(crate) fn begin(pool: &Pool, config: &Config) -> Result<OwnedTx, Error> {
        let conn = match config.db_pool_wait {
            Some(wait) => pool.try_get_conn(wait).map_err(|e| match e {
                mysql::Error::DriverError(mysql::DriverError::Timeout) => Error::PoolTimeout {
                    waited_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    pool_max: config.db_pool_max,
                },
                e => Error::Db(e),
            })?,
            None => pool.get_conn()?,
        };
        let conn = NonNull::from(Box::leak(Box::new(conn)));
        // SAFETY: `conn` is a live heap allocation that only `OwnedTx` frees, after the
        // transaction borrowing it is gone; nothing else touches it meanwhile.
        let started = unsafe { (*conn.as_ptr()).start_transaction(TxOpts::default()) };
        match started {
            Ok(tx) => {
                // SAFETY: see above: the borrow lives exactly as long as `OwnedTx` keeps both.
                let tx = unsafe { std::mem::transmute::<Transaction<'_>, Transaction<'static>>(tx) };
                Ok(OwnedTx { tx: Some(tx), conn })
            }
            Err(e) => {
                // SAFETY: the allocation made above, not borrowed any more.
                drop(unsafe { Box::from_raw(conn.as_ptr()) });
                Err(Error::Db(e))
            }
        }
    }

    fn take(&mut self) -> Transaction<'static> {
        self.tx
            .take()
            .expect("the transaction is present until commit/rollback consume it")
    }

    pub(crate) fn commit(mut self) -> Result<(), mysql::Error> {
        self.take().commit()
    }

    pub(crate) fn rollback(mut self) -> Result<(), mysql::Error> {
        self.take().rollback()
    }
}

impl Deref for OwnedTx {
    type Target = Transaction<'static>;

    fn deref(&self) -> &Transaction<'static> {
        self.tx
            .as_ref()
            .expect("the transaction is present until commit/rollback consume it")
    }
}

impl DerefMut for OwnedTx {
    fn deref_mut(&mut self) -> &mut Transaction<'static> {
        self.tx
            .as_mut()
            .expect("the transaction is present until commit/rollback consume it")
    }
}

impl Drop for OwnedTx {
    fn drop(&mut self) {
        // The transaction first (it rolls back on its connection), then the connection.
        drop(self.tx.take());
        // SAFETY: allocated in `begin`, freed only here, no borrow left.
        drop(unsafe { Box::from_raw(self.conn.as_ptr()) });
    }
}
