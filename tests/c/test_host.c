/* Host integration of the C ABI: the log callback and level, errors that are and are not worth
 * retrying (access denied, unknown database), the bounded pool wait of outbox_tx_begin, and the
 * commit -> broker-ack latency in the stats. Run by tests/c/run.sh. */
#include <pthread.h>

#include "harness.h"

/* ---- a log callback that keeps what it receives ------------------------------------------- */

#define MAX_RECORDS 256

typedef struct {
  pthread_mutex_t lock;
  int n;
  outbox_log_level level[MAX_RECORDS];
  char target[MAX_RECORDS][64];
  char message[MAX_RECORDS][256];
  int reentry_rc;
} log_sink;

static log_sink sink = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void on_log(outbox_log_level level, const char *target, const char *message, void *user_data) {
  log_sink *s = (log_sink *)user_data;
  pthread_mutex_lock(&s->lock);
  if (s->n < MAX_RECORDS) {
    s->level[s->n] = level;
    snprintf(s->target[s->n], sizeof s->target[s->n], "%s", target);
    snprintf(s->message[s->n], sizeof s->message[s->n], "%s", message);
    s->n++;
  }
  pthread_mutex_unlock(&s->lock);
}

/* Tries to replace the callback from inside it: refused, no deadlock. */
static void on_log_reentrant(outbox_log_level level, const char *target, const char *message,
                             void *user_data) {
  log_sink *s = (log_sink *)user_data;
  (void)level;
  (void)target;
  (void)message;
  s->reentry_rc = (int)outbox_set_log_callback(NULL, NULL);
}

static void sink_reset(void) {
  pthread_mutex_lock(&sink.lock);
  sink.n = 0;
  sink.reentry_rc = -1;
  pthread_mutex_unlock(&sink.lock);
}

/* Index of the first record whose target is `target` and whose message contains `text`, or -1. */
static int sink_find(const char *target, const char *text) {
  int found = -1;
  pthread_mutex_lock(&sink.lock);
  for (int i = 0; i < sink.n && found < 0; i++) {
    if (strcmp(sink.target[i], target) == 0 && strstr(sink.message[i], text) != NULL) found = i;
  }
  pthread_mutex_unlock(&sink.lock);
  return found;
}

static void stop_and_free(outbox_relay *r) {
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void test_log_callback_receives_start_records_with_level_and_target(void) {
  sink_reset();
  CHECK_OK(outbox_set_log_callback(on_log, &sink));
  CHECK(outbox_get_log_level() == OUTBOX_LOG_INFO); /* the default */
  outbox_conf *c = test_conf();
  char err[512];
  CHECK_OK(outbox_conf_set(c, "service.name", "clogtest", err, sizeof err));
  outbox_relay *r = NULL;
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  CHECK_OK(outbox_start(c, &r, err, sizeof err));
  /* Logged by outbox_start on this thread, before it returned. */
  int i = sink_find("outbox::relay", "enqueue-only");
  CHECK(i >= 0);
  if (i >= 0) {
    CHECK(sink.level[i] == OUTBOX_LOG_INFO);
    CHECK(strstr(sink.message[i], "clogtest-") != NULL);
  }
  stop_and_free(r);
  CHECK_OK(outbox_set_log_callback(NULL, NULL)); /* back to stderr */
}

static void test_log_level_threshold_and_key(void) {
  sink_reset();
  CHECK_OK(outbox_set_log_callback(on_log, &sink));
  CHECK_OK(outbox_set_log_level(OUTBOX_LOG_OFF));
  CHECK(outbox_get_log_level() == OUTBOX_LOG_OFF);
  outbox_relay *r = test_relay();
  CHECK(sink_find("outbox::relay", "enqueue-only") < 0);
  stop_and_free(r);

  /* The key applies at start. */
  CHECK_OK(outbox_set_log_level(OUTBOX_LOG_INFO));
  char err[512];
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_conf_set(c, "log.level", "warn", err, sizeof err));
  CHECK_RC(outbox_conf_set(c, "log.level", "loud", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "log.level") != NULL);
  CHECK_OK(outbox_start(c, &r, err, sizeof err));
  CHECK(outbox_get_log_level() == OUTBOX_LOG_WARN);
  CHECK(sink_find("outbox::relay", "enqueue-only") < 0);
  stop_and_free(r);

  CHECK_RC(outbox_set_log_level(6), OUTBOX_ERR_INVALID_ARGUMENT);
  CHECK_RC(outbox_set_log_level(-1), OUTBOX_ERR_INVALID_ARGUMENT);
  CHECK_OK(outbox_set_log_level(OUTBOX_LOG_INFO));
  CHECK_OK(outbox_set_log_callback(NULL, NULL));
}

