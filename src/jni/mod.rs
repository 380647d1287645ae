//! JNI glue for `bindings/java` (package `io.outbox`, class `Native`).
//!
//! Every entry point goes through [`boundary::guard`]: panics are caught, every error becomes
//! the Java exception of its kind (`OutboxConfigException`, `OutboxInvalidEventException`,
//! `OutboxDatabaseException`, `OutboxStoppedException`, ...), and nothing but a pending
//! exception and a harmless default reaches the JVM.
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

use ::jni::objects::{JByteArray, JClass, JDoubleArray, JLongArray, JObject, JObjectArray, JString};
use ::jni::sys::{jboolean, jint, jintArray, jlong, jlongArray, jobjectArray, jstring, JNI_FALSE, JNI_TRUE};
use ::jni::JNIEnv;
use mysql::prelude::Queryable;

use crate::config::Config;
use crate::error::{ConfigError, Error};
use crate::relay::{DeadLetterHook, StopReport};
use crate::store::DeadLetter;
use args::{as_i64, config_from, event_from, int_array, jstr, long_array, millis, params_from, string};
use boundary::{guard, string_array, Failure, JResult};

/// Version of the contract between `outbox.jar` and this library (the set of native methods
/// and their signatures). The jar refuses a library with another value.
pub const JNI_ABI_VERSION: jint = 4;

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

fn migration_array(env: &mut JNIEnv<'_>, r: &crate::migrate::MigrationReport) -> JResult<jintArray> {
    let clamp = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
    let mut v = vec![clamp(r.current)];
    v.extend(r.applied.iter().map(|&n| clamp(n)));
    int_array(env, &v)
}

// ---------------------------------------------------------------------------------------------
// library

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_abiVersion<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jint {
    guard(&mut env, 0, |_| Ok(JNI_ABI_VERSION))
}

/// Routes the library's log records to `Native.log` (System.Logger); called once at load.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_installLogger<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) {
    guard(&mut env, (), logging::install)
}

/// Sets the process-wide log threshold (0 off, 1 error ... 5 trace).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_setLogLevel<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, level: jint) {
    guard(&mut env, (), |_| {
        let filter = match level {
            0 => log::LevelFilter::Off,
            1 => log::LevelFilter::Error,
            2 => log::LevelFilter::Warn,
            3 => log::LevelFilter::Info,
            4 => log::LevelFilter::Debug,
            5 => log::LevelFilter::Trace,
            _ => return Err(Failure::IllegalArgument(format!("unknown log level {level}"))),
        };
        log::set_max_level(filter);
        Ok(())
    })
}

/// Logs one record through the library's logger, from a thread the JVM has never seen (as a
/// relay thread would): for the binding's tests of the logging path.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_selfTestLog<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    message: JString<'l>,
) {
    guard(&mut env, (), |env| {
        let message = string(env, &message, "message")?;
        std::thread::Builder::new()
            .name("outbox-log-self-test".into())
            .spawn(move || log::warn!(target: "outbox::self_test", "{message}"))
            .map_err(|e| Failure::IllegalState(e.to_string()))?
            .join()
            .map_err(|_| Failure::IllegalState("the logging thread panicked".into()))
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_version<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jstring {
    guard(&mut env, null_mut(), |env| jstr(env, crate::VERSION))
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_features<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jobjectArray {
    guard(&mut env, null_mut(), |env| {
        let mut features = vec!["jni"];
        if cfg!(feature = "rocketmq") {
            features.push("rocketmq");
        }
        Ok(string_array(env, &features)?.into_raw())
    })
}

/// `[key0, doc0, redaction0, key1, doc1, redaction1, ...]` in documentation order; a redaction
/// is `secret` (shown as `***`), `url` (the password of a URL hidden) or empty (shown as is).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_configKeyDocs<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
) -> jobjectArray {
    guard(&mut env, null_mut(), |env| {
        use crate::config::Redaction;
        let flat: Vec<&str> = crate::config::KEYS
            .iter()
            .flat_map(|k| {
                let redaction = match k.redaction {
                    Redaction::Hidden => "secret",
                    Redaction::UrlPassword => "url",
                    Redaction::Shown => "",
                };
                [k.key, k.doc, redaction]
            })
            .collect();
        Ok(string_array(env, &flat)?.into_raw())
    })
}

/// The default value of `key`, in the form `set` accepts.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_configDefault<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    key: JString<'l>,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let key = string(env, &key, "key")?;
        let value = Config::default().get(&key).ok_or(ConfigError::UnknownKey { key })?;
        jstr(env, value)
    })
}

/// Checks one key and value alone (unknown key, bad value).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_configCheck<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    key: JString<'l>,
    value: JString<'l>,
) {
    guard(&mut env, (), |env| {
        let key = string(env, &key, "key")?;
        let value = string(env, &value, "value")?;
        Config::default().set(&key, &value)?;
        Ok(())
    })
}

