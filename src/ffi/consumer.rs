//! The consuming half over the C ABI: the inbox mark on a transaction (`outbox_inbox_mark`) and
//! the consumer runtime (`outbox_consumer_*`, which needs the `rocketmq` feature), whose handler
//! is a C callback running in the consumer's transaction: one message per call
//! (`outbox_consumer_start`), or a batch's new messages per call (`outbox_consumer_start_batch`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::Arc;

use super::boundary::{arg_opt_str, arg_str, ffi_boundary, write_string_out, Failure, UserData};
use super::conf::outbox_conf;
use super::result::outbox_result::{self, *};
use super::tx::outbox_tx;
use crate::consumer::{BatchHandler, Handler, HandlerError, Message};
use crate::host::consumer::{self as host_consumer, Handling, HostConsumer};
use crate::host::tx::HostTx;
use crate::inbox::MessageMeta;

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
        let table = arg_opt_str(table, "table")?;
        let group = arg_str(consumer_group, "consumer_group")?;
        let key = arg_str(event_key, "event_key")?;
        let meta = MessageMeta {
            topic: arg_opt_str(topic, "topic")?.map(str::to_string),
            queue_id: u32::try_from(queue_id).ok(),
            queue_offset: u64::try_from(queue_offset).ok(),
            msg_id: arg_opt_str(msg_id, "msg_id")?.map(str::to_string),
        };
        *out_is_new = (*tx).tx.mark_inbox(table, group, key, &meta)?;
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
/// Returns:
/// - 0 to commit the work with the inbox mark;
/// - a retriable `outbox_result` (`outbox_result_is_retriable`: `OUTBOX_ERR_DATABASE`, which a
///   failing `outbox_tx_execute` returns for a lock wait timeout, a deadlock or a lost connection;
///   `OUTBOX_ERR_POOL_TIMEOUT`; `OUTBOX_ERR_PUBLISHER`) to roll back and retry after a backoff
///   **without using an attempt** (a statement through `tx` that failed that way during the call
///   makes any non-zero return transient too);
/// - any other non-zero value to roll back and retry with backoff, using an attempt: after
///   `consumer.max.attempts` the message is parked in the dead-letter table.
///
/// Optionally write why into `err` (`err_size` bytes, NUL-terminated). With batching on
/// (`consumer.batch.max` above 1), the messages waiting share one transaction: the callback runs
/// once per new message, in route order (`consumer.route`; by default queue order), then one
/// commit; a non-zero return rolls the batch back and it is handled again one message per
/// transaction. It runs on the consumer's threads, several at once: it must be thread-safe.
pub type outbox_consume_cb = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        tx: *mut outbox_tx,
        message: *const outbox_message,
        err: *mut c_char,
        err_size: usize,
    ) -> c_int,
>;

/// The consumer's batch handler (`outbox_consumer_start_batch`): runs once per batch with its
/// `count` new messages (duplicates left out), in route order (`consumer.route`; by default
/// queue order), inside the consumer's transaction `tx`, for handlers that write many rows in one
/// statement. Returns as `outbox_consume_cb`; a
/// non-zero return rolls the batch back and the callback is called again with one message at a
/// time, so only the failing message is retried and parked. `messages` is valid only during the
/// call.
pub type outbox_consume_batch_cb = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        tx: *mut outbox_tx,
        messages: *const outbox_message,
        count: usize,
        err: *mut c_char,
        err_size: usize,
    ) -> c_int,
>;

/// A consumer (`outbox_consumer_start`): running, or stopped with its final counts.
pub struct outbox_consumer {
    consumer: HostConsumer,
}

