//! The consuming half over the C ABI: the inbox mark on a transaction (`outbox_inbox_mark`) and
//! the consumer runtime (`outbox_consumer_*`, which needs the `rocketmq` feature), whose handler
//! is a C callback running in the consumer's transaction.

use std::ffi::{c_char, c_int, c_void, CString};

use super::boundary::{arg_str, ffi_boundary, with_errstr, write_string_out, Failure, UserData};
use super::conf::outbox_conf;
use super::result::outbox_result::{self, *};
use super::tx::outbox_tx;
use crate::consumer::{Consumer, Message};
use crate::inbox::{Inbox, MessageMeta};

/// Marks `event_key` as processed by `consumer_group` inside `tx` (claim first: call it before
/// the handler's writes, in the same transaction). `table` is the inbox table (NULL: the default
/// `outbox_inbox`). `topic` and `msg_id` may be NULL; `queue_id` and `queue_offset` are stored
/// when not negative. On success `*out_is_new` is true when the key is new (now marked: do the
/// work, then commit) and false when the group already processed it (a duplicate: do nothing;
/// the transaction stays usable). If another transaction holds an uncommitted mark of the key,
/// this waits for it to end. A bad group, key or table is `OUTBOX_ERR_INVALID_EVENT` /
/// `OUTBOX_ERR_INVALID_VALUE` naming the field, and nothing is written.
///
/// Works on a transaction from `outbox_tx_begin` and on the one a consumer callback receives
/// (where the consumer has already marked the message's key: this is for other keys).
///
/// Thread safety: not thread-safe for the same tx.
#[no_mangle]
pub unsafe extern "C" fn outbox_inbox_mark(
    tx: *mut outbox_tx,
    table: *const c_char,
    consumer_group: *const c_char,
    event_key: *const c_char,
    topic: *const c_char,
    queue_id: i64,
    queue_offset: i64,
    msg_id: *const c_char,
    out_is_new: *mut bool,
) -> outbox_result {
    ffi_boundary!(nonnull(tx, consumer_group, event_key, out_is_new) {
        let inbox = if table.is_null() {
            Inbox::default()
        } else {
            Inbox::new(arg_str(table, "table")?)?
        };
        let group = arg_str(consumer_group, "consumer_group")?;
        let key = arg_str(event_key, "event_key")?;
        let opt = |p: *const c_char, name: &str| -> Result<Option<String>, Failure> {
            if p.is_null() {
                Ok(None)
            } else {
                arg_str(p, name).map(|s| Some(s.to_string()))
            }
        };
        let meta = MessageMeta {
            topic: opt(topic, "topic")?,
            queue_id: u32::try_from(queue_id).ok(),
            queue_offset: u64::try_from(queue_offset).ok(),
            msg_id: opt(msg_id, "msg_id")?,
        };
        let t = (*tx).live()?;
        *out_is_new = inbox.mark(t, group, key, &meta)?;
        Ok(())
    })
}

/// A message as the consumer's handler callback sees it. Every pointer is valid only during the
/// callback; copy what you keep. Strings are NUL-terminated UTF-8.
#[repr(C)]
pub struct outbox_message {
    /// The dedup key the consumer marked (the `eventKey` property).
    pub key: *const c_char,
    pub topic: *const c_char,
    pub broker: *const c_char,
    pub queue_id: u32,
    pub queue_offset: u64,
    /// The broker's message id, or NULL.
    pub msg_id: *const c_char,
    /// The tag, or NULL.
    pub tag: *const c_char,
    /// The user properties as a JSON object of strings (`eventId`, `eventKey`, `eventType`,
    /// `bizNo`, headers).
    pub properties_json: *const c_char,
    pub body: *const u8,
    pub body_len: usize,
}

/// The consumer's handler: runs once per new key, inside the consumer's transaction `tx` (use it
/// with `outbox_tx_execute` / `outbox_tx_query_int64`; do not commit, roll back or free it).
/// Return 0 to commit the work with the inbox mark; non-zero to roll both back, and optionally
/// write why into `err` (`err_size` bytes, NUL-terminated): the message is retried with backoff,
/// then parked in the dead-letter table. It runs on the consumer's threads, several at once:
/// it must be thread-safe.
pub type outbox_consume_cb = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        tx: *mut outbox_tx,
        message: *const outbox_message,
        err: *mut c_char,
        err_size: usize,
    ) -> c_int,
>;

/// A running consumer (`outbox_consumer_start`).
pub struct outbox_consumer {
    consumer: Option<Consumer>,
}

/// Starts a consumer of `topic` for `consumer_group`: it subscribes with RocketMQ
/// (`rocketmq.namesrv` of `conf`), and for each message runs `handler` in a transaction on
/// `db.url` that also holds the message's inbox mark (`outbox_inbox`; dead letters go to
/// `outbox_inbox_dead_letter`: run `outbox_migrate` first). Offsets are committed only after the
/// transaction commits. `conf` is only read (free it yourself). Needs the library built with the
/// `rocketmq` feature, else `OUTBOX_ERR_PUBLISHER`. `errstr` as in `outbox_start`.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_start(
    conf: *const outbox_conf,
    topic: *const c_char,
    consumer_group: *const c_char,
    handler: outbox_consume_cb,
    user_data: *mut c_void,
    out_consumer: *mut *mut outbox_consumer,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(nonnull() {
        with_errstr(errstr, errstr_size, || {
            if conf.is_null() {
                return Err(Failure::null("conf"));
            }
            if out_consumer.is_null() {
                return Err(Failure::null("out_consumer"));
            }
            let Some(cb) = handler else {
                return Err(Failure::null("handler"));
            };
            let topic = arg_str(topic, "topic")?;
            let group = arg_str(consumer_group, "consumer_group")?;
            let consumer = start(&(*conf).config, topic, group, cb, UserData(user_data))?;
            *out_consumer = Box::into_raw(Box::new(outbox_consumer {
                consumer: Some(consumer),
            }));
            Ok(())
        })
    })
}

