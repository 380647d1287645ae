//go:build !outbox_static

package outbox

// Links the shared library: -loutbox, found through CGO_LDFLAGS="-L<dir>" (and an rpath, or
// LD_LIBRARY_PATH, at run time).

// #cgo LDFLAGS: -loutbox
import "C"