/// Starts a consumer of `topic` for `consumer_group`: it subscribes with RocketMQ
/// (`rocketmq.namesrv` of `conf`), and for each message runs `handler` in a transaction on
/// `db.url` that also holds the message's inbox mark. The `consumer.*` and `inbox.*` keys of
/// `conf` set how (threads, batch size, attempts, backoff, the inbox and dead-letter tables,
/// retention; `outboxd config example` lists them). The database is checked first (reachable,
/// the inbox and dead-letter tables present: run `outbox_migrate`), so a start that cannot work
/// fails at once, naming why. Offsets are committed only after the transaction commits. `conf` is
/// only read (free it yourself). Needs the library built with the `rocketmq` feature, else
/// `OUTBOX_ERR_PUBLISHER`. `errstr` as in `outbox_start`.
///
/// A name server or broker that cannot be reached does not fail the start (it may be starting
/// too): the consumer keeps trying, says why at WARN (at most every 30 s), and reports it in
/// `outbox_consumer_stats` (`"healthy": false`, `"unhealthy"`: the reason).
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
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf, out_consumer) {
        let cb = handler.ok_or_else(|| Failure::null("handler"))?;
        start_into(conf, topic, consumer_group, out_consumer, Handling::Each(Callback::new(cb, user_data)))
    })
}

/// Like `outbox_consumer_start`, with a batch handler given each batch's new messages at once.
///
/// Thread safety: safe from any thread.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_start_batch(
    conf: *const outbox_conf,
    topic: *const c_char,
    consumer_group: *const c_char,
    handler: outbox_consume_batch_cb,
    user_data: *mut c_void,
    out_consumer: *mut *mut outbox_consumer,
    errstr: *mut c_char,
    errstr_size: usize,
) -> outbox_result {
    ffi_boundary!(errstr(errstr, errstr_size), nonnull(conf, out_consumer) {
        let cb = handler.ok_or_else(|| Failure::null("handler"))?;
        start_into(conf, topic, consumer_group, out_consumer, Handling::Batch(Callback::new(cb, user_data)))
    })
}

type ConsumeFn = unsafe extern "C" fn(*mut c_void, *mut outbox_tx, *const outbox_message, *mut c_char, usize) -> c_int;
type ConsumeBatchFn =
    unsafe extern "C" fn(*mut c_void, *mut outbox_tx, *const outbox_message, usize, *mut c_char, usize) -> c_int;

/// The host's callback and its user data, which the host promises may be used from the
/// consumer's threads.
struct Callback<F> {
    cb: F,
    user_data: UserData,
}

impl<F> Callback<F> {
    fn new(cb: F, user_data: *mut c_void) -> Arc<Callback<F>> {
        Arc::new(Callback {
            cb,
            user_data: UserData(user_data),
        })
    }
}

impl Handler for Callback<ConsumeFn> {
    fn handle(&self, tx: &mut mysql::Transaction<'_>, m: &Message) -> Result<(), HandlerError> {
        call_handler(tx, std::slice::from_ref(m), |t, v, e, n| {
            // SAFETY: the host's callback, called as its documentation says.
            unsafe { (self.cb)(self.user_data.ptr(), t, v.as_ptr(), e, n) }
        })
    }
}

impl BatchHandler for Callback<ConsumeBatchFn> {
    fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        call_handler(tx, msgs, |t, v, e, n| {
            // SAFETY: the host's callback, called as its documentation says.
            unsafe { (self.cb)(self.user_data.ptr(), t, v.as_ptr(), v.len(), e, n) }
        })
    }
}

/// The arguments both starts share, decoded, and the consumer written to `out_consumer`.
unsafe fn start_into(
    conf: *const outbox_conf,
    topic: *const c_char,
    consumer_group: *const c_char,
    out_consumer: *mut *mut outbox_consumer,
    handling: Handling,
) -> Result<(), Failure> {
    let topic = arg_str(topic, "topic")?;
    let group = arg_str(consumer_group, "consumer_group")?;
    let consumer = host_consumer::start(&(*conf).config, topic, group, handling)?;
    *out_consumer = Box::into_raw(Box::new(outbox_consumer { consumer }));
    Ok(())
}

