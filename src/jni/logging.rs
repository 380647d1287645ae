//! Delivers the library's log records to `io.outbox.Native.log(int, String, String)`, which
//! hands them to `System.Logger` (and so to whatever backs it: java.util.logging by default,
//! SLF4J/Logback/Log4j through their `System.LoggerFinder` bridges).
//!
//! Records come from relay threads (attached to the JVM as daemons on first use) and from Java
//! threads inside native calls. A record that cannot be delivered (the JVM is shutting down, a
//! Java exception is pending on the thread, the Java logger threw) is written to stderr instead,
//! never dropped silently and never raised.

use std::sync::Arc;

use ::jni::objects::{GlobalRef, JClass, JObject, JValue};
use ::jni::{JNIEnv, JavaVM};

use super::boundary::{JResult, PKG};
use crate::host::log_level::number_of;
use crate::host::log_sink::{set_sink, write_stderr, Sink};

struct JavaLog {
    vm: JavaVM,
    /// `io.outbox.Native`, pinned: a relay thread sees only the system class loader.
    class: GlobalRef,
}

impl JavaLog {
    fn deliver(&self, level: log::Level, target: &str, message: &str) {
        let env = match self.vm.get_env() {
            Ok(env) => Ok(env),
            Err(_) => self.vm.attach_current_thread_as_daemon(),
        };
        let Ok(mut env) = env else {
            return write_stderr(level, target, message);
        };
        if env.exception_check().unwrap_or(true) {
            // No Java call is allowed while an exception is pending (it is on its way to Java).
            return write_stderr(level, target, message);
        }
        let code = number_of(level);
        // A local frame: an attached relay thread never returns to Java to free local refs.
        let outcome = env.with_local_frame(4, |env| -> ::jni::errors::Result<()> {
            let class: &JClass<'_> = self.class.as_obj().into();
            let target = JObject::from(env.new_string(target)?);
            let message = JObject::from(env.new_string(message)?);
            env.call_static_method(
                class,
                "log",
                "(ILjava/lang/String;Ljava/lang/String;)V",
                &[JValue::Int(code), JValue::Object(&target), JValue::Object(&message)],
            )?;
            Ok(())
        });
        if env.exception_check().unwrap_or(false) {
            let _ = env.exception_clear();
            write_stderr(level, target, message);
        } else if outcome.is_err() {
            write_stderr(level, target, message);
        }
    }
}

/// Routes the library's records to the JVM (called once, when `Native` is initialised).
pub(crate) fn install(env: &mut JNIEnv<'_>) -> JResult<()> {
    let class = env.find_class(format!("{PKG}Native"))?;
    let java = Arc::new(JavaLog {
        vm: env.get_java_vm()?,
        class: env.new_global_ref(class)?,
    });
    Ok(set_sink(Sink::Host(Arc::new(move |level, target, message| {
        java.deliver(level, target, message)
    })))?)
}
