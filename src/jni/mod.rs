//! JNI glue for `bindings/java` (package `io.outbox`, class `Native`).
//!
//! Every entry point goes through [`boundary::guard`]: panics are caught, every error becomes
//! the Java exception of its kind (`OutboxConfigException`, `OutboxInvalidEventException`,
//! `OutboxDatabaseException`, `OutboxStoppedException`, ...), and nothing but a pending
//! exception and a harmless default reaches the JVM.
//!
//! Relays and library-owned transactions are handed to Java as `long` handles that index a
//! registry of `Arc`s: a handle is never a pointer, is never reused, and a closed or unknown
//! handle throws `OutboxStoppedException` instead of touching freed memory. A call in progress
//! holds its own `Arc`, so closing a relay from another thread never frees it under that call.

mod boundary;
mod dead_letter;
mod handles;
mod logging;

use std::ptr::null_mut;
use std::sync::Arc;
use std::time::Duration;

use ::jni::objects::{JByteArray, JClass, JDoubleArray, JLongArray, JObject, JObjectArray, JString};
use ::jni::sys::{jboolean, jint, jintArray, jlong, jlongArray, jobjectArray, jstring, JNI_FALSE, JNI_TRUE};
use ::jni::JNIEnv;
use mysql::prelude::Queryable;

use crate::config::Config;
use crate::error::{ConfigError, Error};
use crate::event::NewEvent;
use crate::relay::{DeadLetterHook, StopReport};
use crate::store::DeadLetter;
use boundary::{guard, string_array, Failure, JResult};

/// Version of the contract between `outbox.jar` and this library (the set of native methods
/// and their signatures). The jar refuses a library with another value.
pub const JNI_ABI_VERSION: jint = 2;

// ---------------------------------------------------------------------------------------------
// argument conversion

fn string(env: &mut JNIEnv<'_>, s: &JString<'_>, what: &'static str) -> JResult<String> {
    opt_string(env, s)?.ok_or(Failure::Null(what))
}

fn opt_string(env: &mut JNIEnv<'_>, s: &JString<'_>) -> JResult<Option<String>> {
    if s.is_null() {
        return Ok(None);
    }
    Ok(Some(env.get_string(s)?.into()))
}

fn strings(env: &mut JNIEnv<'_>, array: &JObjectArray<'_>, what: &'static str) -> JResult<Vec<String>> {
    if array.is_null() {
        return Err(Failure::Null(what));
    }
    let n = env.get_array_length(array)?;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n {
        let item = JString::from(env.get_object_array_element(array, i)?);
        out.push(string(env, &item, what)?);
        env.delete_local_ref(item)?;
    }
    Ok(out)
}

fn bytes(env: &mut JNIEnv<'_>, array: &JByteArray<'_>) -> JResult<Vec<u8>> {
    if array.is_null() {
        return Ok(Vec::new());
    }
    Ok(env.convert_byte_array(array)?)
}

fn millis(ms: jlong) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn config_from(env: &mut JNIEnv<'_>, keys: &JObjectArray<'_>, values: &JObjectArray<'_>) -> JResult<Config> {
    let keys = strings(env, keys, "configuration key")?;
    let values = strings(env, values, "configuration value")?;
    if keys.len() != values.len() {
        return Err(Failure::IllegalArgument(format!(
            "{} keys but {} values",
            keys.len(),
            values.len()
        )));
    }
    let mut config = Config::default();
    for (k, v) in keys.iter().zip(&values) {
        config.set(k, v)?;
    }
    Ok(config)
}

#[allow(clippy::too_many_arguments)]
fn event_from(
    env: &mut JNIEnv<'_>,
    biz_no: &JString<'_>,
    event_type: &JString<'_>,
    payload: &JByteArray<'_>,
    topic: &JString<'_>,
    tag: &JString<'_>,
    header_keys: &JObjectArray<'_>,
    header_values: &JObjectArray<'_>,
) -> JResult<NewEvent> {
    // A null required field is reported like a blank one: as an invalid event naming the field.
    let mut event = NewEvent {
        biz_no: opt_string(env, biz_no)?.unwrap_or_default(),
        event_type: opt_string(env, event_type)?.unwrap_or_default(),
        payload: bytes(env, payload)?,
        topic: opt_string(env, topic)?,
        tag: opt_string(env, tag)?,
        ..Default::default()
    };
    if !header_keys.is_null() || !header_values.is_null() {
        let keys = strings(env, header_keys, "header key")?;
        let values = strings(env, header_values, "header value")?;
        if keys.len() != values.len() {
            return Err(Failure::IllegalArgument(format!(
                "{} header keys but {} values",
                keys.len(),
                values.len()
            )));
        }
        event.headers = keys.into_iter().zip(values).collect();
    }
    Ok(event)
}

