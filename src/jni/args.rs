//! Converting the arguments of the JNI entry points (strings, arrays, the configuration, events,
//! statement parameters) and building their results.

use std::time::Duration;

use ::jni::objects::{JByteArray, JDoubleArray, JLongArray, JObjectArray, JString};
use ::jni::sys::{jintArray, jlong, jlongArray, jstring};
use ::jni::JNIEnv;

use super::boundary::{Failure, JResult};
use crate::config::Config;
use crate::event::NewEvent;

pub(super) fn string(env: &mut JNIEnv<'_>, s: &JString<'_>, what: &'static str) -> JResult<String> {
    opt_string(env, s)?.ok_or(Failure::Null(what))
}

pub(super) fn opt_string(env: &mut JNIEnv<'_>, s: &JString<'_>) -> JResult<Option<String>> {
    if s.is_null() {
        return Ok(None);
    }
    // In a local frame: jni's `get_string` checks the type with two local references it never
    // deletes, which would pile up over a call's arguments (a configuration's keys and values).
    let text = env.with_local_frame(4, |env| -> JResult<String> { Ok(env.get_string(s)?.into()) })?;
    Ok(Some(text))
}

pub(super) fn strings(env: &mut JNIEnv<'_>, array: &JObjectArray<'_>, what: &'static str) -> JResult<Vec<String>> {
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

pub(super) fn bytes(env: &mut JNIEnv<'_>, array: &JByteArray<'_>) -> JResult<Vec<u8>> {
    if array.is_null() {
        return Ok(Vec::new());
    }
    Ok(env.convert_byte_array(array)?)
}

pub(super) fn millis(ms: jlong) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Keys and their values from two arrays of the same length (`what` names them: "configuration",
/// "header").
fn pairs(
    env: &mut JNIEnv<'_>,
    keys: &JObjectArray<'_>,
    values: &JObjectArray<'_>,
    what: (&'static str, &'static str),
) -> JResult<Vec<(String, String)>> {
    let keys = strings(env, keys, what.0)?;
    let values = strings(env, values, what.1)?;
    if keys.len() != values.len() {
        return Err(Failure::IllegalArgument(format!(
            "{} {}s but {} values",
            keys.len(),
            what.0,
            values.len()
        )));
    }
    Ok(keys.into_iter().zip(values).collect())
}

pub(super) fn config_from(env: &mut JNIEnv<'_>, keys: &JObjectArray<'_>, values: &JObjectArray<'_>) -> JResult<Config> {
    let mut config = Config::default();
    for (k, v) in pairs(env, keys, values, ("configuration key", "configuration value"))? {
        config.set(&k, &v)?;
    }
    Ok(config)
}

/// An event from its fields as `io.outbox.Event` passes them: `[biz_no, event_type, topic, tag]`,
/// the payload, `[header_keys, header_values]`.
pub(super) fn event_from(
    env: &mut JNIEnv<'_>,
    [biz_no, event_type, topic, tag]: [&JString<'_>; 4],
    payload: &JByteArray<'_>,
    [header_keys, header_values]: [&JObjectArray<'_>; 2],
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
        event.headers = pairs(env, header_keys, header_values, ("header key", "header value"))?
            .into_iter()
            .collect();
    }
    Ok(event)
}

/// A statement and its positional parameters, encoded by `OutboxTransaction` as a kind per
/// parameter (0 NULL, 1 integer from `ints`, 2 double from `doubles`, 3 bytes from `blobs`).
pub(super) fn statement_from(
    env: &mut JNIEnv<'_>,
    sql: &JString<'_>,
    kinds: &JByteArray<'_>,
    ints: &JLongArray<'_>,
    doubles: &JDoubleArray<'_>,
    blobs: &JObjectArray<'_>,
) -> JResult<(String, mysql::Params)> {
    let sql = string(env, sql, "sql")?;
    if kinds.is_null() || ints.is_null() || doubles.is_null() || blobs.is_null() {
        return Err(Failure::Null("statement parameters"));
    }
    let kinds = env.convert_byte_array(kinds)?;
    if kinds.is_empty() {
        return Ok((sql, mysql::Params::Empty));
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
    Ok((sql, mysql::Params::Positional(out)))
}

pub(super) fn long_array(env: &mut JNIEnv<'_>, values: &[i64]) -> JResult<jlongArray> {
    let array = env.new_long_array(values.len() as i32)?;
    env.set_long_array_region(&array, 0, values)?;
    Ok(array.into_raw())
}

pub(super) fn int_array(env: &mut JNIEnv<'_>, values: &[i32]) -> JResult<jintArray> {
    let array = env.new_int_array(values.len() as i32)?;
    env.set_int_array_region(&array, 0, values)?;
    Ok(array.into_raw())
}

pub(super) fn jstr(env: &mut JNIEnv<'_>, s: impl AsRef<str>) -> JResult<jstring> {
    Ok(env.new_string(s.as_ref())?.into_raw())
}