static void test_log_callback_cannot_be_replaced_from_inside_itself(void) {
  sink_reset();
  CHECK_OK(outbox_set_log_callback(on_log_reentrant, &sink));
  outbox_relay *r = test_relay();
  CHECK(sink.reentry_rc == OUTBOX_ERR_INVALID_ARGUMENT);
  stop_and_free(r);
  CHECK_OK(outbox_set_log_callback(NULL, NULL));
}

static void replace_url_user(char *out, size_t size, const char *user) {
  const char *at = strchr(db_url(), '@');
  snprintf(out, size, "mysql://%s%s", user, at);
}

static void test_access_denied_and_unknown_database_are_not_retriable(void) {
  char err[512], url[512];
  outbox_relay *r = (outbox_relay *)0x1;

  outbox_conf *c = test_conf();
  replace_url_user(url, sizeof url, "outbox_nobody:wrong");
  CHECK_OK(outbox_conf_set(c, "db.url", url, err, sizeof err));
  outbox_result rc = outbox_start(c, &r, err, sizeof err);
  CHECK_RC(rc, OUTBOX_ERR_DATABASE_REFUSED);
  CHECK(!outbox_result_is_retriable(rc));
  CHECK(strstr(err, "access denied") != NULL && strstr(err, "1045") != NULL);
  CHECK(strstr(err, "MySqlError") == NULL);
  CHECK(strstr(err, "wrong") == NULL); /* no password in the message */

  c = test_conf();
  snprintf(url, sizeof url, "%s_missing", db_url());
  CHECK_OK(outbox_conf_set(c, "db.url", url, err, sizeof err));
  rc = outbox_start(c, &r, err, sizeof err);
  CHECK_RC(rc, OUTBOX_ERR_DATABASE_REFUSED);
  CHECK(!outbox_result_is_retriable(rc));
  CHECK(strstr(err, "unknown database") != NULL && strstr(err, "1049") != NULL);
  CHECK(r == (outbox_relay *)0x1);

  /* A URL the library cannot parse: words, not the parser's debug text. */
  c = outbox_conf_new();
  CHECK_RC(outbox_conf_set(c, "db.url", "mysql://root@127.0.0.1:99999/x", err, sizeof err),
           OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "ParseError {") == NULL && strstr(err, "port") != NULL);
  outbox_conf_free(c);

  CHECK(outbox_result_is_retriable(OUTBOX_ERR_POOL_TIMEOUT));
  CHECK(OUTBOX_ERR_DATABASE_REFUSED == 16 && OUTBOX_ERR_POOL_TIMEOUT == 17 && OUTBOX_ERR_RESOURCE == 18);
  /* A thread that could not be started is not a broker hiccup to retry. */
  CHECK(!outbox_result_is_retriable(OUTBOX_ERR_RESOURCE));
  CHECK(strstr(outbox_result_str(OUTBOX_ERR_RESOURCE), "thread") != NULL);
}

static void test_tx_begin_waits_for_the_pool_boundedly(void) {
  char err[512];
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "db.pool.max", "1", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "db.pool.wait.ms", "200", err, sizeof err));
  outbox_relay *r = NULL;
  CHECK_OK(outbox_start(c, &r, err, sizeof err));
  outbox_tx *held = NULL, *second = (outbox_tx *)0x1;
  CHECK_OK(outbox_tx_begin(r, &held));
  outbox_result rc = outbox_tx_begin(r, &second);
  CHECK_RC(rc, OUTBOX_ERR_POOL_TIMEOUT);
  CHECK(outbox_result_is_retriable(rc));
  CHECK(strstr(last_error(), "db.pool.max") != NULL);
  CHECK(second == (outbox_tx *)0x1);
  /* Once the connection is back, begin succeeds. */
  CHECK_OK(outbox_tx_rollback(held));
  outbox_tx_free(held);
  second = NULL;
  CHECK_OK(outbox_tx_begin(r, &second));
  outbox_tx_free(second);
  stop_and_free(r);
}

static void test_stats_carry_latency(void) {
  outbox_relay *r = test_relay();
  char buf[4096];
  size_t needed = 0;
  CHECK_OK(outbox_stats(r, buf, sizeof buf, &needed));
  CHECK(strstr(buf, "\"latency\":{") != NULL);
  CHECK(strstr(buf, "\"count\":0") != NULL);
  stop_and_free(r);
}

int main(int argc, char **argv) {
  static const h_test tests[] = {
      {"log_callback_receives_start_records_with_level_and_target",
       test_log_callback_receives_start_records_with_level_and_target},
      {"log_level_threshold_and_key", test_log_level_threshold_and_key},
      {"log_callback_cannot_be_replaced_from_inside_itself",
       test_log_callback_cannot_be_replaced_from_inside_itself},
      {"access_denied_and_unknown_database_are_not_retriable",
       test_access_denied_and_unknown_database_are_not_retriable},
      {"tx_begin_waits_for_the_pool_boundedly", test_tx_begin_waits_for_the_pool_boundedly},
      {"stats_carry_latency", test_stats_carry_latency},
  };
  return run_tests(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
