// Package linuxamd64 holds the prebuilt static library of the released module for linux/amd64,
// liboutbox.a, which scripts/release go puts beside this file (a checkout of the repository has
// none). link_prebuilt.go links it; nothing imports this package except vendor_lib.go, and only
// so that `go mod vendor` copies the directory.
package linuxamd64
