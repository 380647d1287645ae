//go:build outbox_vendor_lib

package outbox

// No build sets the tag outbox_vendor_lib. `go mod vendor` reads every file whatever its tags:
// this import makes it copy lib/linux-amd64 (the prebuilt liboutbox.a) into vendor/, so a
// vendored program links the same library as one built from the module cache.
import _ "github.com/outbox-rs/outbox/bindings/go/lib/linux-amd64"
