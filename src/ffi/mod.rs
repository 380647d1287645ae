//! The C ABI: a thin layer of argument checks, casts and error mapping over the Rust API and
//! the operations of `crate::host` (written once for the C ABI and JNI). The core knows nothing
//! of it. `include/outbox.h` is generated from this module by cbindgen
//! (`cbindgen.toml`) and committed; `tests/header.rs` fails when the two drift apart.
//!
//! Rules every exported function follows:
//! - its body runs inside `ffi_boundary!`: pointer arguments named there are checked for NULL
//!   first, and a panic never crosses into C (it becomes `OUTBOX_ERR_PANIC`);
//! - results are [`outbox_result`] codes with explicit, stable values;
//! - outputs are written only when the call succeeds;
//! - strings are NUL-terminated UTF-8, and invalid UTF-8 is `OUTBOX_ERR_INVALID_UTF8`;
//! - payloads and strings are copied before the call returns;
//! - every object the library allocates is freed by its own `*_free`, once; `*_free(NULL)` is a
//!   no-op.

// The C names are the ABI: snake_case types, SCREAMING_CASE constants.
#![allow(non_camel_case_types)]
// Every function takes raw pointers from C; its documented contract (which goes into the
// header) is the safety contract, as in rustls-ffi.
#![allow(clippy::missing_safety_doc)]
mod boundary;
mod cancel;
mod conf;
mod consumer;
mod event;
mod library;
mod logging;
mod relay;
mod result;
mod tx;

pub use cancel::*;
pub use conf::*;
pub use consumer::*;
pub use event::*;
pub use library::*;
pub use logging::*;
pub use relay::*;
pub use result::*;
pub use tx::*;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;
