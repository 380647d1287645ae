//go:build linux && amd64 && !outbox_dynamic && !outbox_static

package outbox

// The default on linux/amd64: the static library the released module carries, in three parts
// (lib/linux-amd64/liboutbox-1.a … -3.a, built by scripts/release go with --features rocketmq and
// split so that every file of the module is under the 100 MB a public git host takes), linked
// into the program as one group. `go get` and `go build` then need no Rust toolchain and no
// CGO_LDFLAGS; the program needs only libc, libm, libgcc_s and libz at run time (libz: the
// RocketMQ client compresses large bodies). The libraries are those rustc reports for the static
// library (--print native-static-libs: -lz -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc); on glibc
// 2.34 and later most of them are parts of libc.
//
// A checkout of the repository has no lib/: there, build with -tags outbox_dynamic or
// -tags outbox_static and a library of your own (link_dynamic.go, link_static.go). A platform
// without a directory under lib/ links the shared library (link_dynamic.go).

// #cgo linux,amd64 LDFLAGS: -Wl,--start-group ${SRCDIR}/lib/linux-amd64/liboutbox-1.a ${SRCDIR}/lib/linux-amd64/liboutbox-2.a ${SRCDIR}/lib/linux-amd64/liboutbox-3.a -Wl,--end-group
// #cgo linux,amd64 LDFLAGS: -lz -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
import "C"
