//! Property tests (proptest) of the C ABI's input decoding: arbitrary bytes where C passes
//! strings (invalid UTF-8 included), NULL where C may pass NULL, buffer sizes from 0 up. Each
//! case checks the result code against what the bytes mean, that nothing panics, and that
//! output buffers are written only as documented. A short run by default so it fits in
//! `cargo test`; `PROPTEST_CASES=20000 cargo test --lib ffi::fuzz` for a longer one.

use std::ffi::{c_char, CStr, CString};
use std::ptr::{null, null_mut};

use proptest::prelude::*;

use super::boundary::*;
use super::event::{outbox_event, outbox_header, outbox_param, to_new_event, to_params};
use super::result::outbox_result::*;
use super::*;
use crate::config::KEYS;
use crate::error::ConfigError;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

/// Bytes as C would pass them in a NUL-terminated string: anything but NUL, often UTF-8,
/// sometimes a real configuration key.
fn c_bytes() -> impl Strategy<Value = Vec<u8>> {
    let keys: Vec<Vec<u8>> = KEYS.iter().map(|k| k.key.as_bytes().to_vec()).collect();
    prop_oneof![
        3 => any::<String>().prop_map(|s| s.replace('\0', "").into_bytes()),
        2 => proptest::collection::vec(1u8..=255, 0..40),
        2 => proptest::sample::select(keys),
        1 => "[0-9]{1,12}".prop_map(String::into_bytes),
    ]
}

/// A C string argument: `None` is NULL.
fn c_arg() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![1 => Just(None), 6 => c_bytes().prop_map(Some)]
}

fn cstring(b: &[u8]) -> CString {
    CString::new(b.to_vec()).expect("strategies never produce NUL bytes")
}

fn ptr(c: &Option<CString>) -> *const c_char {
    c.as_ref().map_or(null(), |c| c.as_ptr())
}

/// What decoding one string argument must give: NULL, invalid UTF-8, or the text.
#[derive(Debug, PartialEq)]
enum Decoded {
    Null,
    BadUtf8,
    Text(String),
}

fn decoded(b: &Option<Vec<u8>>) -> Decoded {
    match b {
        None => Decoded::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => Decoded::Text(s.to_string()),
            Err(_) => Decoded::BadUtf8,
        },
    }
}

/// The result code a required string argument gives when it does not decode.
fn required_failure(d: &Decoded) -> Option<outbox_result> {
    match d {
        Decoded::Null => Some(OUTBOX_ERR_NULL_ARGUMENT),
        Decoded::BadUtf8 => Some(OUTBOX_ERR_INVALID_UTF8),
        Decoded::Text(_) => None,
    }
}

const SENTINEL: c_char = 0x55;

/// Checks an errstr buffer after a call: untouched on success; on failure (with a buffer) a
/// NUL-terminated UTF-8 prefix of the full message that fills the buffer as far as a
/// character boundary allows.
fn check_errstr(buf: &[c_char], size: usize, code: outbox_result, full: &str) -> Result<(), TestCaseError> {
    if code == OUTBOX_OK || size == 0 {
        prop_assert!(buf.iter().all(|&b| b == SENTINEL), "errstr written when it must not be");
        return Ok(());
    }
    let nul = buf[..size].iter().position(|&b| b == 0);
    prop_assert!(nul.is_some(), "errstr of {} bytes not NUL-terminated", size);
    prop_assert!(
        buf[size..].iter().all(|&b| b == SENTINEL),
        "errstr written past its size"
    );
    let got = unsafe { CStr::from_ptr(buf.as_ptr()) };
    let got = got.to_str();
    prop_assert!(got.is_ok(), "errstr is not UTF-8");
    let got = got.unwrap();
    prop_assert!(full.starts_with(got), "errstr {:?} is not a prefix of {:?}", got, full);
    if got.len() < full.len() {
        let next = full[got.len()..].chars().next().unwrap().len_utf8();
        prop_assert!(
            got.len() + next > size - 1,
            "errstr cut short: {:?} in {} bytes",
            got,
            size
        );
    }
    Ok(())
}

