//! `outbox_event` and `outbox_param`: the plain structs C passes in, and their conversion.

use std::collections::BTreeMap;
use std::ffi::c_char;

use super::boundary::{arg_opt_str, arg_slice, arg_str, Failure};
use super::result::outbox_result::*;

/// One message property of an event.
#[repr(C)]
pub struct outbox_header {
    /// NUL-terminated UTF-8, required.
    pub key: *const c_char,
    /// NUL-terminated UTF-8, required.
    pub value: *const c_char,
}

/// An event to enqueue. The library copies everything before the call returns.
#[repr(C)]
pub struct outbox_event {
    /// Business key (order number), NUL-terminated UTF-8, required, at most 64 characters.
    pub biz_no: *const c_char,
    /// Event type (`ORDER_CREATED`), NUL-terminated UTF-8, required, at most 64 characters.
    pub event_type: *const c_char,
    /// Message body (`payload_len` bytes, copied), required and not empty.
    pub payload: *const u8,
    pub payload_len: usize,
    /// Topic; NULL uses the configured `topic`.
    pub topic: *const c_char,
    /// Message tag; NULL uses the event type.
    pub tag: *const c_char,
    /// `headers_len` extra message properties; NULL when `headers_len` is 0.
    pub headers: *const outbox_header,
    pub headers_len: usize,
}

/// When to send an event (`docs/scheduling.md`): set one field, or neither to send it as soon
/// as it commits. The database's clock decides when it is due; a time already past sends it at
/// once. At most 366 days ahead.
#[repr(C)]
pub struct outbox_schedule {
    /// The time to send it at, in milliseconds since the Unix epoch; 0: not set.
    pub deliver_at_ms: i64,
    /// How long after the INSERT to send it, in milliseconds; 0: not set.
    pub delay_ms: i64,
}

pub(crate) unsafe fn to_schedule(s: *const outbox_schedule) -> Result<Option<crate::event::Schedule>, Failure> {
    if s.is_null() {
        return Ok(None);
    }
    let s = &*s;
    Ok(crate::event::Schedule::from_millis(s.deliver_at_ms, s.delay_ms)?)
}

/// The kind of an `outbox_param`, in its `kind` field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum outbox_param_kind {
    /// SQL NULL.
    OUTBOX_PARAM_NULL = 0,
    /// `int_value`.
    OUTBOX_PARAM_INT64 = 1,
    /// `double_value`.
    OUTBOX_PARAM_DOUBLE = 2,
    /// `text`: NUL-terminated UTF-8.
    OUTBOX_PARAM_TEXT = 3,
    /// `bytes` and `bytes_len` (bytes may be NULL when `bytes_len` is 0).
    OUTBOX_PARAM_BYTES = 4,
}

/// One bound parameter of a statement (`?` placeholders, bound in order, never interpolated).
/// Set `kind` to an `outbox_param_kind` value and the field it names; the others are ignored.
#[repr(C)]
pub struct outbox_param {
    /// An `outbox_param_kind` value (a plain integer so any value C passes is well defined;
    /// unknown kinds are `OUTBOX_ERR_INVALID_ARGUMENT`).
    pub kind: u32,
    pub int_value: i64,
    pub double_value: f64,
    pub text: *const c_char,
    pub bytes: *const u8,
    pub bytes_len: usize,
}

pub(crate) unsafe fn to_new_event(e: &outbox_event) -> Result<crate::event::NewEvent, Failure> {
    let biz_no = arg_str(e.biz_no, "event.biz_no")?.to_string();
    let event_type = arg_str(e.event_type, "event.event_type")?.to_string();
    let payload = arg_slice(e.payload, e.payload_len, "event.payload")?.to_vec();
    let topic = arg_opt_str(e.topic, "event.topic")?.map(str::to_string);
    let tag = arg_opt_str(e.tag, "event.tag")?.map(str::to_string);
    let mut headers = BTreeMap::new();
    for (i, h) in arg_slice(e.headers, e.headers_len, "event.headers")?.iter().enumerate() {
        let key = arg_str(h.key, &format!("event.headers[{i}].key"))?;
        let value = arg_str(h.value, &format!("event.headers[{i}].value"))?;
        if headers.insert(key.to_string(), value.to_string()).is_some() {
            return Err(Failure::new(
                OUTBOX_ERR_INVALID_EVENT,
                format!("invalid event: headers has the key {key:?} twice"),
            ));
        }
    }
    Ok(crate::event::NewEvent {
        biz_no,
        event_type,
        payload,
        topic,
        tag,
        headers,
        schedule: None,
    })
}

pub(crate) unsafe fn to_params(params: *const outbox_param, n: usize) -> Result<mysql::Params, Failure> {
    let params = arg_slice(params, n, "params")?;
    if params.is_empty() {
        return Ok(mysql::Params::Empty);
    }
    let mut values = Vec::with_capacity(params.len());
    for (i, p) in params.iter().enumerate() {
        let v = match p.kind {
            k if k == outbox_param_kind::OUTBOX_PARAM_NULL as u32 => mysql::Value::NULL,
            k if k == outbox_param_kind::OUTBOX_PARAM_INT64 as u32 => mysql::Value::Int(p.int_value),
            k if k == outbox_param_kind::OUTBOX_PARAM_DOUBLE as u32 => mysql::Value::Double(p.double_value),
            k if k == outbox_param_kind::OUTBOX_PARAM_TEXT as u32 => {
                mysql::Value::Bytes(arg_str(p.text, &format!("params[{i}].text"))?.as_bytes().to_vec())
            }
            k if k == outbox_param_kind::OUTBOX_PARAM_BYTES as u32 => {
                mysql::Value::Bytes(arg_slice(p.bytes, p.bytes_len, &format!("params[{i}].bytes"))?.to_vec())
            }
            k => {
                return Err(Failure::new(
                    OUTBOX_ERR_INVALID_ARGUMENT,
                    format!("params[{i}].kind is {k}, not an outbox_param_kind"),
                ))
            }
        };
        values.push(v);
    }
    Ok(mysql::Params::Positional(values))
}
