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
  /* The sent rows stay, for the credits to be joined to them by their event keys. */
  CHECK_OK(outbox_conf_set(c, "sent.rows", "keep", err, sizeof err));
  /* One message per transaction: this test counts every call of the handler. */
  CHECK_OK(outbox_conf_set(c, "consumer.batch.max", "1", err, sizeof err));
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
  /* The final counts stay readable after the stop. */
  char buf[1024];
  size_t needed = 0;
  CHECK_OK(outbox_consumer_stats(consumer, buf, sizeof buf, &needed));
  CHECK(strstr(buf, "\"stopped\":true") != NULL);
  CHECK(stats_field(consumer, "processed", &processed) && processed == 5);
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

/* Every consumer setting is a key of the conf, checked like the relay's. */
static void test_consumer_keys_are_checked_like_the_relay_s(void) {
  char err[512] = "";
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_conf_set(c, "consumer.threads", "2", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.batch.max", "256", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.max.attempts", "7", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.backoff.initial.ms", "50", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.inbox", "true", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.start.from", "last", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "inbox.table", "points_inbox", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "inbox.retention.ms", "0", err, sizeof err));
  CHECK_RC(outbox_conf_set(c, "consumer.batch.max", "0", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "consumer.batch.max") != NULL && strstr(err, "0") != NULL);
  CHECK_RC(outbox_conf_set(c, "consumer.batch.max", "100000", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "100000") != NULL);
  CHECK_RC(outbox_conf_set(c, "consumer.threads", "0", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK_RC(outbox_conf_set(c, "consumer.start.from", "middle", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "middle") != NULL);
  CHECK_RC(outbox_conf_set(c, "inbox.retention.ms", "1000", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "inbox.retention.ms") != NULL);
  CHECK_RC(outbox_conf_set(c, "inbox.table", "x; DROP TABLE y", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK_RC(outbox_conf_set(c, "consumer.no.such.key", "1", err, sizeof err), OUTBOX_ERR_UNKNOWN_KEY);
  CHECK(strstr(err, "consumer.no.such.key") != NULL);
  /* A NULL batch callback is refused naming it. */
  outbox_consumer *consumer = NULL;
  CHECK_RC(outbox_consumer_start_batch(c, "orders", "points", NULL, NULL, &consumer, err, sizeof err),
           OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(strstr(err, "handler") != NULL);
  CHECK(consumer == NULL);
  outbox_conf_free(c);
}

static int never_called(void *user_data, outbox_tx *tx, const outbox_message *m, size_t n, char *err,
                        size_t err_size) {
  (void)user_data, (void)tx, (void)m, (void)n, (void)err, (void)err_size;
  return 0;
}

/* A database without the inbox tables fails the start at once, naming the table, before the
 * consumer joins its group. */
static void test_consumer_start_fails_at_once_without_the_inbox_table(void) {
  char err[512] = "";
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "inbox.table", "no_such_inbox", err, sizeof err));
  outbox_consumer *consumer = NULL;
  outbox_result rc = outbox_consumer_start_batch(c, "orders", "points", never_called, NULL, &consumer, err, sizeof err);
  if (rc == OUTBOX_ERR_PUBLISHER && strstr(err, "rocketmq feature") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    outbox_conf_free(c);
    return;
  }
  CHECK(rc != OUTBOX_OK);
  CHECK(strstr(err, "no_such_inbox") != NULL);
  CHECK(consumer == NULL);
  outbox_conf_free(c);
}

typedef struct {
  pthread_mutex_t mu;
  int calls;
  size_t largest_batch;
  int messages;
  int transient_failures;
  int commit_refused;
} batch_ctx;

/* A batch handler crediting each order through the consumer's transaction. ORD-7's credit also
 * updates a row the test holds locked (lock wait timeout 1 s): it fails with a transient error
 * until the test lets go, and the handler returns 1 then, not a result code. */
static int credit_batch(void *user_data, outbox_tx *tx, const outbox_message *ms, size_t n, char *err,
                        size_t err_size) {
  batch_ctx *ctx = user_data;
  pthread_mutex_lock(&ctx->mu);
  ctx->calls++;
  if (n > ctx->largest_batch) ctx->largest_batch = n;
  pthread_mutex_unlock(&ctx->mu);
  uint64_t affected = 0;
  if (outbox_tx_execute(tx, "COMMIT", NULL, 0, &affected, NULL) == OUTBOX_ERR_INVALID_ARGUMENT &&
      strstr(last_error(), "COMMIT") != NULL) {
    pthread_mutex_lock(&ctx->mu);
    ctx->commit_refused++;
    pthread_mutex_unlock(&ctx->mu);
  }
  for (size_t i = 0; i < n; i++) {
    if (strstr(ms[i].properties_json, "\"bizNo\":\"ORD-7\"") != NULL) {
      CHECK_OK(outbox_tx_execute(tx, "SET SESSION innodb_lock_wait_timeout = 1", NULL, 0, &affected, NULL));
      outbox_result rc = outbox_tx_execute(tx, "UPDATE lockme SET n = n + 1 WHERE id = 1", NULL, 0, &affected, NULL);
      if (rc != OUTBOX_OK) {
        CHECK(rc == OUTBOX_ERR_DATABASE);
        pthread_mutex_lock(&ctx->mu);
        ctx->transient_failures++;
        pthread_mutex_unlock(&ctx->mu);
        snprintf(err, err_size, "lockme busy: %s", last_error());
        return 1;
      }
    }
    outbox_param p = {0};
    p.kind = OUTBOX_PARAM_TEXT;
    p.text = ms[i].key;
    if (outbox_tx_execute(tx, "INSERT INTO credits_b (event_key) VALUES (?)", &p, 1, &affected, NULL) != OUTBOX_OK) {
      snprintf(err, err_size, "insert failed: %s", last_error());
      return 2;
    }
  }
  pthread_mutex_lock(&ctx->mu);
  ctx->messages += (int)n;
  pthread_mutex_unlock(&ctx->mu);
  return 0;
}

/* Batches by default; a lock wait timeout inside the handler is retried without using an
 * attempt (it used all of them and parked the message before); a handler cannot commit the
 * consumer's transaction. */
static void test_consumer_batches_and_retries_a_lock_wait_without_an_attempt(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  outbox_conf *c = test_conf();
  char topic[64], group[64];
  snprintf(topic, sizeof topic, "outbox_cb_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  snprintf(group, sizeof group, "points_b_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "topic", topic, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "10000", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.max.attempts", "2", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.backoff.initial.ms", "50", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.backoff.max.ms", "200", err, sizeof err));
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  batch_ctx ctx = {0};
  pthread_mutex_init(&ctx.mu, NULL);
  outbox_consumer *consumer = NULL;
  outbox_result rc = outbox_consumer_start_batch(c, topic, group, credit_batch, &ctx, &consumer, err, sizeof err);
  if (rc == OUTBOX_ERR_PUBLISHER && strstr(err, "rocketmq feature") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    outbox_conf_free(c);
    pthread_mutex_destroy(&ctx.mu);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  outbox_relay *r = NULL;
  CHECK_OK(outbox_start(c, &r, err, sizeof err)); /* takes c */
  if (consumer == NULL || r == NULL) {
    if (consumer != NULL) outbox_consumer_free(consumer);
    if (r != NULL) outbox_free(r);
    pthread_mutex_destroy(&ctx.mu);
    return;
  }
  uint64_t affected = 0;
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_execute(tx, "CREATE TABLE credits_b (event_key VARCHAR(64) PRIMARY KEY)", NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_execute(tx, "CREATE TABLE lockme (id INT PRIMARY KEY, n INT)", NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_execute(tx, "INSERT INTO lockme VALUES (1, 0)", NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  /* Hold the row ORD-7's credit needs. */
  outbox_tx *lock = NULL;
  int64_t v = 0;
  bool found = false;
  CHECK_OK(outbox_tx_begin(r, &lock));
  CHECK_OK(outbox_tx_query_int64(lock, "SELECT n FROM lockme WHERE id = 1 FOR UPDATE", NULL, 0, &v, &found));
  CHECK_OK(outbox_tx_begin(r, &tx));
  for (int i = 1; i <= 30; i++) {
    char biz[16], body[64];
    snprintf(biz, sizeof biz, "ORD-%d", i);
    snprintf(body, sizeof body, "{\"order\":\"%s\"}", biz);
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
  /* Let go once ORD-7 failed on the lock more times than the attempts allowed. */
  int failures = 0;
  for (int i = 0; i < 900 && failures < 3; i++) {
    usleep(100 * 1000);
    pthread_mutex_lock(&ctx.mu);
    failures = ctx.transient_failures;
    pthread_mutex_unlock(&ctx.mu);
  }
  CHECK(failures >= 3);
  CHECK_OK(outbox_tx_rollback(lock));
  outbox_tx_free(lock);
  long processed = 0;
  for (int i = 0; i < 900 && processed < 30; i++) {
    usleep(100 * 1000);
    stats_field(consumer, "processed", &processed);
  }
  CHECK(processed == 30);
  long failed = -1, dead = -1, db_errors = -1, fallbacks = -1, retries = -1, transactions = -1;
  CHECK(stats_field(consumer, "failed_attempts", &failed) && failed == 0);
  CHECK(stats_field(consumer, "dead_lettered", &dead) && dead == 0);
  /* Each failure was a batch run again as a batch (a lock conflict), a batch handled again one
     at a time, or a transient retry of one message. */
  CHECK(stats_field(consumer, "db_errors", &db_errors) && stats_field(consumer, "batch_fallbacks", &fallbacks));
  CHECK(stats_field(consumer, "batch_retries", &retries) && retries >= 1);
  pthread_mutex_lock(&ctx.mu);
  CHECK(db_errors + fallbacks + retries == ctx.transient_failures);
  pthread_mutex_unlock(&ctx.mu);
  CHECK(stats_field(consumer, "transactions", &transactions) && transactions >= 1);
  CHECK(query_int(r, "SELECT COUNT(*) FROM credits_b") == 30);
  CHECK(query_int(r, "SELECT n FROM lockme WHERE id = 1") == 1);
  pthread_mutex_lock(&ctx.mu);
  CHECK(ctx.commit_refused == ctx.calls);
  pthread_mutex_unlock(&ctx.mu);
  CHECK_OK(outbox_consumer_stop(consumer));
  outbox_consumer_free(consumer);
  CHECK_OK(outbox_stop(r, 10000));
  outbox_free(r);
  pthread_mutex_destroy(&ctx.mu);
}

/* A database that only consumes: outbox_migrate_consumer creates the inbox and dead-letter tables
 * and none of the relay's, then has nothing to do; bad arguments are refused. */
static void test_consumer_migration_creates_the_consumer_s_tables_alone(void) {
  char err[512] = "";
  outbox_relay *r = test_relay();
  char name[64], sql[512], url[512];
  snprintf(name, sizeof name, "outbox_c_mig_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  uint64_t affected = 0;
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  snprintf(sql, sizeof sql, "CREATE DATABASE %s", name);
  CHECK_OK(outbox_tx_execute(tx, sql, NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  const char *base = db_url();
  const char *slash = strrchr(base, '/');
  snprintf(url, sizeof url, "%.*s/%s", (int)(slash - base), base, name);
  outbox_conf *c = outbox_conf_new();
  CHECK_OK(outbox_conf_set(c, "db.url", url, err, sizeof err));
  CHECK_OK(outbox_migrate_consumer(c, err, sizeof err));
  CHECK_OK(outbox_migrate_consumer(c, err, sizeof err)); /* nothing to do */
  outbox_conf_free(c);
  snprintf(sql, sizeof sql,
           "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '%s' AND TABLE_NAME IN "
           "('outbox_inbox', 'outbox_inbox_dead_letter', 'outbox_schema_history')",
           name);
  CHECK(query_int(r, sql) == 3);
  snprintf(sql, sizeof sql, "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = '%s'", name);
  CHECK(query_int(r, sql) == 3);
  outbox_conf *empty = outbox_conf_new();
  CHECK_RC(outbox_migrate_consumer(empty, err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "db.url") != NULL);
  outbox_conf_free(empty);
  CHECK_RC(outbox_migrate_consumer(NULL, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_OK(outbox_tx_begin(r, &tx));
  snprintf(sql, sizeof sql, "DROP DATABASE %s", name);
  CHECK_OK(outbox_tx_execute(tx, sql, NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

/* The points service with a shared row per user: the order's credit and its user's balance. */
static int credit_and_add(void *user_data, outbox_tx *tx, const outbox_message *m, char *err, size_t err_size) {
  (void)user_data;
  const char *u = strstr(m->properties_json, "\"userId\":\"");
  if (u == NULL) {
    snprintf(err, err_size, "no userId property in %s", m->properties_json);
    return 1;
  }
  char user[16] = "";
  u += strlen("\"userId\":\"");
  size_t len = strcspn(u, "\"");
  if (len >= sizeof user) len = sizeof user - 1;
  memcpy(user, u, len);
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_TEXT;
  p.text = m->key;
  uint64_t affected = 0;
  if (outbox_tx_execute(tx, "INSERT INTO credits_r (event_key) VALUES (?)", &p, 1, &affected, NULL) != OUTBOX_OK) {
    snprintf(err, err_size, "credit failed: %s", last_error());
    return 2;
  }
  p.text = user;
  if (outbox_tx_execute(tx, "UPDATE balances_r SET points = points + 1 WHERE user_id = ?", &p, 1, &affected, NULL) !=
      OUTBOX_OK) {
    snprintf(err, err_size, "balance failed: %s", last_error());
    return 2;
  }
  return 0;
}

/* Handler threads routed by the user (consumer.route = property:userId, the userId header): 400
 * orders of 20 users over four threads update the users' balances without meeting each other's
 * locks (no batch retried or handled one at a time), and every balance adds up. */
static void test_consumer_routed_by_user_updates_shared_balances_without_lock_conflicts(void) {
  char err[512] = "";
  if (!namesrv_listening()) {
    SKIP("no RocketMQ name server on 127.0.0.1:9876 (scripts/rocketmq start)");
    return;
  }
  outbox_conf *c = test_conf();
  char topic[64], group[64];
  snprintf(topic, sizeof topic, "outbox_cr_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  snprintf(group, sizeof group, "points_r_%lx_%d", (unsigned long)time(NULL), (int)getpid());
  CHECK_OK(outbox_conf_set(c, "publisher", "rocketmq", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "rocketmq.namesrv", "127.0.0.1:9876", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "topic", topic, err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "10000", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.threads", "4", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "consumer.route", "property:userId", err, sizeof err));
  CHECK_RC(outbox_conf_set(c, "consumer.route", "property:", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "consumer.route") != NULL);
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  outbox_consumer *consumer = NULL;
  outbox_result rc = outbox_consumer_start(c, topic, group, credit_and_add, NULL, &consumer, err, sizeof err);
  if (rc == OUTBOX_ERR_PUBLISHER && strstr(err, "rocketmq feature") != NULL) {
    SKIP("this library was built without --features rocketmq (%s)", err);
    outbox_conf_free(c);
    return;
  }
  CHECK_RC(rc, OUTBOX_OK);
  outbox_relay *r = NULL;
  CHECK_OK(outbox_start(c, &r, err, sizeof err)); /* takes c */
  if (consumer == NULL || r == NULL) {
    if (consumer != NULL) outbox_consumer_free(consumer);
    if (r != NULL) outbox_free(r);
    return;
  }
  uint64_t affected = 0;
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_execute(tx, "CREATE TABLE credits_r (event_key VARCHAR(64) PRIMARY KEY)", NULL, 0, &affected, NULL));
  CHECK_OK(outbox_tx_execute(tx, "CREATE TABLE balances_r (user_id VARCHAR(16) PRIMARY KEY, points BIGINT NOT NULL)",
                             NULL, 0, &affected, NULL));
  for (int u = 0; u < 20; u++) {
    char sql[96];
    snprintf(sql, sizeof sql, "INSERT INTO balances_r VALUES ('u%d', 0)", u);
    CHECK_OK(outbox_tx_execute(tx, sql, NULL, 0, &affected, NULL));
  }
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK_OK(outbox_tx_begin(r, &tx));
  for (int i = 0; i < 400; i++) {
    char biz[32], user[16], body[64];
    snprintf(biz, sizeof biz, "ORD-R-%d", i);
    snprintf(user, sizeof user, "u%d", i % 20);
    snprintf(body, sizeof body, "{\"order\":\"%s\"}", biz);
    outbox_header h = {.key = "userId", .value = user};
    outbox_event e = {0};
    e.biz_no = biz;
    e.event_type = "ORDER_PAID";
    e.payload = (const uint8_t *)body;
    e.payload_len = strlen(body);
    e.headers = &h;
    e.headers_len = 1;
    uint64_t id = 0;
    CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  }
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  long processed = 0;
  for (int i = 0; i < 1200 && processed < 400; i++) {
    usleep(100 * 1000);
    stats_field(consumer, "processed", &processed);
  }
  CHECK(processed == 400);
  long retries = -1, fallbacks = -1, failed = -1;
  CHECK(stats_field(consumer, "batch_retries", &retries) && retries == 0);
  CHECK(stats_field(consumer, "batch_fallbacks", &fallbacks) && fallbacks == 0);
  CHECK(stats_field(consumer, "failed_attempts", &failed) && failed == 0);
  CHECK(query_int(r, "SELECT COUNT(*) FROM credits_r") == 400);
  CHECK(query_int(r, "SELECT COUNT(*) FROM balances_r WHERE points = 20") == 20);
  CHECK_OK(outbox_consumer_stop(consumer));
  outbox_consumer_free(consumer);
  CHECK_OK(outbox_stop(r, 10000));
  outbox_free(r);
}

int main(int argc, char **argv) {
  static const h_test tests[] = {
      {"inbox_mark_is_claim_first_and_a_duplicate_leaves_the_tx_usable",
       test_inbox_mark_is_claim_first_and_a_duplicate_leaves_the_tx_usable},
      {"consumer_credits_each_order_once_in_its_transaction", test_consumer_credits_each_order_once_in_its_transaction},
      {"consumer_start_refuses_bad_arguments", test_consumer_start_refuses_bad_arguments},
      {"consumer_keys_are_checked_like_the_relay_s", test_consumer_keys_are_checked_like_the_relay_s},
      {"consumer_start_fails_at_once_without_the_inbox_table", test_consumer_start_fails_at_once_without_the_inbox_table},
      {"consumer_batches_and_retries_a_lock_wait_without_an_attempt",
       test_consumer_batches_and_retries_a_lock_wait_without_an_attempt},
      {"consumer_migration_creates_the_consumer_s_tables_alone",
       test_consumer_migration_creates_the_consumer_s_tables_alone},
      {"consumer_routed_by_user_updates_shared_balances_without_lock_conflicts",
       test_consumer_routed_by_user_updates_shared_balances_without_lock_conflicts},
  };
  return run_tests(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