/// Checks a whole configuration: every key and value, then the values against each other.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_configValidate<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    keys: JObjectArray<'l>,
    values: JObjectArray<'l>,
) {
    guard(&mut env, (), |env| {
        config_from(env, &keys, &values)?.validate()?;
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_insertStatement<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    table: JString<'l>,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let table = string(env, &table, "table")?;
        // Validated like the `table` key: the name goes into SQL text.
        jstr(env, crate::insert_statement(&table)?)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_insertParams<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jobjectArray {
    guard(&mut env, null_mut(), |env| {
        Ok(string_array(env, crate::INSERT_PARAMS)?.into_raw())
    })
}

/// Validates an event as `enqueue` would and returns its `headers` column value (JSON, or
/// `null` without headers), for the host-owned JDBC path.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_outbox_Native_checkEvent<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    biz_no: JString<'l>,
    event_type: JString<'l>,
    payload: JByteArray<'l>,
    topic: JString<'l>,
    tag: JString<'l>,
    header_keys: JObjectArray<'l>,
    header_values: JObjectArray<'l>,
    payload_max_bytes: jlong,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let event = event_from(
            env,
            &biz_no,
            &event_type,
            &payload,
            &topic,
            &tag,
            &header_keys,
            &header_values,
        )?;
        let max = usize::try_from(payload_max_bytes)
            .map_err(|_| Failure::IllegalArgument(format!("payload limit {payload_max_bytes}")))?;
        event.validate(max)?;
        match event.headers_json() {
            Some(json) => jstr(env, json),
            None => Ok(null_mut()),
        }
    })
}

/// Applies the pending migrations to the configured table; `[current, applied...]`.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_migrateConfig<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    keys: JObjectArray<'l>,
    values: JObjectArray<'l>,
) -> jintArray {
    guard(&mut env, null_mut(), |env| {
        let config = config_from(env, &keys, &values)?;
        if config.db_url.is_empty() {
            return Err(ConfigError::invalid("db.url", "", "is required").into());
        }
        let pool = crate::connect(&config)?;
        let report = crate::migrate_table(&pool, &config.table)?;
        migration_array(env, &report)
    })
}

/// Handles live in this process: `[relays, transactions, consumers]` (for tests of the Cleaner
/// backstop).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_liveHandles<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jlongArray {
    guard(&mut env, null_mut(), |env| {
        let (relays, txs) = handles::live();
        long_array(env, &[relays as i64, txs as i64, consumer::live() as i64])
    })
}

/// Panics inside the boundary: proves that a Rust panic reaches Java as an exception.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_selfTestPanic<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) {
    guard(&mut env, (), |_| -> JResult<()> {
        panic!("self-test panic requested by the Java binding's tests")
    })
}

// ---------------------------------------------------------------------------------------------
// relay

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_start<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    keys: JObjectArray<'l>,
    values: JObjectArray<'l>,
    dead_letter_listener: JObject<'l>,
) -> jlong {
    guard(&mut env, 0, |env| {
        let config = config_from(env, &keys, &values)?;
        // Before the publisher is chosen and started, so a bad config never starts a client.
        config.validate()?;
        let hook: Option<DeadLetterHook> = if dead_letter_listener.is_null() {
            None
        } else {
            let listener = Arc::new(dead_letter::JavaListener::new(env, &dead_letter_listener)?);
            Some(Arc::new(move |d: &DeadLetter| listener.deliver(d)))
        };
        let latency = crate::latency::LatencyStats::new();
        let relay = crate::open_with(config, hook.clone(), Some(crate::latency::LatencyStats::hook(&latency)))?;
        Ok(handles::add_relay(relay, hook, latency))
    })
}