/// Runs a host callback on `msgs` in `tx`: builds their C views, lends `tx` as a borrowed
/// `outbox_tx`, and turns the callback's return code into the runtime's outcome (see
/// `outbox_consume_cb`).
fn call_handler(
    tx: &mut mysql::Transaction<'_>,
    msgs: &[Message],
    call: impl FnOnce(*mut outbox_tx, &[outbox_message], *mut c_char, usize) -> c_int,
) -> Result<(), HandlerError> {
    let texts: Vec<MessageTexts> = msgs.iter().map(MessageTexts::of).collect();
    let views: Vec<outbox_message> = msgs.iter().zip(&texts).map(|(m, t)| t.view(m)).collect();
    // SAFETY: the handle is freed below, before `tx`'s borrow ends; the callback may use it only
    // during the call.
    let handle = Box::into_raw(Box::new(outbox_tx {
        tx: unsafe { HostTx::lent(tx) },
    }));
    let mut err = vec![0u8; 512];
    let rc = call(handle, &views, err.as_mut_ptr().cast(), err.len());
    // SAFETY: allocated just above; the callback must not free it (outbox_tx_free refuses to).
    let lent = unsafe { Box::from_raw(handle) };
    if rc == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
    let text = String::from_utf8_lossy(&err[..end]).into_owned();
    let what = if text.is_empty() {
        format!("handler returned {rc}")
    } else {
        format!("handler returned {rc}: {text}")
    };
    let retriable = outbox_result::from_code(rc).is_some_and(outbox_result::is_retriable);
    Err(crate::host::consumer::handler_failure(
        what,
        retriable,
        lent.tx.transient_failure(),
    ))
}

/// The NUL-terminated copies a message's C view points into.
struct MessageTexts {
    key: CString,
    topic: CString,
    broker: CString,
    msg_id: Option<CString>,
    tag: Option<CString>,
    props: CString,
}

impl MessageTexts {
    fn of(m: &Message) -> MessageTexts {
        let c = |s: &str| CString::new(s.replace('\0', "\u{FFFD}")).unwrap_or_default();
        MessageTexts {
            key: c(&m.key),
            topic: c(&m.queue.topic),
            broker: c(&m.queue.broker),
            msg_id: m.msg_id.as_deref().map(c),
            tag: m.tag.as_deref().map(c),
            props: c(&serde_json::to_string(&m.properties).unwrap_or_else(|_| "{}".into())),
        }
    }

    /// The view of `m`, valid while `self` and `m` are.
    fn view(&self, m: &Message) -> outbox_message {
        outbox_message {
            key: self.key.as_ptr(),
            topic: self.topic.as_ptr(),
            broker: self.broker.as_ptr(),
            queue_id: m.queue.queue_id,
            queue_offset: m.offset,
            msg_id: self.msg_id.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tag: self.tag.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            properties_json: self.props.as_ptr(),
            body: m.body.as_ptr(),
            body_len: m.body.len(),
        }
    }
}

/// Writes the consumer's counters as JSON into `buf`: `received`, `processed`, `duplicates`,
/// `failed_attempts`, `dead_lettered`, `parked_copies`, `replayed`, `db_errors`,
/// `fallback_keys`, `transactions`, `batch_fallbacks`, `batch_retries`, `in_flight`, `lag` (null
/// until known), `healthy`, `unhealthy` (why not, or null) and `stopped`. After `outbox_consumer_stop` it
/// reports the final counts (`"stopped": true`). Buffer convention as in `outbox_stats`.
///
/// Thread safety: safe from any thread, except concurrently with `outbox_consumer_stop` or
/// `outbox_consumer_free`.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_stats(
    consumer: *const outbox_consumer,
    buf: *mut c_char,
    len: usize,
    out_needed: *mut usize,
) -> outbox_result {
    ffi_boundary!(nonnull(consumer, out_needed) {
        write_string_out(&(*consumer).consumer.stats_json(), buf, len, out_needed)
    })
}

/// Stops the consumer: no new messages, each handler thread finishes the messages in hand,
/// offsets are committed and stored, the consumer leaves its group. Blocks until then (bounded:
/// the broker side's shutdown is given at most a few seconds). Afterwards `outbox_consumer_stats`
/// reports the final counts and only `outbox_consumer_free` does anything else. Stopping twice:
/// `OUTBOX_ERR_STOPPED`.
///
/// Thread safety: not concurrently with other calls on the same consumer.
#[no_mangle]
pub unsafe extern "C" fn outbox_consumer_stop(consumer: *mut outbox_consumer) -> outbox_result {
    ffi_boundary!(nonnull(consumer) {
        match (*consumer).consumer.stop() {
            (_, false) => Ok(()),
            (_, true) => Err(Failure::new(OUTBOX_ERR_STOPPED, "the consumer is already stopped")),
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
