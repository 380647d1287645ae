/* Relaying through a real RocketMQ broker: an event committed through the C ABI ends SUCCESS.
 * Skipped (with the reason) unless a name server listens on 127.0.0.1:9876 and the library was
 * built with `--features rocketmq`. Built and run by tests/c/run.sh. */
#include <arpa/inet.h>
#include <pthread.h>
#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static int64_t count_status(outbox_relay *r, const char *biz_no, const char *status) {
  outbox_tx *tx = NULL;
  outbox_param ps[2] = {{0}, {0}};
  ps[0].kind = OUTBOX_PARAM_TEXT;
  ps[0].text = biz_no;
  ps[1].kind = OUTBOX_PARAM_TEXT;
  ps[1].text = status;
  int64_t v = -1;
  bool found = false;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_query_int64(
      tx, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ? AND status = ?", ps, 2, &v, &found));
  outbox_tx_free(tx);
  return v;
}

static void test_committed_event_is_published(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  outbox_conf *c = test_conf();
  char topic[64];
  snprintf(topic, sizeof topic, "outbox_c_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "topic", topic, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "scan.interval.ms", "100", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "10000", err, sizeof err));
  /* The row stays, SUCCESS, for this test to read (the default deletes it once sent). */
  CHECK_OK(outbox_conf_set(c, "sent.rows", "keep", err, sizeof err));
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  outbox_relay *r = NULL;
  outbox_result rc = outbox_start(c, &r, err, sizeof err);
  if (rc == OUTBOX_ERR_INVALID_VALUE && strstr(err, "publisher") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  if (r == NULL) {
    fprintf(stderr, "  start failed: %s\n", err);
    return;
  }
  static const uint8_t payload[] = "{\"order\":\"C-MQ-1\"}";
  outbox_event e = {0};
  e.biz_no = "C-MQ-1";
  e.event_type = "ORDER_CREATED";
  e.payload = payload;
  e.payload_len = sizeof payload - 1;
  outbox_tx *tx = NULL;
  uint64_t id = 0;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  CHECK_OK(outbox_tx_commit(tx)); /* wakes the relay */
  outbox_tx_free(tx);

  int64_t sent = 0;
  for (int i = 0; i < 600 && sent != 1; i++) { /* up to 60 s: the first send creates the route */
    usleep(100 * 1000);
    sent = count_status(r, "C-MQ-1", "SUCCESS");
  }
  CHECK(sent == 1);
  char stats[4096];
  size_t needed;
  CHECK_OK(outbox_stats(r, stats, sizeof stats, &needed));
  CHECK(strstr(stats, "\"sent\":1") != NULL);
  CHECK_OK(outbox_stop(r, 10000));
  outbox_free(r);
}

typedef struct {
  pthread_mutex_t mu;
  int calls;
  uint64_t id;
  uint32_t retry_count;
  char biz_no[64];
  char last_error[256];
} letters;

static void on_dead_letter(void *user_data, const outbox_dead_letter *d) {
  letters *l = user_data;
  pthread_mutex_lock(&l->mu);
  l->calls++;
  l->id = d->id;
  l->retry_count = d->retry_count;
  snprintf(l->biz_no, sizeof l->biz_no, "%s", d->biz_no);
  snprintf(l->last_error, sizeof l->last_error, "%s", d->last_error);
  pthread_mutex_unlock(&l->mu);
}

/* A 5 MiB incompressible message passes enqueue but the broker refuses it (maxMessageSize is
 * 4 MiB): with max.retry=0 it ends FAIL at once and the callback is called once. */
static void test_dead_letter_callback(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  static letters seen = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, "", ""};
  outbox_conf *c = test_conf();
  char topic[64];
  snprintf(topic, sizeof topic, "outbox_c_dl_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "topic", topic, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "scan.interval.ms", "100", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "10000", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "payload.max.bytes", "8388608", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "max.retry", "0", err, sizeof err));
  CHECK_OK(outbox_conf_set_dead_letter_cb(c, on_dead_letter, &seen));
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  outbox_relay *r = NULL;
  outbox_result rc = outbox_start(c, &r, err, sizeof err);
  if (rc == OUTBOX_ERR_INVALID_VALUE && strstr(err, "publisher") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  if (r == NULL) return;
  size_t big = 5 * 1024 * 1024;
  uint8_t *payload = malloc(big);
  /* Incompressible, so the client's body compression cannot bring it under the limit. */
  uint32_t x = 2463534242u;
  for (size_t i = 0; i < big; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    payload[i] = (uint8_t)x;
  }
  outbox_event e = {0};
  e.biz_no = "C-DL-1";
  e.event_type = "ORDER_CREATED";
  e.payload = payload;
  e.payload_len = big;
  outbox_tx *tx = NULL;
  uint64_t id = 0;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  free(payload); /* copied by enqueue */
  int calls = 0;
  for (int i = 0; i < 600 && calls == 0; i++) {
    usleep(100 * 1000);
    pthread_mutex_lock(&seen.mu);
    calls = seen.calls;
    pthread_mutex_unlock(&seen.mu);
  }
  CHECK_OK(outbox_stop(r, 10000));
  outbox_free(r); /* after it the callback is never called again */
  CHECK(seen.calls == 1);
  CHECK(seen.id == id);
  CHECK(seen.retry_count == 1);
  CHECK(strcmp(seen.biz_no, "C-DL-1") == 0);
  CHECK(strlen(seen.last_error) > 0);
  if (seen.calls != 1) fprintf(stderr, "  dead letters seen: %d\n", seen.calls);
}

/* A stop whose deadline has already passed returns the distinct timed-out result (the relay
 * threads are still ending); a later stop with time to spare waits for them and joins them;
 * after that, stop is a no-op. */
static void test_stop_past_its_deadline_times_out(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  outbox_relay *r = NULL;
  outbox_result rc = outbox_start(c, &r, err, sizeof err);
  if (rc == OUTBOX_ERR_INVALID_VALUE && strstr(err, "publisher") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  if (r == NULL) return;
  /* The scanner must end before the workers can: that takes longer than no time at all. */
  rc = outbox_stop(r, 0);
  CHECK_RC(rc, OUTBOX_ERR_TIMED_OUT);
  CHECK(!outbox_result_is_retriable(rc));
  CHECK(strstr(last_error(), "0 ms") != NULL);
  CHECK_OK(outbox_stop(r, 30000)); /* waits for the threads the first stop left running */
  CHECK_OK(outbox_stop(r, 0));     /* idempotent once they have ended */
  CHECK_RC(outbox_notify(r), OUTBOX_ERR_STOPPED);
  outbox_free(r);
}

int main(int argc, char **argv) {
  static const h_test tests[] = {
      {"committed_event_is_published", test_committed_event_is_published},
      {"dead_letter_callback", test_dead_letter_callback},
      {"stop_past_its_deadline_times_out", test_stop_past_its_deadline_times_out},
  };
  return run_tests(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
