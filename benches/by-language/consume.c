/* The C consumer of benches/by-language.sh: the points handler the Go and Java benches run
 * (bindings/go/tests/bench_test.go BenchmarkConsumerCrossings, bindings/java/.../ConsumerBench),
 * through the C ABI. Relays N events (a userId header over 200 users) onto a topic of its own,
 * waits until they are all sent, then reads them twice with outbox_consumer_start (a
 * per-message handler, the consumer's defaults), a group of its own each time, and prints the
 * rate of each: the first message processed to the last.
 *
 *   OUTBOX_TEST_DB_URL=mysql://root@127.0.0.1:3306/<db> ./consume [N]
 *
 * The handler credits the order (one INSERT) and upserts its user's row (one INSERT ... ON
 * DUPLICATE KEY UPDATE), both in the consumer's transaction. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "outbox.h"

static const char *prefix; /* the current run's, so each run credits rows of its own */

static void die(const char *what, const char *err) {
  fprintf(stderr, "consume: %s: %s\n", what, err);
  exit(1);
}

/* The calling thread's last error message. */
static const char *last_error(void) {
  static char buf[1024];
  size_t needed = 0;
  if (outbox_last_error(buf, sizeof buf, &needed) != OUTBOX_OK) snprintf(buf, sizeof buf, "(unknown)");
  return buf;
}

/* The value of "name":"..." in a JSON object of strings (no escapes in these values). */
static int property(const char *json, const char *name, char *out, size_t size) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":\"", name);
  const char *p = strstr(json, pat);
  if (p == NULL) return 0;
  p += strlen(pat);
  const char *end = strchr(p, '"');
  if (end == NULL || (size_t)(end - p) >= size) return 0;
  memcpy(out, p, (size_t)(end - p));
  out[end - p] = 0;
  return 1;
}

static int credit(void *user_data, outbox_tx *tx, const outbox_message *m, char *err, size_t err_size) {
  (void)user_data;
  char biz[80], user[80], key[200];
  if (!property(m->properties_json, "bizNo", biz, sizeof biz) ||
      !property(m->properties_json, "userId", user, sizeof user)) {
    snprintf(err, err_size, "no bizNo or userId in %s", m->properties_json);
    return 1;
  }
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_TEXT;
  uint64_t affected = 0;
  snprintf(key, sizeof key, "%s%s", prefix, biz);
  p.text = key;
  if (outbox_tx_execute(tx, "INSERT INTO credits (order_no, n) VALUES (?, 1)", &p, 1, &affected, NULL) != OUTBOX_OK)
    return 2; /* a transient failure makes the call transient (the library's rule) */
  snprintf(key, sizeof key, "%suser-%s", prefix, user);
  p.text = key;
  if (outbox_tx_execute(tx, "INSERT INTO credits (order_no, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1", &p,
                        1, &affected, NULL) != OUTBOX_OK)
    return 2;
  return 0;
}

static long stat_of(outbox_consumer *c, const char *field) {
  char buf[2048], pat[64];
  size_t needed = 0;
  if (outbox_consumer_stats(c, buf, sizeof buf, &needed) != OUTBOX_OK) return -1;
  snprintf(pat, sizeof pat, "\"%s\":", field);
  const char *p = strstr(buf, pat);
  return p == NULL ? -1 : strtol(p + strlen(pat), NULL, 10);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static outbox_conf *conf(const char *url, const char *topic) {
  char err[512];
  outbox_conf *c = outbox_conf_new();
  const char *kv[][2] = {{"db.url", url},         {"publisher", "rocketmq"}, {"rocketmq.namesrv", "127.0.0.1:9876"},
                         {"topic", topic},        {"sent.rows", "keep"},     {"send.timeout.ms", "10000"}};
  for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
    if (outbox_conf_set(c, kv[i][0], kv[i][1], err, sizeof err) != OUTBOX_OK) die(kv[i][0], err);
  return c;
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20000;
  const char *url = getenv("OUTBOX_TEST_DB_URL");
  if (url == NULL || n <= 0) die("usage", "OUTBOX_TEST_DB_URL=mysql://.../db ./consume [N]");
  char topic[64], err[512];
  snprintf(topic, sizeof topic, "OUTBOX_CBENCH_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  outbox_conf *c = conf(url, topic);
  if (outbox_migrate(c, err, sizeof err) != OUTBOX_OK) die("migrate", err);
  outbox_relay *r = NULL;
  if (outbox_start(c, &r, err, sizeof err) != OUTBOX_OK) die("start", err); /* takes c */
  outbox_tx *tx = NULL;
  uint64_t affected = 0, id = 0;
  if (outbox_tx_begin(r, &tx) != OUTBOX_OK) die("begin", last_error());
  if (outbox_tx_execute(tx, "CREATE TABLE credits (order_no VARCHAR(64) PRIMARY KEY, n INT NOT NULL)", NULL, 0,
                        &affected, NULL) != OUTBOX_OK)
    die("create credits", last_error());
  for (int i = 0; i < n; i++) {
    char biz[32], user[16], body[64];
    snprintf(biz, sizeof biz, "ORD-%d", i);
    snprintf(user, sizeof user, "u%d", i % 200);
    snprintf(body, sizeof body, "{\"order\":\"%s\"}", biz);
    outbox_header h = {"userId", user};
    outbox_event e = {.biz_no = biz, .event_type = "ORDER_PAID", .payload = (const uint8_t *)body,
                      .payload_len = strlen(body), .headers = &h, .headers_len = 1};
    if (outbox_enqueue_in_tx(tx, &e, &id) != OUTBOX_OK) die("enqueue", last_error());
  }
  if (outbox_tx_commit(tx) != OUTBOX_OK) die("commit", last_error());
  outbox_tx_free(tx);
  for (;;) { /* every event on the topic before the consumers start */
    outbox_tx *q = NULL;
    int64_t left = -1;
    bool found = false;
    if (outbox_tx_begin(r, &q) != OUTBOX_OK ||
        outbox_tx_query_int64(q, "SELECT COUNT(*) FROM t_event_record WHERE status <> 'SUCCESS'", NULL, 0, &left,
                              &found) != OUTBOX_OK)
      die("count", last_error());
    outbox_tx_free(q);
    if (left == 0) break;
    usleep(100 * 1000);
  }
  /* The relay's work is done: the consumers run alone, as in the Go and Java benches. */
  if (outbox_stop(r, 10000) != OUTBOX_OK) die("stop", last_error());
  const char *prefixes[] = {"g0-", "g1-"};
  for (int k = 0; k < 2; k++) {
    prefix = prefixes[k];
    char group[64];
    snprintf(group, sizeof group, "cbench_%d_%lx_%d", k, (unsigned long)time(NULL), (int)getpid());
    outbox_consumer *consumer = NULL;
    outbox_conf *cc = conf(url, topic);
    if (outbox_consumer_start(cc, topic, group, credit, NULL, &consumer, err, sizeof err) != OUTBOX_OK)
      die("consumer start", err);
    double t0 = 0;
    for (;;) {
      long done = stat_of(consumer, "processed"), dup = stat_of(consumer, "duplicates");
      if (done > 0 && t0 == 0) t0 = now();
      if (done + dup >= n) break;
      usleep(10 * 1000);
    }
    double rate = n / (now() - t0);
    long transactions = stat_of(consumer, "transactions");
    outbox_consumer_stop(consumer);
    outbox_consumer_free(consumer);
    outbox_conf_free(cc);
    printf("  %-12s %8.0f msg/s  (%ld transactions)\n", "start", rate, transactions);
    fflush(stdout);
  }
  outbox_free(r);
  return 0;
}
