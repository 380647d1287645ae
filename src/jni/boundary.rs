//! The boundary every JNI entry point goes through: it catches panics, turns every failure into
//! the Java exception of its kind, and returns a harmless default (0, false, NULL) that the JVM
//! never sees because an exception is pending.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ::jni::objects::{JObject, JValue};
use ::jni::JNIEnv;

use crate::error::{panic_message, ConfigError, Error};

/// Java package of the binding's classes, in JNI form.
pub(crate) const PKG: &str = "io/outbox/";

/// Why an entry point did not complete.
#[derive(Debug)]
pub(crate) enum Failure {
    /// An error of the core.
    Core(Error),
    /// The relay or transaction handle is closed (or was never issued).
    Stopped(String),
    /// A required argument was `null`.
    Null(&'static str),
    /// An argument is unusable (`IllegalArgumentException`).
    IllegalArgument(String),
    /// The object is in the wrong state for the call (`IllegalStateException`).
    IllegalState(String),
    /// A JNI call failed; when it left a Java exception pending, that one is thrown.
    Jni(::jni::errors::Error),
    /// A Rust panic, caught at the boundary.
    Panic(String),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Core(e)
    }
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Core(Error::Config(e))
    }
}

impl From<mysql::Error> for Failure {
    fn from(e: mysql::Error) -> Self {
        Failure::Core(Error::Db(e))
    }
}

impl From<::jni::errors::Error> for Failure {
    fn from(e: ::jni::errors::Error) -> Self {
        Failure::Jni(e)
    }
}

pub(crate) type JResult<T> = Result<T, Failure>;

/// Runs `f`; a panic or an error becomes a pending Java exception and `default` is returned.
pub(crate) fn guard<'local, R>(
    env: &mut JNIEnv<'local>,
    default: R,
    f: impl FnOnce(&mut JNIEnv<'local>) -> JResult<R>,
) -> R {
    let outcome = catch_unwind(AssertUnwindSafe(|| f(env)));
    match outcome {
        Ok(Ok(v)) => v,
        Ok(Err(failure)) => {
            throw(env, failure);
            default
        }
        Err(panic) => {
            throw(env, Failure::Panic(panic_message(panic.as_ref()).to_string()));
            default
        }
    }
}

/// Throws the Java exception for `failure`. Never panics: if the exception cannot be built,
/// it falls back to a `RuntimeException`, and if even that fails the JVM has an exception
/// (an `OutOfMemoryError`, say) pending already.
pub(crate) fn throw(env: &mut JNIEnv<'_>, failure: Failure) {
    if env.exception_check().unwrap_or(true) {
        // A Java exception is already on its way (thrown by a JNI call we made): keep it.
        return;
    }
    let message = describe(&failure);
    let built = catch_unwind(AssertUnwindSafe(|| build_and_throw(env, &failure, &message)));
    if matches!(built, Ok(Ok(()))) {
        return;
    }
    if env.exception_check().unwrap_or(true) {
        let _ = env.exception_clear();
    }
    let _ = env.throw_new("java/lang/RuntimeException", message);
}

fn describe(failure: &Failure) -> String {
    match failure {
        Failure::Core(e) => e.to_string(),
        Failure::Stopped(m) | Failure::IllegalArgument(m) | Failure::IllegalState(m) => m.clone(),
        Failure::Null(what) => format!("{what} must not be null"),
        Failure::Jni(e) => format!("JNI call failed: {e}"),
        Failure::Panic(m) => {
            format!("internal error in the outbox native library (a Rust panic, caught): {m}")
        }
    }
}

