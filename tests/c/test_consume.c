/* The consuming half over the C ABI: the inbox mark on a library-owned transaction, and a
 * consumer whose handler is a C callback crediting points in the consumer's transaction. The
 * consumer test is skipped (with the reason) unless a name server listens on 127.0.0.1:9876 and
 * the library was built with `--features rocketmq`. Built and run by tests/c/run.sh. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

static int64_t query_int(outbox_relay *r, const char *sql) {
  outbox_tx *tx = NULL;
  int64_t v = -1;
  bool found = false;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_query_int64(tx, sql, NULL, 0, &v, &found));
  outbox_tx_free(tx);
  return v;
}

static void test_inbox_mark_is_claim_first_and_a_duplicate_leaves_the_tx_usable(void) {
  outbox_relay *r = test_relay();
  outbox_tx *tx = NULL;
  bool is_new = false;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_inbox_mark(tx, NULL, "points", "key-1", "orders", 3, 42, "MSG1", &is_new));
  CHECK(is_new);
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);

  /* The same key again: a duplicate, and the transaction goes on. */
  CHECK_OK(outbox_tx_begin(r, &tx));
  is_new = true;
  CHECK_OK(outbox_inbox_mark(tx, "outbox_inbox", "points", "key-1", NULL, -1, -1, NULL, &is_new));
  CHECK(!is_new);
  uint64_t affected = 0;
  CHECK_OK(outbox_tx_execute(tx, "CREATE TEMPORARY TABLE t_c (x INT)", NULL, 0, &affected, NULL));
  /* Another group has its own marks. */
  CHECK_OK(outbox_inbox_mark(tx, NULL, "billing", "key-1", NULL, -1, -1, NULL, &is_new));
  CHECK(is_new);
  CHECK_OK(outbox_tx_rollback(tx));
  outbox_tx_free(tx);
  CHECK(query_int(r, "SELECT COUNT(*) FROM outbox_inbox") == 1);
  CHECK(query_int(r, "SELECT queue_offset FROM outbox_inbox WHERE consumer_group = 'points'") == 42);

  /* Bad input: refused naming the field, nothing written. */
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_RC(outbox_inbox_mark(tx, NULL, "points group", "k", NULL, -1, -1, NULL, &is_new),
           OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(last_error(), "consumer_group") != NULL);
  CHECK_RC(outbox_inbox_mark(tx, NULL, "points", "", NULL, -1, -1, NULL, &is_new),
           OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(last_error(), "event_key") != NULL);
  CHECK_RC(outbox_inbox_mark(tx, "inbox; DROP TABLE x", "points", "k", NULL, -1, -1, NULL, &is_new),
           OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(last_error(), "inbox.table") != NULL);
  CHECK_RC(outbox_inbox_mark(tx, NULL, NULL, "k", NULL, -1, -1, NULL, &is_new), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_inbox_mark(tx, NULL, "points", "k", NULL, -1, -1, NULL, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  outbox_tx_free(tx);
  CHECK(query_int(r, "SELECT COUNT(*) FROM outbox_inbox") == 1);
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

typedef struct {
  pthread_mutex_t mu;
  int calls;
  int commit_refused;
  int fail_first; /* the first call for ORD-3 fails */
} points_ctx;

/* The points service: credits the order in the consumer's transaction. */
static int credit(void *user_data, outbox_tx *tx, const outbox_message *m, char *err, size_t err_size) {
  points_ctx *ctx = user_data;
  pthread_mutex_lock(&ctx->mu);
  ctx->calls++;
  bool fail = false;
  if (strstr(m->properties_json, "\"bizNo\":\"ORD-3\"") != NULL && ctx->fail_first) {
    ctx->fail_first = 0;
    fail = true;
  }
  pthread_mutex_unlock(&ctx->mu);
  /* Only the consumer ends its transaction. */
  if (outbox_tx_commit(tx) == OUTBOX_ERR_INVALID_ARGUMENT) {
    pthread_mutex_lock(&ctx->mu);
    ctx->commit_refused++;
    pthread_mutex_unlock(&ctx->mu);
  }
  outbox_param ps[2] = {{0}, {0}};
  ps[0].kind = OUTBOX_PARAM_TEXT;
  ps[0].text = m->key;
  ps[1].kind = OUTBOX_PARAM_BYTES;
  ps[1].bytes = m->body;
  ps[1].bytes_len = m->body_len;
  uint64_t affected = 0;
  if (outbox_tx_execute(tx, "INSERT INTO credits (event_key, body) VALUES (?, ?)", ps, 2, &affected, NULL) !=
      OUTBOX_OK) {
    snprintf(err, err_size, "insert failed: %s", last_error());
    return 1;
  }
  if (fail) {
    snprintf(err, err_size, "points ledger busy");
    return 7; /* rolled back with the credit above, retried */
  }
  return 0;
}

static bool stats_field(outbox_consumer *c, const char *field, long *out) {
  char buf[1024];
  size_t needed = 0;
  if (outbox_consumer_stats(c, buf, sizeof buf, &needed) != OUTBOX_OK) return false;
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", field);
  const char *p = strstr(buf, pat);
  if (p == NULL) return false;
  *out = strtol(p + strlen(pat), NULL, 10);
  return true;
}

static void test_consumer_credits_each_order_once_in_its_transaction(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  outbox_conf *c = test_conf();
  char topic[64], group[64];
  snprintf(topic, sizeof topic, "outbox_cc_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  snprintf(group, sizeof group, "points_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "topic", topic, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "10000", err, sizeof err));
  CHECK_OK(outbox_migrate(c, err, sizeof err));

  points_ctx ctx = {.calls = 0, .commit_refused = 0, .fail_first = 1};
  pthread_mutex_init(&ctx.mu, NULL);
  outbox_consumer *consumer = NULL;
  outbox_result rc = outbox_consumer_start(c, topic, group, credit, &ctx, &consumer, err, sizeof err);
  if (rc == OUTBOX_ERR_PUBLISHER && strstr(err, "rocketmq feature") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    outbox_conf_free(c);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  if (consumer == NULL) {
    fprintf(stderr, "  consumer start failed: %s\n", err);
    outbox_conf_free(c);
    return;
  }
  outbox_relay *r = NULL;
  CHECK_OK(outbox_start(c, &r, err, sizeof err)); /* takes c */
  if (r == NULL) {
    outbox_consumer_free(consumer);
    return;
  }
  uint64_t affected = 0;
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_execute(tx, "CREATE TABLE credits (event_key VARCHAR(64) PRIMARY KEY, body BLOB)", NULL, 0,
                             &affected, NULL));
  for (int i = 1; i <= 5; i++) {
    char biz[16], body[64];
    snprintf(biz, sizeof biz, "ORD-%d", i);
    snprintf(body, sizeof body, "{\"order\":\"%s\",\"points\":%d}", biz, 10 * i);
    outbox_event e = {0};
    e.biz_no = biz;
    e.event_type = "ORDER_PAID";
    e.payload = (const uint8_t *)body;
    e.payload_len = strlen(body);
    uint64_t id = 0;
    CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  }
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);

  long processed = 0;
  for (int i = 0; i < 900 && processed < 5; i++) { /* up to 90 s: routes and the first rebalance */
    usleep(100 * 1000);
    stats_field(consumer, "processed", &processed);
  }
  CHECK(processed == 5);
  long failed = -1;
  CHECK(stats_field(consumer, "failed_attempts", &failed) && failed == 1);
  CHECK(query_int(r, "SELECT COUNT(*) FROM credits") == 5);
  char marks_sql[160];
  snprintf(marks_sql, sizeof marks_sql, "SELECT COUNT(*) FROM outbox_inbox WHERE consumer_group = '%s'", group);
  CHECK(query_int(r, marks_sql) == 5);
  CHECK(query_int(r, "SELECT COUNT(*) FROM credits c JOIN t_event_record e ON e.event_key = c.event_key") == 5);
  pthread_mutex_lock(&ctx.mu);
  CHECK(ctx.calls == 6);
  CHECK(ctx.commit_refused == 6);
  pthread_mutex_unlock(&ctx.mu);
  CHECK_OK(outbox_consumer_stop(consumer));
  CHECK_RC(outbox_consumer_stop(consumer), OUTBOX_ERR_STOPPED);
  char buf[64];
  size_t needed = 0;
  CHECK_RC(outbox_consumer_stats(consumer, buf, sizeof buf, &needed), OUTBOX_ERR_STOPPED);
  outbox_consumer_free(consumer);
  CHECK_OK(outbox_stop(r, 10000));
  outbox_free(r);
  pthread_mutex_destroy(&ctx.mu);
}

static void test_consumer_start_refuses_bad_arguments(void) {
  char err[512] = "";
  outbox_conf *c = test_conf();
  outbox_consumer *consumer = NULL;
  CHECK_RC(outbox_consumer_start(c, "orders", "points", NULL, NULL, &consumer, err, sizeof err),
           OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(strstr(err, "handler") != NULL);
  CHECK_RC(outbox_consumer_start(NULL, "orders", "points", credit, NULL, &consumer, err, sizeof err),
           OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_consumer_start(c, "orders", "points", credit, NULL, NULL, err, sizeof err),
           OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(consumer == NULL);
  outbox_consumer_free(NULL);
  outbox_conf_free(c);
}

int main(int argc, char **argv) {
  static const h_test tests[] = {
      {"inbox_mark_is_claim_first_and_a_duplicate_leaves_the_tx_usable",
       test_inbox_mark_is_claim_first_and_a_duplicate_leaves_the_tx_usable},
      {"consumer_credits_each_order_once_in_its_transaction", test_consumer_credits_each_order_once_in_its_transaction},
      {"consumer_start_refuses_bad_arguments", test_consumer_start_refuses_bad_arguments},
  };
  return run_tests(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
