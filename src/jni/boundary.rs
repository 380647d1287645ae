//! The boundary every JNI entry point goes through: it catches panics, turns every failure into
//! the Java exception of its kind, and returns a harmless default (0, false, NULL) that the JVM
//! never sees because an exception is pending.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ::jni::objects::{JObject, JValue};
use ::jni::JNIEnv;

use crate::error::{panic_message, ConfigError, Error};
use crate::host::error::HostError;

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

impl From<HostError> for Failure {
    fn from(e: HostError) -> Self {
        match e {
            HostError::Core(e) => Failure::Core(e),
            HostError::InvalidArgument(message) => Failure::IllegalArgument(message),
            HostError::EndsTransaction { statement, lent: true } => Failure::IllegalArgument(format!(
                "{statement} is not allowed on the consumer's transaction: it would end the transaction behind \
                 the consumer (return from the handler to commit, throw to roll back)"
            )),
            HostError::EndsTransaction { statement, lent: false } => Failure::IllegalArgument(format!(
                "{statement} is not allowed through OutboxTransaction.execute: it would end the transaction \
                 behind the library (use commit() or rollback())"
            )),
            HostError::ConsumerTx(what) => Failure::IllegalState(format!(
                "{what} is not allowed on the consumer's transaction: the consumer commits it when the handler \
                 returns and rolls it back when the handler throws"
            )),
            HostError::TxFinished => {
                Failure::IllegalState("the transaction is finished (committed or rolled back)".into())
            }
        }
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

/// One entry point of `io.outbox.Native`: `#[no_mangle] extern "system"`, the JNI environment
/// and class arguments, and the body run behind [`guard`] with `default` as what the JVM gets
/// back while the exception is pending. The Java name stays greppable:
///
/// ```ignore
/// jni_entry! {
///     /// Doc comment of the entry point.
///     fn Java_io_outbox_Native_nameInJava(handle: jlong, key: JString<'l>) -> jstring = null_mut(), |env| {
///         let key = string(env, &key, "key")?;
///         jstr(env, host_operation(handles::relay(handle)?, &key)?)
///     }
/// }
/// ```
macro_rules! jni_entry {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $default:expr, |$env:pat_param| $body:expr) => {
        $(#[$meta])*
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub extern "system" fn $name<'l>(
            mut env: ::jni::JNIEnv<'l>,
            _class: ::jni::objects::JClass<'l>,
            $($arg: $ty),*
        ) -> $ret {
            $crate::jni::boundary::guard(&mut env, $default, |$env| $body)
        }
    };
}
pub(crate) use jni_entry;

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
        Failure::Core(Error::Stopped) | Failure::Stopped(_) => {
            with_message(env, &format!("{PKG}OutboxStoppedException"), &msg)?
        }
        Failure::Core(Error::Publisher(_)) => with_message(env, &format!("{PKG}OutboxPublisherException"), &msg)?,
        // Not the broker's, not a bug: the base class, with the message saying what it is.
        Failure::Core(Error::Thread { .. }) => with_message(env, &format!("{PKG}OutboxException"), &msg)?,
        Failure::Null(_) => with_message(env, "java/lang/NullPointerException", &msg)?,
        Failure::IllegalArgument(_) => with_message(env, "java/lang/IllegalArgumentException", &msg)?,
        Failure::IllegalState(_) => with_message(env, "java/lang/IllegalStateException", &msg)?,
        Failure::Jni(_) | Failure::Panic(_) => with_message(env, &format!("{PKG}OutboxInternalException"), &msg)?,
    };
    env.throw(::jni::objects::JThrowable::from(exception))
}

/// A new exception of `class`, built with its `(String message)` constructor.
fn with_message<'l>(env: &mut JNIEnv<'l>, class: &str, msg: &JObject<'_>) -> ::jni::errors::Result<JObject<'l>> {
    env.new_object(class, "(Ljava/lang/String;)V", &[JValue::Object(msg)])
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