/// Positional statement parameters, encoded by `OutboxTransaction` as a kind per parameter
/// (0 NULL, 1 integer from `ints`, 2 double from `doubles`, 3 bytes from `blobs`).
fn params_from(
    env: &mut JNIEnv<'_>,
    kinds: &JByteArray<'_>,
    ints: &JLongArray<'_>,
    doubles: &JDoubleArray<'_>,
    blobs: &JObjectArray<'_>,
) -> JResult<mysql::Params> {
    if kinds.is_null() || ints.is_null() || doubles.is_null() || blobs.is_null() {
        return Err(Failure::Null("statement parameters"));
    }
    let kinds = env.convert_byte_array(kinds)?;
    if kinds.is_empty() {
        return Ok(mysql::Params::Empty);
    }
    let n = kinds.len();
    let same_length = [
        env.get_array_length(ints)?,
        env.get_array_length(doubles)?,
        env.get_array_length(blobs)?,
    ]
    .iter()
    .all(|&l| l as usize == n);
    if !same_length {
        return Err(Failure::IllegalArgument("parameter arrays of different lengths".into()));
    }
    let mut int_values = vec![0i64; n];
    env.get_long_array_region(ints, 0, &mut int_values)?;
    let mut double_values = vec![0f64; n];
    env.get_double_array_region(doubles, 0, &mut double_values)?;
    let mut out = Vec::with_capacity(n);
    for (i, kind) in kinds.iter().enumerate() {
        out.push(match kind {
            0 => mysql::Value::NULL,
            1 => mysql::Value::Int(int_values[i]),
            2 => mysql::Value::Double(double_values[i]),
            3 => {
                let blob = JByteArray::from(env.get_object_array_element(blobs, i as i32)?);
                let v = if blob.is_null() {
                    mysql::Value::NULL
                } else {
                    mysql::Value::Bytes(env.convert_byte_array(&blob)?)
                };
                env.delete_local_ref(blob)?;
                v
            }
            k => {
                return Err(Failure::IllegalArgument(format!(
                    "parameter {} has unknown kind {k}",
                    i + 1
                )))
            }
        });
    }
    Ok(mysql::Params::Positional(out))
}

/// A whole number from a column value: integers, and text such as `990` or `990.00` (DECIMAL).
fn as_i64(v: &mysql::Value) -> Option<i64> {
    match v {
        mysql::Value::Int(n) => Some(*n),
        mysql::Value::UInt(n) => i64::try_from(*n).ok(),
        mysql::Value::Bytes(b) => {
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

fn long_array(env: &mut JNIEnv<'_>, values: &[i64]) -> JResult<jlongArray> {
    let array = env.new_long_array(values.len() as i32)?;
    env.set_long_array_region(&array, 0, values)?;
    Ok(array.into_raw())
}

fn int_array(env: &mut JNIEnv<'_>, values: &[i32]) -> JResult<jintArray> {
    let array = env.new_int_array(values.len() as i32)?;
    env.set_int_array_region(&array, 0, values)?;
    Ok(array.into_raw())
}

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

fn jstr(env: &mut JNIEnv<'_>, s: impl AsRef<str>) -> JResult<jstring> {
    Ok(env.new_string(s.as_ref())?.into_raw())
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

/// `[key0, doc0, key1, doc1, ...]` in documentation order.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_configKeyDocs<'l>(
    mut env: JNIEnv<'l>,
    _class: JClass<'l>,
) -> jobjectArray {
    guard(&mut env, null_mut(), |env| {
        let flat: Vec<&str> = crate::KEYS.iter().flat_map(|k| [k.key, k.doc]).collect();
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

/// Handles live in this process: `[relays, transactions]` (for tests of the Cleaner backstop).
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_liveHandles<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>) -> jlongArray {
    guard(&mut env, null_mut(), |env| {
        let (relays, txs) = handles::live();
        long_array(env, &[relays as i64, txs as i64])
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
        handles::with_tx(tx, |_, t| {
            t.exec_drop(sql, params)?;
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
        let value = handles::with_tx(tx, |_, t| {
            let row: Option<mysql::Row> = t.exec_first(sql, params)?;
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
        handles::with_tx(tx, |_, t| {
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
        handles::with_tx(tx, |relay, t| {
            let id = relay.enqueue_in_tx(t, &event)?;
            Ok(i64::try_from(id).unwrap_or(i64::MAX))
        })
    })
}

/// Commits and wakes the relay. The handle is released whatever the outcome.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txCommit<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, tx: jlong) {
    guard(&mut env, (), |_| {
        let (relay, t) = handles::take_tx(tx)
            .ok_or_else(|| Failure::IllegalState(format!("transaction {tx} is already finished")))?;
        t.commit().map_err(Error::Db)?;
        relay.notify();
        Ok(())
    })
}

/// Rolls back and releases the handle; a finished or unknown handle is a no-op.
#[no_mangle]
pub extern "system" fn Java_io_outbox_Native_txRollback<'l>(mut env: JNIEnv<'l>, _class: JClass<'l>, tx: jlong) {
    guard(&mut env, (), |_| {
        if let Some((_, t)) = handles::take_tx(tx) {
            t.rollback().map_err(Error::Db)?;
        }
        Ok(())
    })
}