fn last_error() -> String {
    let mut needed = 0usize;
    let mut buf = vec![0 as c_char; 4096];
    let r = unsafe { outbox_last_error(buf.as_mut_ptr(), buf.len(), &mut needed) };
    assert_eq!(r, OUTBOX_OK);
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// `outbox_conf_set` on arbitrary bytes: the code says exactly what is wrong (NULL, bad
    /// UTF-8 in the key first, unknown key, invalid value), the conf changes only on success,
    /// and errstr follows its contract for every buffer size.
    #[test]
    fn conf_set_decodes_any_bytes(
        key in c_arg(),
        value in c_arg(),
        size in prop_oneof![Just(0usize), 1usize..8, 8usize..200],
        errstr_null in proptest::bool::weighted(0.1),
    ) {
        let (k, v) = (key.as_deref().map(cstring), value.as_deref().map(cstring));
        let conf = outbox_conf_new();
        prop_assert!(!conf.is_null());
        let before = unsafe { (*conf).config.clone() };
        let mut buf = vec![SENTINEL; size + 8];
        let errstr = if errstr_null { null_mut() } else { buf.as_mut_ptr() };
        let code = unsafe { outbox_conf_set(conf, ptr(&k), ptr(&v), errstr, size) };
        let after = unsafe { (*conf).config.clone() };
        unsafe { outbox_conf_free(conf) };

        let (dk, dv) = (decoded(&key), decoded(&value));
        let expected = match (required_failure(&dk), required_failure(&dv)) {
            (Some(c), _) | (None, Some(c)) => c,
            (None, None) => {
                let (Decoded::Text(k), Decoded::Text(v)) = (&dk, &dv) else { unreachable!() };
                let mut c = before.clone();
                match c.set(k, v) {
                    Ok(()) => {
                        prop_assert_eq!(&after, &c, "conf differs from Config::set's result");
                        OUTBOX_OK
                    }
                    Err(ConfigError::UnknownKey { .. }) => OUTBOX_ERR_UNKNOWN_KEY,
                    Err(_) => OUTBOX_ERR_INVALID_VALUE,
                }
            }
        };
        prop_assert_eq!(code, expected, "key {:?} value {:?}", dk, dv);
        if code != OUTBOX_OK {
            prop_assert_eq!(&after, &before, "a refused call changed the conf");
        }
        let full = if code == OUTBOX_OK { String::new() } else { last_error() };
        if errstr_null {
            prop_assert!(buf.iter().all(|&b| b == SENTINEL));
        } else {
            check_errstr(&buf, size, code, &full)?;
        }
    }

    /// `outbox_event` decoding: every field NULL, bad UTF-8 or text, payload and headers with
    /// NULL pointers at zero and non-zero lengths. The first bad field decides the code and is
    /// named in the message; a good event decodes to exactly its bytes.
    #[test]
    fn event_decoding_follows_the_bytes(
        biz_no in c_arg(),
        event_type in c_arg(),
        payload in proptest::option::weighted(0.9, proptest::collection::vec(any::<u8>(), 0..64)),
        payload_len_extra in 0usize..3,
        topic in c_arg(),
        tag in c_arg(),
        headers in proptest::option::weighted(0.9, proptest::collection::vec((c_arg(), c_arg()), 0..4)),
        headers_len_when_null in 0usize..3,
    ) {
        let own = |b: &Option<Vec<u8>>| b.as_deref().map(cstring);
        let (b, t, tp, tg) = (own(&biz_no), own(&event_type), own(&topic), own(&tag));
        let hs: Vec<(Option<CString>, Option<CString>)> = headers
            .iter()
            .flatten()
            .map(|(k, v)| (own(k), own(v)))
            .collect();
        let raw_headers: Vec<outbox_header> = hs.iter().map(|(k, v)| outbox_header { key: ptr(k), value: ptr(v) }).collect();
        // A NULL payload with a length (0 is allowed, more is an error); otherwise the length
        // is the vector's (never longer: that would be a lie C can tell, not one we can see).
        let (payload_ptr, payload_len) = match &payload {
            None => (null(), payload_len_extra),
            Some(p) => (p.as_ptr(), p.len()),
        };
        let (headers_ptr, headers_len) = match &headers {
            None => (null(), headers_len_when_null),
            Some(_) => (raw_headers.as_ptr(), raw_headers.len()),
        };
        let e = outbox_event {
            biz_no: ptr(&b),
            event_type: ptr(&t),
            payload: payload_ptr,
            payload_len,
            topic: ptr(&tp),
            tag: ptr(&tg),
            headers: headers_ptr,
            headers_len,
        };
        let got = std::panic::catch_unwind(|| unsafe { to_new_event(&e) });
        prop_assert!(got.is_ok(), "decoding panicked");
        let got = got.unwrap();

        // The expected outcome, field by field in the decoder's order.
        let expect = (|| -> Result<crate::event::NewEvent, (outbox_result, String)> {
            let req = |d: Decoded, name: &str| match d {
                Decoded::Text(s) => Ok(s),
                other => Err((required_failure(&other).unwrap(), name.to_string())),
            };
            let opt = |d: Decoded, name: &str| match d {
                Decoded::Null => Ok(None),
                Decoded::Text(s) => Ok(Some(s)),
                Decoded::BadUtf8 => Err((OUTBOX_ERR_INVALID_UTF8, name.to_string())),
            };
            let biz_no = req(decoded(&biz_no), "event.biz_no")?;
            let event_type = req(decoded(&event_type), "event.event_type")?;
            let payload = match &payload {
                Some(p) => p.clone(),
                None if payload_len == 0 => Vec::new(),
                None => return Err((OUTBOX_ERR_NULL_ARGUMENT, "event.payload".into())),
            };
            let topic = opt(decoded(&topic), "event.topic")?;
            let tag = opt(decoded(&tag), "event.tag")?;
            let mut map = std::collections::BTreeMap::new();
            match &headers {
                None if headers_len > 0 => return Err((OUTBOX_ERR_NULL_ARGUMENT, "event.headers".into())),
                None => {}
                Some(list) => {
                    for (i, (k, v)) in list.iter().enumerate() {
                        let k = req(decoded(k), &format!("event.headers[{i}].key"))?;
                        let v = req(decoded(v), &format!("event.headers[{i}].value"))?;
                        if map.insert(k.clone(), v).is_some() {
                            return Err((OUTBOX_ERR_INVALID_EVENT, format!("{k:?} twice")));
                        }
                    }
                }
            }
            Ok(crate::event::NewEvent { biz_no, event_type, payload, topic, tag, headers: map, schedule: None })
        })();
        match (got, expect) {
            (Ok(ev), Ok(want)) => {
                prop_assert_eq!(ev.biz_no, want.biz_no);
                prop_assert_eq!(ev.event_type, want.event_type);
                prop_assert_eq!(ev.payload, want.payload);
                prop_assert_eq!(ev.topic, want.topic);
                prop_assert_eq!(ev.tag, want.tag);
                prop_assert_eq!(ev.headers, want.headers);
            }
            (Err(f), Err((code, names))) => {
                prop_assert_eq!(f.code, code, "{}", f.message);
                prop_assert!(f.message.contains(&names), "{:?} does not name {}", f.message, names);
            }
            (Ok(_), Err((code, name))) => prop_assert!(false, "decoded, expected {:?} for {}", code, name),
            (Err(f), Ok(_)) => prop_assert!(false, "refused a good event: {}", f.message),
        }
    }

    /// Statement parameters: any kind value (unknown ones refused by index), text as bytes
    /// (bad UTF-8 refused), byte arrays with NULL at zero and non-zero lengths.
    #[test]
    fn params_decoding_follows_the_kinds(
        params in proptest::collection::vec(
            (prop_oneof![4 => 0u32..5, 1 => any::<u32>()], any::<i64>(), any::<f64>(), c_arg(),
             proptest::option::weighted(0.8, proptest::collection::vec(any::<u8>(), 0..16)), 0usize..3),
            0..5,
        ),
    ) {
        let texts: Vec<Option<CString>> = params.iter().map(|p| p.3.as_deref().map(cstring)).collect();
        let raw: Vec<outbox_param> = params
            .iter()
            .zip(&texts)
            .map(|((kind, i, d, _, bytes, len_if_null), text)| outbox_param {
                kind: *kind,
                int_value: *i,
                double_value: *d,
                text: ptr(text),
                bytes: bytes.as_ref().map_or(null(), |b| b.as_ptr()),
                bytes_len: bytes.as_ref().map_or(*len_if_null, |b| b.len()),
            })
            .collect();
        let got = std::panic::catch_unwind(|| unsafe { to_params(raw.as_ptr(), raw.len()) });
        prop_assert!(got.is_ok(), "decoding panicked");
        let got = got.unwrap();
        let mut want = Vec::new();
        let mut failure: Option<(outbox_result, String)> = None;
        for (i, (kind, iv, dv, text, bytes, len_if_null)) in params.iter().enumerate() {
            let v = match kind {
                0 => mysql::Value::NULL,
                1 => mysql::Value::Int(*iv),
                2 => mysql::Value::Double(*dv),
                3 => match decoded(text) {
                    Decoded::Text(s) => mysql::Value::Bytes(s.into_bytes()),
                    other => {
                        failure = Some((required_failure(&other).unwrap(), format!("params[{i}].text")));
                        break;
                    }
                },
                4 => match bytes {
                    Some(b) => mysql::Value::Bytes(b.clone()),
                    None if *len_if_null == 0 => mysql::Value::Bytes(Vec::new()),
                    None => {
                        failure = Some((OUTBOX_ERR_NULL_ARGUMENT, format!("params[{i}].bytes")));
                        break;
                    }
                },
                _ => {
                    failure = Some((OUTBOX_ERR_INVALID_ARGUMENT, format!("params[{i}].kind")));
                    break;
                }
            };
            want.push(v);
        }
        match (got, failure) {
            (Ok(p), None) => {
                let want = if want.is_empty() { mysql::Params::Empty } else { mysql::Params::Positional(want) };
                prop_assert_eq!(p, want);
            }
            (Err(f), Some((code, name))) => {
                prop_assert_eq!(f.code, code, "{}", f.message);
                prop_assert!(f.message.contains(&name), "{:?} does not name {}", f.message, name);
            }
            (Ok(_), Some((code, name))) => prop_assert!(false, "decoded, expected {:?} for {}", code, name),
            (Err(f), None) => prop_assert!(false, "refused good params: {}", f.message),
        }
    }

    /// Output strings: `outbox_last_error` copies the whole message or reports the size it
    /// needs, never writing a partial string into a short buffer.
    #[test]
    fn string_outputs_are_whole_or_not_written(message in any::<String>(), len in 0usize..80, buf_null in proptest::bool::weighted(0.1)) {
        let message = message.replace('\0', "");
        let mut buf = vec![SENTINEL; len + 4];
        let mut needed = usize::MAX;
        let p = if buf_null { null_mut() } else { buf.as_mut_ptr() };
        let r = unsafe { write_string_out(&message, p, len, &mut needed) };
        let want = message.len() + 1;
        match r {
            Ok(()) => {
                prop_assert!(!buf_null && len >= want);
                prop_assert_eq!(needed, want);
                let got = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap();
                prop_assert_eq!(got, message.as_str());
                prop_assert!(buf[want..].iter().all(|&b| b == SENTINEL));
            }
            Err(f) if buf_null && len > 0 => prop_assert_eq!(f.code, OUTBOX_ERR_NULL_ARGUMENT),
            Err(f) => {
                prop_assert_eq!(f.code, OUTBOX_ERR_BUFFER_TOO_SMALL);
                prop_assert!(len < want);
                prop_assert_eq!(needed, want);
                prop_assert!(buf.iter().all(|&b| b == SENTINEL), "a short buffer was written");
            }
        }
    }

    /// `write_errstr` (every errstr of the API): truncation at a character boundary, always
    /// terminated, never past the size, nothing with size 0.
    #[test]
    fn errstr_truncation_is_safe_for_any_message(message in any::<String>(), size in 0usize..40) {
        let mut buf = vec![SENTINEL; size + 4];
        unsafe { write_errstr(buf.as_mut_ptr(), size, &message) };
        // write_errstr copies the message as it is; a NUL inside ends the C string early.
        let full = message.split('\0').next().unwrap();
        let code = if size == 0 { OUTBOX_OK } else { OUTBOX_ERR_INVALID_ARGUMENT };
        check_errstr(&buf, size, code, full)?;
    }
}
