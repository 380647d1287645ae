//go:build outbox_static

package outbox

// With -tags outbox_static a liboutbox.a you built yourself is linked into the program, found
// through CGO_LDFLAGS="-L<dir>", with the system libraries it needs (those of link_prebuilt.go).
// The program then needs only libc, libm, libgcc_s and libz at run time (libz: the RocketMQ
// client compresses large bodies). It takes precedence over outbox_dynamic.

// #cgo LDFLAGS: -l:liboutbox.a -lz -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
import "C"
