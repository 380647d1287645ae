//! JNI glue for `bindings/java` (package `io.outbox`, class `Native`).
//!
//! Every entry point is a `jni_entry!` and goes through [`boundary::guard`]: panics are caught,
//! every error becomes the Java exception of its kind (`OutboxConfigException`,
//! `OutboxInvalidEventException`, `OutboxDatabaseException`, `OutboxStoppedException`, ...), and
//! nothing but a pending exception and a harmless default reaches the JVM. An operation the C ABI
//! offers too is written once in `crate::host`; the entry point converts its arguments and result.
//!
//! Relays, consumers and transactions are handed to Java as `long` handles that index a
//! registry of `Arc`s: a handle is never a pointer, is never reused, and a closed or unknown
//! handle throws `OutboxStoppedException` instead of touching freed memory. A call in progress
//! holds its own `Arc`, so closing a relay from another thread never frees it under that call.
//!
//! Files: the entry points of the library, the relay and library-owned transactions here; the
//! consumer runtime's (`OutboxConsumer`) in `consumer.rs`; argument conversion in `args.rs`; the
//! registries behind the handles (including the consumer's transaction, lent to its Java handler
//! for one call) in `handles.rs`; the exception boundary in `boundary.rs`; log records and dead
//! letters delivered to Java from native threads in `logging.rs` and `dead_letter.rs`.

mod args;
mod boundary;
mod consumer;
mod dead_letter;
mod handles;
mod logging;

use std::ptr::null_mut;
use std::sync::Arc;

use ::jni::objects::{JByteArray, JDoubleArray, JLongArray, JObject, JObjectArray, JString};
use ::jni::sys::{jboolean, jint, jintArray, jlong, jlongArray, jobjectArray, jstring, JNI_FALSE, JNI_TRUE};
use ::jni::JNIEnv;

use crate::config::Config;
use crate::error::{ConfigError, Error};
use crate::host::relay::{check_event, insert_statement, HostRelay};
use crate::host::tx::HostTx;
use crate::host::{log_level, relay as host_relay};
use crate::migrate::{migrate_table, MigrationReport};
use crate::relay::{DeadLetterHook, StopReport};
use crate::store::DeadLetter;
use args::{config_from, event_from, int_array, jstr, long_array, millis, statement_from, string};
use boundary::{jni_entry, string_array, Failure, JResult};

/// Version of the contract between `outbox.jar` and this library (the set of native methods
/// and their signatures). The jar refuses a library with another value.
pub const JNI_ABI_VERSION: jint = 7;

// ---------------------------------------------------------------------------------------------
// results

fn report_array(env: &mut JNIEnv<'_>, r: &StopReport) -> JResult<jlongArray> {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    long_array(
        env,
        &[
            clamp(r.released),
            clamp(r.in_flight_at_deadline),
            i64::from(r.timed_out),
            i64::from(r.already_stopped),
        ],
    )
}

fn migration_array(env: &mut JNIEnv<'_>, r: &MigrationReport) -> JResult<jintArray> {
    let clamp = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let mut v = vec![clamp(r.current)];
    v.extend(r.applied.iter().map(|&n| clamp(n)));
    int_array(env, &v)
}

fn clamp_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------------
// library

jni_entry! {
    fn Java_io_outbox_Native_abiVersion() -> jint = 0, |_| Ok(JNI_ABI_VERSION)
}

jni_entry! {
    /// Routes the library's log records to `Native.log` (System.Logger); called once at load.
    fn Java_io_outbox_Native_installLogger() -> () = (), |env| logging::install(env)
}

jni_entry! {
    /// Sets the process-wide log threshold (0 off, 1 error ... 5 trace).
    fn Java_io_outbox_Native_setLogLevel(level: jint) -> () = (), |_| Ok(log_level::set_max_level(level)?)
}

jni_entry! {
    /// Logs one record through the library's logger, from a thread the JVM has never seen (as a
    /// relay thread would): for the binding's tests of the logging path.
    fn Java_io_outbox_Native_selfTestLog(message: JString<'l>) -> () = (), |env| {
        let message = string(env, &message, "message")?;
        let name = "outbox-log-self-test";
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || log::warn!(target: "outbox::self_test", "{message}"))
            .map_err(|source| Error::Thread { name: name.into(), source })?
            .join()
            .map_err(|_| Failure::IllegalState("the logging thread panicked".into()))
    }
}

jni_entry! {
    fn Java_io_outbox_Native_version() -> jstring = null_mut(), |env| jstr(env, crate::VERSION)
}