/// Calls the relay's dead-letter hook with a made-up letter from a thread the JVM has never
/// seen, as a relay thread would: proves the attach-and-call path without a failing broker.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_selfTestDeadLetter<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jboolean {
    guard(&mut env, JNI_FALSE, |_| {
        let entry = handles::relay(handle)?;
        let Some(hook) = entry.dead_letter.clone() else {
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
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_notifyRelay<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, handle: jlong) {
    guard(&mut env, (), |_| {
        handles::relay(handle)?.notify();
        Ok(())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_stats<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    with_gauges: jboolean,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let relay = handles::relay(handle)?;
        let stats = if with_gauges == JNI_FALSE {
            relay.counters()
        } else {
            relay.stats()
        };
        jstr(
            env,
            crate::latency::with_latency(&stats.to_json(), &relay.latency.snapshot()),
        )
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_instanceId<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let relay = handles::relay(handle)?;
        jstr(env, relay.instance_id())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_isRelaying<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jboolean {
    guard(&mut env, JNI_FALSE, |_| {
        Ok(if handles::relay(handle)?.is_relaying() {
            JNI_TRUE
        } else {
            JNI_FALSE
        })
    })
}

/// The relay's effective value of `key` (secrets masked, the password removed from `db.url`).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_relayConfigGet<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    key: JString<'l>,
) -> jstring {
    guard(&mut env, null_mut(), |env| {
        let key = string(env, &key, "key")?;
        let relay = handles::relay(handle)?;
        let value = relay
            .config()
            .get_redacted(&key)
            .ok_or(ConfigError::UnknownKey { key })?;
        jstr(env, value)
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_migrate<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jintArray {
    guard(&mut env, null_mut(), |env| {
        let relay = handles::relay(handle)?;
        let report = crate::migrate_table(relay.pool(), &relay.config().table)?;
        migration_array(env, &report)
    })
}

/// Stops relaying (the handle stays valid until `close`); `[released, in_flight_at_deadline,
/// timed_out, already_stopped]`.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_stop<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    timeout_ms: jlong,
) -> jlongArray {
    guard(&mut env, null_mut(), |env| {
        let relay = handles::relay(handle)?;
        let report = relay.stop(millis(timeout_ms));
        report_array(env, &report)
    })
}

/// Stops the relay and releases the handle. Unknown or already closed handles return `null`.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_close<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
    timeout_ms: jlong,
) -> jlongArray {
    guard(&mut env, null_mut(), |env| match handles::remove_relay(handle) {
        Some(relay) => {
            let report = relay.stop(millis(timeout_ms));
            drop(relay);
            report_array(env, &report)
        }
        None => Ok(null_mut()),
    })
}

// ---------------------------------------------------------------------------------------------
// library-owned transactions

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txBegin<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    handle: jlong,
) -> jlong {
    guard(&mut env, 0, |_| {
        let relay = handles::relay(handle)?;
        let tx = crate::host::owned_tx::OwnedTx::begin(relay.pool(), relay.config())?;
        Ok(handles::add_tx(relay, tx))
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_outbox_Native_txExecute<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    tx: jlong,
    sql: JString<'l>,
    kinds: JByteArray<'l>,
    ints: JLongArray<'l>,
    doubles: JDoubleArray<'l>,
    blobs: JObjectArray<'l>,
) -> jlong {
    guard(&mut env, 0, |env| {
        let sql = string(env, &sql, "sql")?;
        let params = params_from(env, &kinds, &ints, &doubles, &blobs)?;
        handles::with_statement_tx(tx, Some(&sql), |t| {
            t.exec_drop(&sql, params)?;
            Ok(i64::try_from(t.affected_rows()).unwrap_or(i64::MAX))
        })
    })
}

/// The first column of the first row, as `[value]`, or `[]` when there is no row or it is NULL.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_outbox_Native_txQueryLong<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    tx: jlong,
    sql: JString<'l>,
    kinds: JByteArray<'l>,
    ints: JLongArray<'l>,
    doubles: JDoubleArray<'l>,
    blobs: JObjectArray<'l>,
) -> jlongArray {
    guard(&mut env, null_mut(), |env| {
        let sql = string(env, &sql, "sql")?;
        let params = params_from(env, &kinds, &ints, &doubles, &blobs)?;
        let value = handles::with_statement_tx(tx, Some(&sql), |t| {
            let row: Option<mysql::Row> = t.exec_first(&sql, params)?;
            match row.and_then(|r| r.as_ref(0).cloned()) {
                None | Some(mysql::Value::NULL) => Ok(None),
                Some(v) => as_i64(&v)
                    .map(Some)
                    .ok_or_else(|| Failure::IllegalArgument(format!("the first column ({v:?}) is not a whole number"))),
            }
        })?;
        long_array(env, value.as_slice())
    })
}

#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txLastInsertId<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    tx: jlong,
) -> jlong {
    guard(&mut env, 0, |_| {
        handles::with_statement_tx(tx, None, |t| {
            Ok(t.last_insert_id().map_or(0, |id| i64::try_from(id).unwrap_or(i64::MAX)))
        })
    })
}

#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub extern "system" fn Java_io_outbox_Native_txEnqueue<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
    tx: jlong,
    biz_no: JString<'l>,
    event_type: JString<'l>,
    payload: JByteArray<'l>,
    topic: JString<'l>,
    tag: JString<'l>,
    header_keys: JObjectArray<'l>,
    header_values: JObjectArray<'l>,
) -> jlong {
    guard(&mut env, 0, |env| {
        let event = event_from(
            env,
            &biz_no,
            &event_type,
            &payload,
            &topic,
            &tag,
            &header_keys,
            &header_values,
        )?;
        handles::with_tx(tx, "enqueue", |relay, t| {
            let id = relay.enqueue_in_tx(t, &event)?;
            Ok(i64::try_from(id).unwrap_or(i64::MAX))
        })
    })
}

/// Commits and wakes the relay. The handle is released whatever the outcome. Refused on a
/// consumer's transaction (only the consumer ends it).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txCommit<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, tx: jlong) {
    guard(&mut env, (), |_| {
        handles::refuse_if_lent(tx, "commit")?;
        let (relay, t) = handles::take_tx(tx)
            .ok_or_else(|| Failure::IllegalState(format!("transaction {tx} is already finished")))?;
        t.commit().map_err(Error::Db)?;
        relay.notify();
        Ok(())
    })
}

/// Rolls back and releases the handle; a finished or unknown handle is a no-op. Refused on a
/// consumer's transaction (only the consumer ends it).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txRollback<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, tx: jlong) {
    guard(&mut env, (), |_| {
        handles::refuse_if_lent(tx, "rollback")?;
        if let Some((_, t)) = handles::take_tx(tx) {
            t.rollback().map_err(Error::Db)?;
        }
        Ok(())
    })
}
