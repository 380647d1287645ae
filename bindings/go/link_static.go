//go:build outbox_static

package outbox

// With -tags outbox_static the library is linked into the program: liboutbox.a (found through
// CGO_LDFLAGS="-L<dir>") and the system libraries it needs. The program then needs only libc,
// libm, libgcc_s and libz at run time (libz: the RocketMQ client compresses large bodies).

// #cgo LDFLAGS: -l:liboutbox.a -lz -lm -ldl -lpthread -lgcc_s
import "C"