jni_entry! {
    fn Java_io_outbox_Native_features() -> jobjectArray = null_mut(), |env| {
        let mut features = vec!["jni"];
        if cfg!(feature = "rocketmq") {
            features.push("rocketmq");
        }
        Ok(string_array(env, &features)?.into_raw())
    }
}

jni_entry! {
    /// `[key0, doc0, redaction0, key1, doc1, redaction1, ...]` in documentation order; a redaction
    /// is `secret` (shown as `***`), `url` (the password of a URL hidden), `urls` (the password of
    /// each URL of a list hidden) or empty (shown as is).
    fn Java_io_outbox_Native_configKeyDocs() -> jobjectArray = null_mut(), |env| {
        use crate::config::Redaction;
        let flat: Vec<&str> = crate::config::KEYS
            .iter()
            .flat_map(|k| {
                let redaction = match k.redaction {
                    Redaction::Hidden => "secret",
                    Redaction::UrlPassword => "url",
                    Redaction::UrlListPasswords => "urls",
                    Redaction::Shown => "",
                };
                [k.key, k.doc, redaction]
            })
            .collect();
        Ok(string_array(env, &flat)?.into_raw())
    }
}

jni_entry! {
    /// The default value of `key`, in the form `set` accepts.
    fn Java_io_outbox_Native_configDefault(key: JString<'l>) -> jstring = null_mut(), |env| {
        let key = string(env, &key, "key")?;
        let value = Config::default().get(&key).ok_or(ConfigError::UnknownKey { key })?;
        jstr(env, value)
    }
}

jni_entry! {
    /// Checks one key and value alone (unknown key, bad value).
    fn Java_io_outbox_Native_configCheck(key: JString<'l>, value: JString<'l>) -> () = (), |env| {
        let key = string(env, &key, "key")?;
        let value = string(env, &value, "value")?;
        Ok(Config::default().set(&key, &value)?)
    }
}