fn build_and_throw(env: &mut JNIEnv<'_>, failure: &Failure, message: &str) -> ::jni::errors::Result<()> {
    let msg = JObject::from(env.new_string(message)?);
    let s = "Ljava/lang/String;";
    let exception = match failure {
        Failure::Core(Error::Config(c)) => {
            let (kind, keys, value, reason) = match c {
                ConfigError::UnknownKey { key } => (
                    "UNKNOWN_KEY",
                    vec![key.clone()],
                    None,
                    "is not a configuration key".to_string(),
                ),
                ConfigError::InvalidValue { key, value, reason } => {
                    ("INVALID_VALUE", vec![key.clone()], Some(value.clone()), reason.clone())
                }
                ConfigError::Inconsistent { keys, reason } => ("INCONSISTENT", keys.clone(), None, reason.clone()),
            };
            let kind = JObject::from(env.new_string(kind)?);
            let keys = string_array(env, &keys)?;
            let value = match value {
                Some(v) => JObject::from(env.new_string(v)?),
                None => JObject::null(),
            };
            let reason = JObject::from(env.new_string(reason)?);
            env.new_object(
                format!("{PKG}OutboxConfigException"),
                format!("({s}[{s}{s}{s}{s})V"),
                &[
                    JValue::Object(&kind),
                    JValue::Object(&keys),
                    JValue::Object(&value),
                    JValue::Object(&reason),
                    JValue::Object(&msg),
                ],
            )?
        }
        Failure::Core(Error::InvalidEvent { field, reason }) => {
            let field = JObject::from(env.new_string(*field)?);
            let reason = JObject::from(env.new_string(reason)?);
            env.new_object(
                format!("{PKG}OutboxInvalidEventException"),
                format!("({s}{s}{s})V"),
                &[JValue::Object(&field), JValue::Object(&reason), JValue::Object(&msg)],
            )?
        }
        Failure::Core(e @ (Error::Db(_) | Error::PoolTimeout { .. })) => {
            let (code, state) = match e {
                Error::Db(mysql::Error::MySqlError(me)) => (i32::from(me.code), Some(me.state.clone())),
                _ => (0, None),
            };
            let state = match state {
                Some(v) => JObject::from(env.new_string(v)?),
                None => JObject::null(),
            };
            env.new_object(
                format!("{PKG}OutboxDatabaseException"),
                format!("({s}I{s}Z)V"),
                &[
                    JValue::Object(&msg),
                    JValue::Int(code),
                    JValue::Object(&state),
                    JValue::Bool(u8::from(e.is_retriable())),
                ],
            )?
        }
        Failure::Core(Error::Migration {
            version, description, ..
        }) => {
            let description = JObject::from(env.new_string(description)?);
            env.new_object(
                format!("{PKG}OutboxMigrationException"),
                format!("({s}I{s})V"),
                &[
                    JValue::Object(&msg),
                    JValue::Int(i32::try_from(*version).unwrap_or(i32::MAX)),
                    JValue::Object(&description),
                ],
            )?
        }
        Failure::Core(Error::Stopped) | Failure::Stopped(_) => env.new_object(
            format!("{PKG}OutboxStoppedException"),
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
        Failure::Core(Error::Publisher(_)) => env.new_object(
            format!("{PKG}OutboxPublisherException"),
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
        Failure::Null(_) => env.new_object(
            "java/lang/NullPointerException",
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
        Failure::IllegalArgument(_) => env.new_object(
            "java/lang/IllegalArgumentException",
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
        Failure::IllegalState(_) => env.new_object(
            "java/lang/IllegalStateException",
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
        Failure::Jni(_) | Failure::Panic(_) => env.new_object(
            format!("{PKG}OutboxInternalException"),
            format!("({s})V"),
            &[JValue::Object(&msg)],
        )?,
    };
    env.throw(::jni::objects::JThrowable::from(exception))
}

/// A `String[]` holding `items`.
pub(crate) fn string_array<'local, S: AsRef<str>>(
    env: &mut JNIEnv<'local>,
    items: &[S],
) -> ::jni::errors::Result<JObject<'local>> {
    let len = i32::try_from(items.len()).map_err(|_| ::jni::errors::Error::WrongJValueType("array length", "usize"))?;
    let array = env.new_object_array(len, "java/lang/String", JObject::null())?;
    for (i, item) in items.iter().enumerate() {
        let s = env.new_string(item.as_ref())?;
        env.set_object_array_element(&array, i as i32, &s)?;
        env.delete_local_ref(s)?;
    }
    Ok(JObject::from(array))
}
