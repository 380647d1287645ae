//! The boundary itself, without a database: NULL, bad UTF-8, panics, buffers, codes.

use std::ffi::{c_char, c_int, CStr};
use std::ptr::{null, null_mut};

use super::boundary::*;
use super::result::outbox_result::*;
use super::*;

fn last_error() -> String {
    let mut needed = 0usize;
    let mut buf = vec![0 as c_char; 512];
    assert_eq!(
        unsafe { outbox_last_error(buf.as_mut_ptr(), buf.len(), &mut needed) },
        OUTBOX_OK
    );
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string()
}

#[test]
fn a_panic_in_the_body_becomes_a_result_code_not_an_unwind_into_c() {
    let r = boundary(|| panic!("boom"));
    assert_eq!(r, OUTBOX_ERR_PANIC);
    assert!(last_error().contains("boom"));
    assert_eq!(boundary_value(7, || panic!("boom")), 7);
}

#[test]
fn nonnull_arguments_are_checked_before_the_body_runs() {
    let p: *const u8 = null();
    let mut ran = false;
    let r = ffi_boundary!(nonnull(p) {
        ran = true;
        Ok(())
    });
    assert_eq!(r, OUTBOX_ERR_NULL_ARGUMENT);
    assert!(!ran);
    assert!(last_error().contains("`p`"));
}

#[test]
fn conf_set_distinguishes_unknown_keys_from_invalid_values_and_writes_errstr_only_on_failure() {
    unsafe {
        let conf = outbox_conf_new();
        let mut err = [b'x' as c_char; 128];
        assert_eq!(
            outbox_conf_set(
                conf,
                c"batch.size".as_ptr(),
                c"50".as_ptr(),
                err.as_mut_ptr(),
                err.len()
            ),
            OUTBOX_OK
        );
        assert_eq!(err[0], b'x' as c_char, "errstr untouched on success");
        assert_eq!((*conf).config.batch_size, 50);
        assert_eq!(
            outbox_conf_set(
                conf,
                c"no.such.key".as_ptr(),
                c"1".as_ptr(),
                err.as_mut_ptr(),
                err.len()
            ),
            OUTBOX_ERR_UNKNOWN_KEY
        );
        assert!(CStr::from_ptr(err.as_ptr()).to_str().unwrap().contains("no.such.key"));
        assert_eq!(
            outbox_conf_set(
                conf,
                c"batch.size".as_ptr(),
                c"lots".as_ptr(),
                err.as_mut_ptr(),
                err.len()
            ),
            OUTBOX_ERR_INVALID_VALUE
        );
        let msg = CStr::from_ptr(err.as_ptr()).to_str().unwrap();
        assert!(msg.contains("batch.size") && msg.contains("lots"), "{msg}");
        assert_eq!(
            (*conf).config.batch_size,
            50,
            "a rejected value leaves the conf unchanged"
        );
        outbox_conf_free(conf);
    }
}

#[test]
fn invalid_utf8_is_an_error_code_naming_the_argument() {
    unsafe {
        let conf = outbox_conf_new();
        let bad = b"top\xffic\0";
        let mut err = [0 as c_char; 128];
        assert_eq!(
            outbox_conf_set(
                conf,
                c"topic".as_ptr(),
                bad.as_ptr().cast(),
                err.as_mut_ptr(),
                err.len()
            ),
            OUTBOX_ERR_INVALID_UTF8
        );
        assert!(CStr::from_ptr(err.as_ptr()).to_str().unwrap().contains("`value`"));
        outbox_conf_free(conf);
    }
}

#[test]
fn errstr_is_truncated_at_a_character_boundary_and_nul_terminated() {
    let mut buf = [b'x' as c_char; 4];
    unsafe { write_errstr(buf.as_mut_ptr(), buf.len(), "aéé") };
    // "a" + "é" is 3 bytes: fits; the second "é" does not.
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "aé");
    unsafe { write_errstr(null_mut(), 10, "ignored") };
    unsafe { write_errstr(buf.as_mut_ptr(), 0, "ignored") };
}

#[test]
fn buffer_outputs_report_the_size_needed_and_leave_a_short_buffer_untouched() {
    let mut needed = 0usize;
    let mut small = [b'x' as c_char; 3];
    let r = unsafe { write_string_out("hello", small.as_mut_ptr(), small.len(), &mut needed) };
    assert_eq!(r.unwrap_err().code, OUTBOX_ERR_BUFFER_TOO_SMALL);
    assert_eq!(needed, 6);
    assert_eq!(small, [b'x' as c_char; 3]);
    let r = unsafe { write_string_out("hello", null_mut(), 0, &mut needed) };
    assert_eq!(r.unwrap_err().code, OUTBOX_ERR_BUFFER_TOO_SMALL);
    let mut buf = [0 as c_char; 6];
    unsafe { write_string_out("hello", buf.as_mut_ptr(), buf.len(), &mut needed) }.unwrap();
    assert_eq!(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap(), "hello");
}