jni_entry! {
    /// Checks a whole configuration: every key and value, then the values against each other.
    fn Java_io_outbox_Native_configValidate(keys: JObjectArray<'l>, values: JObjectArray<'l>) -> () = (), |env| {
        Ok(config_from(env, &keys, &values)?.validate()?)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_insertStatement(table: JString<'l>, scheduled: jboolean) -> jstring = null_mut(), |env| {
        let table = string(env, &table, "table")?;
        jstr(env, insert_statement(&table, scheduled != 0)?)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_insertParams(scheduled: jboolean) -> jobjectArray = null_mut(), |env| {
        let names = if scheduled != 0 {
            crate::store::INSERT_SCHEDULED_PARAMS
        } else {
            crate::store::INSERT_PARAMS
        };
        Ok(string_array(env, names)?.into_raw())
    }
}

jni_entry! {
    /// Validates an event as `enqueue` would and returns its `headers` column value (JSON, or
    /// `null` without headers), for the host-owned JDBC path.
    fn Java_io_outbox_Native_checkEvent(
        biz_no: JString<'l>, event_type: JString<'l>, payload: JByteArray<'l>, topic: JString<'l>, tag: JString<'l>,
        header_keys: JObjectArray<'l>, header_values: JObjectArray<'l>,
        deliver_at_ms: jlong, delay_ms: jlong,
        payload_max_bytes: jlong,
    ) -> jstring = null_mut(), |env| {
        let mut event = event_from(env, [&biz_no, &event_type, &topic, &tag], &payload, [&header_keys, &header_values])?;
        event.schedule = crate::event::Schedule::from_millis(deliver_at_ms, delay_ms)?;
        let max = usize::try_from(payload_max_bytes)
            .map_err(|_| Failure::IllegalArgument(format!("payload limit {payload_max_bytes}")))?;
        match check_event(&event, max)? {
            Some(json) => jstr(env, json),
            None => Ok(null_mut()),
        }
    }
}

jni_entry! {
    /// Applies the pending migrations to the configured table; `[current, applied...]`.
    fn Java_io_outbox_Native_migrateConfig(keys: JObjectArray<'l>, values: JObjectArray<'l>) -> jintArray = null_mut(), |env| {
        let report = host_relay::migrate(&config_from(env, &keys, &values)?)?;
        migration_array(env, &report)
    }
}

jni_entry! {
    /// Applies the consuming half's pending migrations alone; `[current, applied...]`.
    fn Java_io_outbox_Native_migrateConsumerConfig(keys: JObjectArray<'l>, values: JObjectArray<'l>) -> jintArray = null_mut(), |env| {
        let report = crate::host::consumer::migrate_consumer(&config_from(env, &keys, &values)?)?;
        migration_array(env, &report)
    }
}

jni_entry! {
    /// Handles live in this process: `[relays, transactions, consumers]` (for tests of the
    /// Cleaner backstop).
    fn Java_io_outbox_Native_liveHandles() -> jlongArray = null_mut(), |env| {
        let (relays, txs) = handles::live();
        long_array(env, &[relays as i64, txs as i64, consumer::live() as i64])
    }
}

jni_entry! {
    /// Panics inside the boundary: proves that a Rust panic reaches Java as an exception.
    fn Java_io_outbox_Native_selfTestPanic() -> () = (), |_| {
        panic!("self-test panic requested by the Java binding's tests")
    }
}

// ---------------------------------------------------------------------------------------------
// relay

jni_entry! {
    fn Java_io_outbox_Native_start(
        keys: JObjectArray<'l>,
        values: JObjectArray<'l>,
        dead_letter_listener: JObject<'l>,
    ) -> jlong = 0, |env| {
        let config = config_from(env, &keys, &values)?;
        let hook: Option<DeadLetterHook> = if dead_letter_listener.is_null() {
            None
        } else {
            let listener = Arc::new(dead_letter::JavaListener::new(env, &dead_letter_listener)?);
            Some(Arc::new(move |d: &DeadLetter| listener.deliver(d)))
        };
        Ok(handles::add_relay(HostRelay::start(config, hook)?))
    }
}

jni_entry! {
    /// Calls the relay's dead-letter hook with a made-up letter from a thread the JVM has never
    /// seen, as a relay thread would: proves the attach-and-call path without a failing broker.
    fn Java_io_outbox_Native_selfTestDeadLetter(handle: jlong) -> jboolean = JNI_FALSE, |_| {
        let Some(hook) = handles::relay(handle)?.dead_letter_hook() else {
            return Ok(JNI_FALSE);
        };
        let letter = DeadLetter {
            id: 42,
            biz_no: "SELF-TEST".into(),
            event_type: "SELF_TEST".into(),
            retry_count: 3,
            last_error: "self-test dead letter".into(),
        };
        std::thread::spawn(move || hook(&letter))
            .join()
            .map_err(|_| Failure::IllegalState("the dead-letter hook panicked".into()))?;
        Ok(JNI_TRUE)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_notifyRelay(handle: jlong) -> () = (), |_| Ok(handles::relay(handle)?.notify()?)
}

jni_entry! {
    /// Cancels one event: its `crate::cancel::CancelOutcome::code` (`io.outbox.CancelOutcome`'s ordinal).
    fn Java_io_outbox_Native_cancel(handle: jlong, event_id: jlong) -> jint = -1, |_| {
        let id = u64::try_from(event_id)
            .map_err(|_| Failure::IllegalArgument(format!("event id {event_id} is negative")))?;
        Ok(handles::relay(handle)?.cancel(id)?.code())
    }
}

jni_entry! {
    /// Cancels the pending events of a business key (and type): how many.
    fn Java_io_outbox_Native_cancelByBizNo(handle: jlong, biz_no: JString<'l>, event_type: JString<'l>) -> jlong = 0, |env| {
        let biz_no = string(env, &biz_no, "bizNo")?;
        let event_type = args::opt_string(env, &event_type)?;
        Ok(handles::relay(handle)?.cancel_by_biz_no(&biz_no, event_type.as_deref())? as jlong)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_stats(handle: jlong, with_gauges: jboolean) -> jstring = null_mut(), |env| {
        let json = handles::relay(handle)?.stats_json(with_gauges != JNI_FALSE);
        jstr(env, json)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_instanceId(handle: jlong) -> jstring = null_mut(), |env| {
        let relay = handles::relay(handle)?;
        jstr(env, relay.relay.instance_id())
    }
}

jni_entry! {
    fn Java_io_outbox_Native_isRelaying(handle: jlong) -> jboolean = JNI_FALSE, |_| {
        Ok(jboolean::from(handles::relay(handle)?.relay.is_relaying()))
    }
}

jni_entry! {
    /// The relay's effective value of `key` (secrets masked, the password removed from `db.url`).
    fn Java_io_outbox_Native_relayConfigGet(handle: jlong, key: JString<'l>) -> jstring = null_mut(), |env| {
        let key = string(env, &key, "key")?;
        let relay = handles::relay(handle)?;
        let value = relay.relay.config().get_redacted(&key).ok_or(ConfigError::UnknownKey { key })?;
        jstr(env, value)
    }
}

jni_entry! {
    fn Java_io_outbox_Native_migrate(handle: jlong) -> jintArray = null_mut(), |env| {
        let relay = handles::relay(handle)?;
        let report = migrate_table(relay.relay.pool(), &relay.relay.config().table)?;
        migration_array(env, &report)
    }
}

jni_entry! {
    /// Stops relaying (the handle stays valid until `close`); `[released, in_flight_at_deadline,
    /// timed_out, already_stopped]`.
    fn Java_io_outbox_Native_stop(handle: jlong, timeout_ms: jlong) -> jlongArray = null_mut(), |env| {
        let report = handles::relay(handle)?.stop(millis(timeout_ms));
        report_array(env, &report)
    }
}

jni_entry! {
    /// Stops the relay and releases the handle. Unknown or already closed handles return `null`.
    fn Java_io_outbox_Native_close(handle: jlong, timeout_ms: jlong) -> jlongArray = null_mut(), |env| {
        match handles::remove_relay(handle) {
            Some(relay) => report_array(env, &relay.stop(millis(timeout_ms))),
            None => Ok(null_mut()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// library-owned transactions

jni_entry! {
    fn Java_io_outbox_Native_txBegin(handle: jlong) -> jlong = 0, |_| {
        Ok(handles::add_tx(HostTx::begin(handles::relay(handle)?)?))
    }
}

jni_entry! {
    fn Java_io_outbox_Native_txExecute(
        tx: jlong,
        sql: JString<'l>, kinds: JByteArray<'l>, ints: JLongArray<'l>, doubles: JDoubleArray<'l>, blobs: JObjectArray<'l>,
    ) -> jlong = 0, |env| {
        let (sql, params) = statement_from(env, &sql, &kinds, &ints, &doubles, &blobs)?;
        let (affected, _) = handles::with_tx(tx, |t| t.execute(&sql, params))?;
        Ok(clamp_i64(affected))
    }
}

jni_entry! {
    /// The first column of the first row, as `[value]`, or `[]` when there is no row or it is
    /// NULL.
    fn Java_io_outbox_Native_txQueryLong(
        tx: jlong,
        sql: JString<'l>, kinds: JByteArray<'l>, ints: JLongArray<'l>, doubles: JDoubleArray<'l>, blobs: JObjectArray<'l>,
    ) -> jlongArray = null_mut(), |env| {
        let (sql, params) = statement_from(env, &sql, &kinds, &ints, &doubles, &blobs)?;
        let value = handles::with_tx(tx, |t| t.query_i64(&sql, params))?;
        long_array(env, value.as_slice())
    }
}

jni_entry! {
    fn Java_io_outbox_Native_txLastInsertId(tx: jlong) -> jlong = 0, |_| {
        Ok(clamp_i64(handles::with_tx(tx, HostTx::last_insert_id)?))
    }
}

jni_entry! {
    fn Java_io_outbox_Native_txEnqueue(
        tx: jlong,
        biz_no: JString<'l>, event_type: JString<'l>, payload: JByteArray<'l>, topic: JString<'l>, tag: JString<'l>,
        header_keys: JObjectArray<'l>, header_values: JObjectArray<'l>,
        deliver_at_ms: jlong, delay_ms: jlong,
    ) -> jlong = 0, |env| {
        let mut event = event_from(env, [&biz_no, &event_type, &topic, &tag], &payload, [&header_keys, &header_values])?;
        event.schedule = crate::event::Schedule::from_millis(deliver_at_ms, delay_ms)?;
        Ok(clamp_i64(handles::with_tx(tx, |t| t.enqueue(&event))?))
    }
}

jni_entry! {
    /// Commits and wakes the relay. The handle is released whatever the outcome. Refused on a
    /// consumer's transaction (only the consumer ends it).
    fn Java_io_outbox_Native_txCommit(tx: jlong) -> () = (), |_| {
        handles::end_tx(tx, HostTx::commit)
            .unwrap_or_else(|| Err(Failure::IllegalState(format!("transaction {tx} is already finished"))))
    }
}

jni_entry! {
    /// Rolls back and releases the handle; a finished or unknown handle is a no-op. Refused on a
    /// consumer's transaction (only the consumer ends it).
    fn Java_io_outbox_Native_txRollback(tx: jlong) -> () = (), |_| {
        handles::end_tx(tx, |t| match t.rollback() {
            Err(crate::host::error::HostError::TxFinished) => Ok(()),
            other => other,
        })
        .unwrap_or(Ok(()))
    }
}