type ConsumeFn = unsafe extern "C" fn(*mut c_void, *mut outbox_tx, *const outbox_message, *mut c_char, usize) -> c_int;

#[cfg(feature = "rocketmq")]
fn start(config: &crate::Config, topic: &str, group: &str, cb: ConsumeFn, ud: UserData) -> Result<Consumer, Failure> {
    use crate::rocketmq::{RocketMqSource, SourceConfig};
    let pool = crate::db::connect(config)?;
    let source = RocketMqSource::start(&SourceConfig::new(&config.rocketmq.namesrv, topic, group))?;
    let handler = move |tx: &mut mysql::Transaction<'_>, m: &Message| call_handler(cb, ud, tx, m);
    Ok(Consumer::start(
        crate::consumer::ConsumerConfig::new(group),
        pool,
        std::sync::Arc::new(source),
        std::sync::Arc::new(handler),
    )?)
}

#[cfg(not(feature = "rocketmq"))]
fn start(_: &crate::Config, _: &str, _: &str, _: ConsumeFn, _: UserData) -> Result<Consumer, Failure> {
    Err(Failure::new(
        OUTBOX_ERR_PUBLISHER,
        "this library was built without the rocketmq feature: no consumer (cargo build --features rocketmq)",
    ))
}

/// Runs the C handler on `m` in `tx`.
#[cfg_attr(not(feature = "rocketmq"), allow(dead_code))]
fn call_handler(
    cb: ConsumeFn,
    ud: UserData,
    tx: &mut mysql::Transaction<'_>,
    m: &Message,
) -> Result<(), crate::consumer::HandlerError> {
    let c = |s: &str| CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default();
    let key = c(&m.key);
    let topic = c(&m.queue.topic);
    let broker = c(&m.queue.broker);
    let msg_id = m.msg_id.as_deref().map(c);
    let tag = m.tag.as_deref().map(c);
    let props = c(&serde_json::to_string(&m.properties).unwrap_or_else(|_| "{}".into()));
    let view = outbox_message {
        key: key.as_ptr(),
        topic: topic.as_ptr(),
        broker: broker.as_ptr(),
        queue_id: m.queue.queue_id,
        queue_offset: m.offset,
        msg_id: msg_id.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
        tag: tag.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
        properties_json: props.as_ptr(),
        body: m.body.as_ptr(),
        body_len: m.body.len(),
    };
    let handle = Box::into_raw(Box::new(outbox_tx::borrowed(tx)));
    let mut err = vec![0u8; 512];
    // SAFETY: the host's callback, called as its documentation says; every pointer outlives it.
    let rc = unsafe { cb(ud.0, handle, &view, err.as_mut_ptr().cast(), err.len()) };
    // SAFETY: allocated just above; the callback must not free it (outbox_tx_free refuses to).
    drop(unsafe { Box::from_raw(handle) });
    if rc == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
    let text = String::from_utf8_lossy(&err[..end]).into_owned();
    Err(if text.is_empty() {
        format!("handler returned {rc}").into()
    } else {
        format!("handler returned {rc}: {text}").into()
    })
}

/// Writes the consumer's counters as JSON into `buf` (`received`, `processed`, `duplicates`,
/// `failed_attempts`, `dead_lettered`, `replayed`, `db_errors`, `fallback_keys`, `in_flight`,
/// `lag` (null until known)). Buffer convention as in `outbox_stats`.
///
/// Thread safety: safe from any thread, except concurrently with `outbox_consumer_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_stats(
    consumer: *const outbox_consumer,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    ffi_boundary!(nonnull(consumer, out_needed) {
        let json = match &(*consumer).consumer {
            Some(c) => {
                let s = c.stats();
                serde_json::json!({
                    "received": s.received, "processed": s.processed, "duplicates": s.duplicates,
                    "failed_attempts": s.failed_attempts, "dead_lettered": s.dead_lettered,
                    "replayed": s.replayed, "db_errors": s.db_errors, "fallback_keys": s.fallback_keys,
                    "in_flight": s.in_flight, "lag": s.lag,
                })
                .to_string()
            }
            None => return Err(Failure::new(OUTBOX_ERR_STOPPED, "the consumer is stopped")),
        };
        write_string_out(&json, buf, len, out_needed)
    })
}

/// Stops the consumer: no new messages, each handler thread finishes the message in hand,
/// offsets are committed and stored, the consumer leaves its group. Blocks until then.
/// Afterwards only `outbox_consumer_free` is allowed. Stopping twice: `OUTBOX_ERR_STOPPED`.
///
/// Thread safety: not concurrently with other calls on the same consumer.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_stop(consumer: *mut outbox_consumer) -> outbox_result {
    ffi_boundary!(nonnull(consumer) {
        match (*consumer).consumer.take() {
            Some(c) => {
                c.stop();
                Ok(())
            }
            None => Err(Failure::new(OUTBOX_ERR_STOPPED, "the consumer is already stopped")),
        }
    })
}

/// Frees a consumer, stopping it first if needed. NULL is a no-op.
///
/// Thread safety: not concurrently with other calls on the same consumer.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_free(consumer: *mut outbox_consumer) {
    ffi_boundary!(void, nonnull(consumer) {
        drop(Box::from_raw(consumer));
    })
}
