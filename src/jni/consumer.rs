//! The consumer runtime for Java (`io.outbox.OutboxConsumer`): the same consumer the C ABI
//! starts ([`host_consumer::start`]: database checked first, then the source; settings from the
//! `consumer.*` and `inbox.*` keys), with a Java handler run on the runtime's threads in the
//! consumer's transaction.
//!
//! The handler is reached through a dispatcher object (`OutboxConsumer.Dispatcher`, pinned as a
//! global reference with the `ConsumerMessage` class when the consumer starts, so threads that
//! only see the system class loader still find them). Each call:
//! - attaches the runtime's thread to the JVM as a daemon (once; named after the native thread);
//! - lends the consumer's transaction as a transaction handle valid only during the call
//!   ([`handles::lend_tx`]);
//! - builds the messages in a local frame (an attached thread never returns to Java to free
//!   local references) and calls `dispatch(tx, messages)`, which runs the Java handler, catches
//!   whatever it throws and returns `null` (commit) or why it failed, marked transient or not;
//! - turns that into the runtime's outcome: `Ok` commits; a transient failure (the Java side's
//!   verdict, or any statement through the lent transaction that failed transiently) becomes a
//!   [`Transient`] (retried without using an attempt); any other failure uses an attempt.
//!
//! Consumers are handed to Java as registry handles (never pointers), like relays. `stop` and
//! `close` block until the runtime stopped and return the final counts; they are refused on a
//! handler thread, which they would wait for.

use std::cell::Cell;
use std::collections::HashMap;
use std::ptr::null_mut;
use std::sync::{Arc, LazyLock};

use ::jni::objects::{GlobalRef, JClass, JMethodID, JObject, JObjectArray, JString, JValue};
use ::jni::signature::ReturnType;
use ::jni::sys::{jboolean, jlong, jstring, jvalue, JNI_FALSE};
use ::jni::{JNIEnv, JavaVM};
use parking_lot::Mutex;

use super::args::{config_from, jstr, string};
use super::boundary::{jni_entry, string_array, Failure, JResult, PKG};
use super::handles;
use crate::consumer::{BatchHandler, Handler, HandlerError, Message, Transient};
use crate::host::consumer::{self as host_consumer, handler_failure, Handling, HostConsumer};

static CONSUMERS: LazyLock<Mutex<HashMap<i64, Arc<HostConsumer>>>> = LazyLock::new(Default::default);

thread_local! {
    /// Set while this thread runs a Java consumer handler: `stop`/`close` would wait for it.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
    /// The Java thread of this native thread has been given its name.
    static NAMED: Cell<bool> = const { Cell::new(false) };
}

fn consumer(handle: i64) -> JResult<Arc<HostConsumer>> {
    CONSUMERS
        .lock()
        .get(&handle)
        .cloned()
        .ok_or_else(|| Failure::Stopped(format!("the consumer is closed (handle {handle} is not open)")))
}

/// Consumers open now.
pub(super) fn live() -> usize {
    CONSUMERS.lock().len()
}

