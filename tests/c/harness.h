/* A minimal test harness for the C ABI tests: CHECK macros, a test registry, and helpers for
 * the per-run database that tests/c/run.sh creates (OUTBOX_TEST_DB_URL). */
#ifndef OUTBOX_TEST_HARNESS_H
#define OUTBOX_TEST_HARNESS_H

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "outbox.h"

static int h_checks_failed;
static int h_skip;

/* Marks the running test skipped, with the reason. */
#define SKIP(...)                                                                          \
  do {                                                                                     \
    printf("skip: ");                                                                      \
    printf(__VA_ARGS__);                                                                   \
    printf("\n");                                                                          \
    h_skip = 1;                                                                            \
  } while (0)

#define CHECK(cond)                                                                        \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);           \
      h_checks_failed++;                                                                   \
    }                                                                                      \
  } while (0)

/* Checks that `expr` returns `want`; on mismatch prints both codes and the last error. */
#define CHECK_RC(expr, want)                                                               \
  do {                                                                                     \
    outbox_result h_rc_ = (expr);                                                          \
    if (h_rc_ != (want)) {                                                                 \
      fprintf(stderr, "  %s:%d: %s returned %d (%s), wanted %d (%s); last error: %s\n",    \
              __FILE__, __LINE__, #expr, (int)h_rc_, outbox_result_str((int)h_rc_),        \
              (int)(want), outbox_result_str((int)(want)), last_error());                  \
      h_checks_failed++;                                                                   \
    }                                                                                      \
  } while (0)

#define CHECK_OK(expr) CHECK_RC(expr, OUTBOX_OK)

/* The message of the last failed call on this thread (static buffer). */
__attribute__((unused)) static const char *last_error(void) {
  static char buf[1024];
  size_t needed = 0;
  if (outbox_last_error(buf, sizeof buf, &needed) != OUTBOX_OK) {
    snprintf(buf, sizeof buf, "<message of %zu bytes does not fit>", needed);
  }
  return buf;
}

/* Whether a RocketMQ name server listens on 127.0.0.1:9876 (tests that need the broker skip
 * themselves, with the reason, when none does). */
__attribute__((unused)) static bool namesrv_listening(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons(9876);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return ok;
}

static const char *db_url(void) {
  const char *u = getenv("OUTBOX_TEST_DB_URL");
  if (u == NULL || *u == '\0') {
    fprintf(stderr, "OUTBOX_TEST_DB_URL is not set (tests/c/run.sh sets it)\n");
    exit(2);
  }
  return u;
}

/* A conf on the test database, enqueue-only unless the test changes `publisher`. */
static outbox_conf *test_conf(void) {
  char err[512];
  outbox_conf *c = outbox_conf_new();
  if (c == NULL || outbox_conf_set(c, "db.url", db_url(), err, sizeof err) != OUTBOX_OK ||
      outbox_conf_set(c, "publisher", "none", err, sizeof err) != OUTBOX_OK) {
    fprintf(stderr, "could not build the test conf: %s\n", err);
    exit(2);
  }
  return c;
}

/* A started enqueue-only relay on the migrated test database. */
__attribute__((unused)) static outbox_relay *test_relay(void) {
  char err[512] = "";
  outbox_conf *c = test_conf();
  outbox_relay *r = NULL;
  if (outbox_migrate(c, err, sizeof err) != OUTBOX_OK ||
      outbox_start(c, &r, err, sizeof err) != OUTBOX_OK) {
    fprintf(stderr, "could not start the test relay: %s\n", err);
    exit(2);
  }
  return r;
}

typedef struct {
  const char *name;
  void (*fn)(void);
} h_test;

/* Runs every test, prints one line each and the closing "N passed, N failed" line. */
static int run_tests(const h_test *tests, size_t n, const char *filter) {
  int passed = 0, failed = 0, skipped = 0;
  for (size_t i = 0; i < n; i++) {
    if (filter != NULL && strstr(tests[i].name, filter) == NULL) continue;
    int before = h_checks_failed;
    h_skip = 0;
    tests[i].fn();
    if (h_checks_failed == before && h_skip) {
      printf("SKIP %s\n", tests[i].name);
      skipped++;
    } else if (h_checks_failed == before) {
      printf("ok   %s\n", tests[i].name);
      passed++;
    } else {
      printf("FAIL %s\n", tests[i].name);
      failed++;
    }
    fflush(stdout);
  }
  if (skipped)
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  else
    printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

#endif
