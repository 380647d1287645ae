package tests

/*
#cgo CFLAGS: -I${SRCDIR}/..
#cgo LDFLAGS: -loutbox -lpthread
#include <pthread.h>
#include <stdlib.h>
#include "outbox.h"

// Starts and frees an enqueue-only relay on a thread the Go runtime has never seen, so that
// the library's start record reaches the Go log function through a cgo callback from a foreign
// thread, as records from relay threads do.
static void *start_and_free(void *url) {
	outbox_conf *c = outbox_conf_new();
	outbox_relay *r = NULL;
	if (c == NULL) return (void *)1;
	if (outbox_conf_set(c, "db.url", (const char *)url, NULL, 0) != OUTBOX_OK ||
	    outbox_conf_set(c, "publisher", "none", NULL, 0) != OUTBOX_OK ||
	    outbox_conf_set(c, "service.name", "cthread", NULL, 0) != OUTBOX_OK) {
		outbox_conf_free(c);
		return (void *)1;
	}
	if (outbox_start(c, &r, NULL, 0) != OUTBOX_OK) return (void *)1;
	outbox_free(r);
	return NULL;
}

static int start_on_a_c_thread(const char *url) {
	pthread_t t;
	void *rc = NULL;
	if (pthread_create(&t, NULL, start_and_free, (void *)url) != 0) return -1;
	if (pthread_join(t, &rc) != 0) return -1;
	return rc == NULL ? 0 : 1;
}
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// StartOnAForeignThread starts and frees an enqueue-only relay on dbURL from a pthread the Go
// runtime did not create; it returns when that thread has ended.
func StartOnAForeignThread(dbURL string) error {
	u := C.CString(dbURL)
	defer C.free(unsafe.Pointer(u))
	if rc := C.start_on_a_c_thread(u); rc != 0 {
		return fmt.Errorf("the C thread could not start the relay (%d)", int(rc))
	}
	return nil
}
