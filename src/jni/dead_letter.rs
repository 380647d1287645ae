//! Delivers dead letters to a Java `DeadLetterListener` from the relay's own threads.
//!
//! The listener and the `io.outbox.DeadLetter` class are pinned as global references when the
//! relay starts, on the caller's Java thread: a relay thread attached later sees only the
//! system class loader, which may not know the binding's classes (application servers, fat jars).

use ::jni::objects::{GlobalRef, JClass, JObject, JValue};
use ::jni::{JNIEnv, JavaVM};

use super::boundary::{JResult, PKG};
use crate::store::DeadLetter;

pub(crate) struct JavaListener {
    vm: JavaVM,
    listener: GlobalRef,
    class: GlobalRef,
}

impl JavaListener {
    pub(crate) fn new(env: &mut JNIEnv<'_>, listener: &JObject<'_>) -> JResult<Self> {
        let class = env.find_class(format!("{PKG}DeadLetter"))?;
        Ok(JavaListener {
            vm: env.get_java_vm()?,
            listener: env.new_global_ref(listener)?,
            class: env.new_global_ref(class)?,
        })
    }

    /// Calls `listener.onDeadLetter(letter)` on this thread (attached to the JVM as a daemon if
    /// it is not). An exception thrown by the listener is printed and cleared, never propagated.
    pub(crate) fn deliver(&self, d: &DeadLetter) {
        let mut env = match self.vm.attach_current_thread_as_daemon() {
            Ok(env) => env,
            Err(e) => {
                log::error!(
                    "dead letter {} not delivered to the Java listener: cannot attach to the JVM: {e}",
                    d.id
                );
                return;
            }
        };
        // A local frame: an attached relay thread never returns to Java to free local refs.
        let outcome = env.with_local_frame(8, |env| -> ::jni::errors::Result<()> {
            let class: &JClass<'_> = self.class.as_obj().into();
            let biz_no = JObject::from(env.new_string(&d.biz_no)?);
            let event_type = JObject::from(env.new_string(&d.event_type)?);
            let last_error = JObject::from(env.new_string(&d.last_error)?);
            let letter = env.new_object(
                class,
                "(JLjava/lang/String;Ljava/lang/String;ILjava/lang/String;)V",
                &[
                    JValue::Long(i64::try_from(d.id).unwrap_or(i64::MAX)),
                    JValue::Object(&biz_no),
                    JValue::Object(&event_type),
                    JValue::Int(i32::try_from(d.retry_count).unwrap_or(i32::MAX)),
                    JValue::Object(&last_error),
                ],
            )?;
            env.call_method(
                self.listener.as_obj(),
                "onDeadLetter",
                format!("(L{PKG}DeadLetter;)V"),
                &[JValue::Object(&letter)],
            )?;
            Ok(())
        });
        if env.exception_check().unwrap_or(false) {
            log::error!("the Java dead-letter listener threw for event {}", d.id);
            let _ = env.exception_describe();
            let _ = env.exception_clear();
        } else if let Err(e) = outcome {
            log::error!("dead letter {} not delivered to the Java listener: {e}", d.id);
        }
    }
}
