//go:build !outbox_static && (outbox_dynamic || !linux || !amd64)

package outbox

// Links the shared library: -loutbox, found through CGO_LDFLAGS="-L<dir>" (and an rpath, or
// LD_LIBRARY_PATH, at run time). The default on platforms the module carries no prebuilt library
// for; on linux/amd64 it takes -tags outbox_dynamic (for a library you build yourself).

// #cgo LDFLAGS: -loutbox
import "C"