fn refuse_in_handler(what: &str) -> JResult<()> {
    if IN_HANDLER.get() {
        return Err(Failure::IllegalState(format!(
            "OutboxConsumer.{what}() cannot be called from a consumer's handler: it waits for the handler \
             threads to finish, this one included"
        )));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// entry points

jni_entry! {
    /// Starts a consumer of `topic` for `group` with the configuration `keys`/`values`, running
    /// `dispatcher.dispatch(tx, messages)` for each message (`batch` false) or each batch's new
    /// messages (`batch` true). Returns its handle.
    fn Java_io_outbox_Native_consumerStart(
        keys: JObjectArray<'l>, values: JObjectArray<'l>,
        topic: JString<'l>, group: JString<'l>,
        dispatcher: JObject<'l>, batch: jboolean,
    ) -> jlong = 0, |env| {
        if dispatcher.is_null() {
            return Err(Failure::Null("handler"));
        }
        let topic = string(env, &topic, "topic")?;
        let group = string(env, &group, "group")?;
        let config = config_from(env, &keys, &values)?;
        let handler = Arc::new(JavaHandler::new(env, &dispatcher)?);
        let handling = if batch == JNI_FALSE {
            Handling::Each(handler)
        } else {
            Handling::Batch(handler)
        };
        let consumer = host_consumer::start(&config, &topic, &group, handling)?;
        let h = handles::next();
        CONSUMERS.lock().insert(h, Arc::new(consumer));
        Ok(h)
    }
}

jni_entry! {
    /// The consumer's counters as JSON (`ConsumerStats::to_json`).
    fn Java_io_outbox_Native_consumerStats(handle: jlong) -> jstring = null_mut(), |env| {
        let json = consumer(handle)?.stats_json();
        jstr(env, json)
    }
}

jni_entry! {
    /// Stops the consumer (the handle stays valid for `consumerStats` until `consumerClose`) and
    /// returns the final counters as JSON. Blocks until the runtime stopped, also when another
    /// thread's stop is under way; a stopped consumer returns its final counters again.
    fn Java_io_outbox_Native_consumerStop(handle: jlong) -> jstring = null_mut(), |env| {
        refuse_in_handler("stop")?;
        let (last, _) = consumer(handle)?.stop();
        jstr(env, last.to_json(true))
    }
}

jni_entry! {
    /// Stops the consumer as `consumerStop` does, then releases the handle; returns the final
    /// counters as JSON, or `null` for a handle that is not open.
    fn Java_io_outbox_Native_consumerClose(handle: jlong) -> jstring = null_mut(), |env| {
        refuse_in_handler("close")?;
        let Some(entry) = CONSUMERS.lock().get(&handle).cloned() else {
            return Ok(null_mut());
        };
        // Stopped while still registered, so `stats` and `stop` on other threads see it stop.
        let (last, _) = entry.stop();
        CONSUMERS.lock().remove(&handle);
        drop(entry);
        jstr(env, last.to_json(true))
    }
}

// ---------------------------------------------------------------------------------------------
// the Java handler

const DISPATCH_SIG: &str = "(J[Lio/outbox/ConsumerMessage;)Ljava/lang/String;";
const MESSAGE_CTOR_SIG: &str = "(Ljava/lang/String;Ljava/lang/String;Ljava/lang/String;IJLjava/lang/String;\
                                Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/String;[B)V";

/// The Java handler as the runtime's [`Handler`] and [`BatchHandler`].
struct JavaHandler {
    vm: JavaVM,
    /// The `OutboxConsumer.Dispatcher` (it holds the service's handler).
    dispatcher: GlobalRef,
    dispatch: JMethodID,
    /// `io.outbox.ConsumerMessage`, pinned.
    message_class: GlobalRef,
    message_ctor: JMethodID,
}

/// What a call of the Java handler came to.
enum Outcome {
    /// Returned normally.
    Returned,
    /// Threw: why (the exception's class and message), and whether it is transient.
    Threw { why: String, transient: bool },
    /// The call itself failed (a JNI failure, an exception outside the handler).
    Broken(String),
}

impl JavaHandler {
    fn new(env: &mut JNIEnv<'_>, dispatcher: &JObject<'_>) -> JResult<JavaHandler> {
        let class = env.get_object_class(dispatcher)?;
        let dispatch = env.get_method_id(&class, "dispatch", DISPATCH_SIG)?;
        let message_class = env.find_class(format!("{PKG}ConsumerMessage"))?;
        let message_ctor = env.get_method_id(&message_class, "<init>", MESSAGE_CTOR_SIG)?;
        Ok(JavaHandler {
            vm: env.get_java_vm()?,
            dispatcher: env.new_global_ref(dispatcher)?,
            dispatch,
            message_class: env.new_global_ref(message_class)?,
            message_ctor,
        })
    }

    /// Runs the Java handler on `msgs` in `tx` and returns the runtime's outcome.
    fn run(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        let mut env = self.vm.attach_current_thread_as_daemon().map_err(|e| {
            Box::new(Transient(format!(
                "cannot attach the consumer's thread to the JVM: {e}"
            )))
        })?;
        name_java_thread(&mut env);
        if env.exception_check().unwrap_or(true) {
            // Nothing may be called with an exception pending; none should be on this thread.
            let _ = env.exception_describe();
            let _ = env.exception_clear();
        }
        struct InHandler;
        impl Drop for InHandler {
            fn drop(&mut self) {
                IN_HANDLER.set(false);
            }
        }
        IN_HANDLER.set(true);
        let in_handler = InHandler;
        let (outcome, saw_transient) = handles::lend_tx(tx, |h| self.call(&mut env, h, msgs));
        drop(in_handler);
        match outcome {
            // A statement failed transiently and the handler carried on: the transaction may be
            // gone (a deadlock rolls it back whole, later statements would autocommit), so it is
            // not committed but rolled back and tried again.
            Outcome::Returned if saw_transient.is_some() => Err(handler_failure(
                "a statement through the consumer's transaction failed transiently (a lock wait timeout, a \
                 deadlock or a lost connection) and the handler returned anyway: rolled back and retried"
                    .into(),
                true,
                saw_transient,
            )),
            Outcome::Returned => Ok(()),
            Outcome::Threw { why, transient } => Err(handler_failure(why, transient, saw_transient)),
            Outcome::Broken(why) => Err(why.into()),
        }
    }

    /// Builds the messages and calls `dispatch(tx, messages)` in a local frame.
    fn call(&self, env: &mut JNIEnv<'_>, tx: i64, msgs: &[Message]) -> Outcome {
        let called = env.with_local_frame(8, |env| -> ::jni::errors::Result<Option<String>> {
            let class: &JClass<'_> = self.message_class.as_obj().into();
            let n = i32::try_from(msgs.len())
                .map_err(|_| ::jni::errors::Error::WrongJValueType("array length", "usize"))?;
            let array = env.new_object_array(n, class, JObject::null())?;
            for (i, m) in msgs.iter().enumerate() {
                let message = env.with_local_frame_returning_local(16, |env| self.message(env, m))?;
                env.set_object_array_element(&array, i as i32, &message)?;
                env.delete_local_ref(message)?;
            }
            let args = [jvalue { j: tx }, jvalue { l: array.as_raw() }];
            // SAFETY: `dispatch` is the method id of the dispatcher's class with DISPATCH_SIG,
            // and the arguments match that signature.
            let returned = unsafe {
                env.call_method_unchecked(self.dispatcher.as_obj(), self.dispatch, ReturnType::Object, &args)
            }?
            .l()?;
            if returned.is_null() {
                return Ok(None);
            }
            let text: String = env.get_string(&JString::from(returned))?.into();
            Ok(Some(text))
        });
        if env.exception_check().unwrap_or(true) {
            let why = pending_exception(env);
            return Outcome::Broken(format!("the Java consumer handler could not be called: {why}"));
        }
        match called {
            Ok(None) => Outcome::Returned,
            // `dispatch` returns "T" (transient) or "F" followed by the exception's text.
            Ok(Some(text)) => match text.split_at_checked(1) {
                Some(("T", why)) => Outcome::Threw {
                    why: why.to_string(),
                    transient: true,
                },
                Some((_, why)) => Outcome::Threw {
                    why: why.to_string(),
                    transient: false,
                },
                None => Outcome::Threw {
                    why: "the handler failed".into(),
                    transient: false,
                },
            },
            Err(e) => Outcome::Broken(format!("the Java consumer handler could not be called: {e}")),
        }
    }

    /// A `ConsumerMessage` for `m`.
    fn message<'a>(&self, env: &mut JNIEnv<'a>, m: &Message) -> ::jni::errors::Result<JObject<'a>> {
        let opt = |env: &mut JNIEnv<'a>, s: Option<&str>| -> ::jni::errors::Result<JObject<'a>> {
            Ok(match s {
                Some(s) => JObject::from(env.new_string(s)?),
                None => JObject::null(),
            })
        };
        let key = JObject::from(env.new_string(&m.key)?);
        let topic = JObject::from(env.new_string(&m.queue.topic)?);
        let broker = JObject::from(env.new_string(&m.queue.broker)?);
        let msg_id = opt(env, m.msg_id.as_deref())?;
        let tag = opt(env, m.tag.as_deref())?;
        let names: Vec<&str> = m.properties.keys().map(String::as_str).collect();
        let values: Vec<&str> = m.properties.values().map(String::as_str).collect();
        let names = string_array(env, &names)?;
        let values = string_array(env, &values)?;
        let body = JObject::from(env.byte_array_from_slice(&m.body)?);
        let class: &JClass<'_> = self.message_class.as_obj().into();
        let args = [
            JValue::Object(&key).as_jni(),
            JValue::Object(&topic).as_jni(),
            JValue::Object(&broker).as_jni(),
            JValue::Int(i32::try_from(m.queue.queue_id).unwrap_or(i32::MAX)).as_jni(),
            JValue::Long(i64::try_from(m.offset).unwrap_or(i64::MAX)).as_jni(),
            JValue::Object(&msg_id).as_jni(),
            JValue::Object(&tag).as_jni(),
            JValue::Object(&names).as_jni(),
            JValue::Object(&values).as_jni(),
            JValue::Object(&body).as_jni(),
        ];
        // SAFETY: `message_ctor` is `ConsumerMessage`'s constructor with MESSAGE_CTOR_SIG, and
        // the arguments match that signature.
        unsafe { env.new_object_unchecked(class, self.message_ctor, &args) }
    }
}

