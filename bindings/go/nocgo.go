//go:build !cgo

package outbox

// This package links the outbox library through its C ABI, so it needs cgo: build with
// CGO_ENABLED=1 (the default where a C compiler is installed) and gcc or clang on PATH. Without
// cgo, this is the only file of the package, and the error below is the build's only message.
const _ = outbox_needs_cgo__build_with_CGO_ENABLED_1_and_a_C_compiler