#[test]
fn result_codes_have_descriptions_and_retriability() {
    for r in outbox_result::ALL {
        let s = unsafe { CStr::from_ptr(outbox_result_str(r as c_int)) };
        assert!(!s.to_bytes().is_empty());
    }
    assert_eq!(
        unsafe { CStr::from_ptr(outbox_result_str(12345)) }.to_str().unwrap(),
        "unknown result code"
    );
    assert!(outbox_result_is_retriable(OUTBOX_ERR_DATABASE as c_int));
    assert!(!outbox_result_is_retriable(OUTBOX_ERR_STATEMENT as c_int));
    assert!(!outbox_result_is_retriable(OUTBOX_ERR_RESOURCE as c_int));
    // A thread that cannot be started is the system's refusal, not a retriable publisher error.
    let thread = crate::error::Error::Thread {
        name: "outbox-worker-0".into(),
        source: std::io::Error::from(std::io::ErrorKind::OutOfMemory),
    };
    assert_eq!(super::boundary::Failure::from(thread).code, OUTBOX_ERR_RESOURCE);
    assert!(!outbox_result_is_retriable(OUTBOX_OK as c_int));
    assert!(!outbox_result_is_retriable(-1));
    assert_eq!(
        unsafe { CStr::from_ptr(outbox_version()) }.to_str().unwrap(),
        crate::VERSION
    );
}

#[test]
fn start_consumes_the_conf_even_when_the_output_pointer_is_null() {
    unsafe {
        let conf = outbox_conf_new();
        // Nothing to free afterwards: valgrind (tests/c) checks that nothing leaks.
        assert_eq!(outbox_start(conf, null_mut(), null_mut(), 0), OUTBOX_ERR_NULL_ARGUMENT);
        let mut out: *mut outbox_relay = null_mut();
        assert_eq!(
            outbox_start(null_mut(), &mut out, null_mut(), 0),
            OUTBOX_ERR_NULL_ARGUMENT
        );
        assert!(out.is_null());
    }
}

#[test]
fn start_without_rocketmq_support_is_an_invalid_value_of_publisher() {
    if cfg!(feature = "rocketmq") {
        return;
    }
    unsafe {
        let conf = outbox_conf_new();
        assert_eq!(
            outbox_conf_set(
                conf,
                c"db.url".as_ptr(),
                c"mysql://root@127.0.0.1:1/none".as_ptr(),
                null_mut(),
                0
            ),
            OUTBOX_OK
        );
        let mut out: *mut outbox_relay = null_mut();
        let mut err = [0 as c_char; 256];
        assert_eq!(
            outbox_start(conf, &mut out, err.as_mut_ptr(), err.len()),
            OUTBOX_ERR_INVALID_VALUE
        );
        assert!(out.is_null(), "outputs are written only on success");
        assert!(CStr::from_ptr(err.as_ptr()).to_str().unwrap().contains("publisher"));
    }
}

#[test]
fn free_functions_accept_null() {
    unsafe {
        outbox_conf_free(null_mut());
        outbox_free(null_mut());
        outbox_tx_free(null_mut());
    }
}

#[test]
fn param_kinds_outside_the_enum_are_rejected() {
    let p = outbox_param {
        kind: 42,
        int_value: 0,
        double_value: 0.0,
        text: null(),
        bytes: null(),
        bytes_len: 0,
    };
    let e = unsafe { event::to_params(&p, 1) }.unwrap_err();
    assert_eq!(e.code, OUTBOX_ERR_INVALID_ARGUMENT);
    let e = unsafe { event::to_params(null(), 2) }.unwrap_err();
    assert_eq!(e.code, OUTBOX_ERR_NULL_ARGUMENT);
}

type Seen = parking_lot::Mutex<Vec<(u64, String, String, u32, String)>>;

unsafe extern "C" fn record_letter(user_data: *mut std::ffi::c_void, letter: *const outbox_dead_letter) {
    let seen = &*(user_data as *const Seen);
    let l = &*letter;
    let s = |p: *const c_char| CStr::from_ptr(p).to_str().unwrap().to_string();
    seen.lock()
        .push((l.id, s(l.biz_no), s(l.event_type), l.retry_count, s(l.last_error)));
}

#[test]
fn the_dead_letter_callback_gets_every_field_and_is_never_called_once_cleared() {
    let seen: Seen = parking_lot::Mutex::new(Vec::new());
    let slot = crate::host::relay::DeadLetterSlot::new(conf::c_dead_letter_hook(
        record_letter,
        UserData(&seen as *const _ as *mut std::ffi::c_void),
    ));
    let hook = slot.hook();
    let letter = crate::store::DeadLetter {
        id: 42,
        biz_no: "ORD-1".into(),
        event_type: "ORDER_CREATED".into(),
        retry_count: 4,
        // A NUL inside a message must not truncate or break the C string.
        last_error: "broker said\0no".into(),
    };
    hook(&letter);
    assert_eq!(
        seen.lock().as_slice(),
        &[(
            42,
            "ORD-1".into(),
            "ORDER_CREATED".into(),
            4,
            "broker said\u{FFFD}no".into()
        )]
    );
    // What outbox_free does before the relay's threads may still run.
    slot.release();
    hook(&letter);
    assert_eq!(seen.lock().len(), 1);
}