impl Handler for JavaHandler {
    fn handle(&self, tx: &mut mysql::Transaction<'_>, msg: &Message) -> Result<(), HandlerError> {
        self.run(tx, std::slice::from_ref(msg))
    }
}

impl BatchHandler for JavaHandler {
    fn handle_batch(&self, tx: &mut mysql::Transaction<'_>, msgs: &[Message]) -> Result<(), HandlerError> {
        self.run(tx, msgs)
    }
}

/// The pending exception's `toString()`, cleared (and printed when even that fails).
fn pending_exception(env: &mut JNIEnv<'_>) -> String {
    let Ok(thrown) = env.exception_occurred() else {
        let _ = env.exception_clear();
        return "an exception (not readable)".into();
    };
    let _ = env.exception_clear();
    let text = env
        .with_local_frame(4, |env| -> ::jni::errors::Result<String> {
            let s = env.call_method(&thrown, "toString", "()Ljava/lang/String;", &[])?.l()?;
            Ok(env.get_string(&JString::from(s))?.into())
        })
        .unwrap_or_else(|_| "an exception (its toString() failed)".into());
    if env.exception_check().unwrap_or(false) {
        let _ = env.exception_clear();
    }
    let _ = env.delete_local_ref(thrown);
    text
}

/// Gives the Java thread of this native thread the native thread's name (`outbox-consume-0`,
/// ...), once, so that the handler's logs and thread dumps say where they come from.
fn name_java_thread(env: &mut JNIEnv<'_>) {
    if NAMED.get() {
        return;
    }
    NAMED.set(true);
    let Some(name) = std::thread::current().name().map(str::to_string) else {
        return;
    };
    let _ = env.with_local_frame(4, |env| -> ::jni::errors::Result<()> {
        let thread = env
            .call_static_method("java/lang/Thread", "currentThread", "()Ljava/lang/Thread;", &[])?
            .l()?;
        let name = JObject::from(env.new_string(name)?);
        env.call_method(&thread, "setName", "(Ljava/lang/String;)V", &[JValue::Object(&name)])?;
        Ok(())
    });
    if env.exception_check().unwrap_or(false) {
        let _ = env.exception_clear();
    }
}
