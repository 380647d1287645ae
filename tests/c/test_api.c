/* The whole C ABI against real MariaDB, enqueue-only (publisher=none): config, migrate, start,
 * library-owned transactions (commit, rollback, free without end), host-owned insert
 * statement, stats, stop, NULL arguments, bad UTF-8, use after stop. Built and run (also
 * under valgrind) by tests/c/run.sh. */
#include <pthread.h>
#include <stdint.h>

#include "harness.h"

static const char BAD_UTF8[] = {'b', 'a', (char)0xff, 'd', 0};

static outbox_param p_null(void) {
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_NULL;
  return p;
}
static outbox_param p_int(int64_t v) {
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_INT64;
  p.int_value = v;
  return p;
}
static outbox_param p_double(double v) {
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_DOUBLE;
  p.double_value = v;
  return p;
}
static outbox_param p_text(const char *s) {
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_TEXT;
  p.text = s;
  return p;
}
static outbox_param p_bytes(const void *b, size_t n) {
  outbox_param p = {0};
  p.kind = OUTBOX_PARAM_BYTES;
  p.bytes = (const uint8_t *)b;
  p.bytes_len = n;
  return p;
}

static outbox_event order_event(const char *biz_no) {
  static const uint8_t payload[] = "{\"order\":1}";
  outbox_event e = {0};
  e.biz_no = biz_no;
  e.event_type = "ORDER_CREATED";
  e.payload = payload;
  e.payload_len = sizeof payload - 1;
  return e;
}

/* Runs `sql` with one text parameter in a fresh transaction and returns the integer it
 * selects (-1 on error). */
static int64_t query1(outbox_relay *r, const char *sql, const char *arg) {
  outbox_tx *tx = NULL;
  int64_t v = -1;
  bool found = false;
  outbox_param p = p_text(arg);
  CHECK_OK(outbox_tx_begin(r, &tx));
  if (tx == NULL) return -1;
  CHECK_OK(outbox_tx_query_int64(tx, sql, &p, arg ? 1 : 0, &v, &found));
  CHECK(found);
  outbox_tx_free(tx);
  return v;
}

static int64_t events_of(outbox_relay *r, const char *biz_no) {
  return query1(r, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ?", biz_no);
}

static int64_t orders_of(outbox_relay *r, const char *order_no) {
  return query1(r, "SELECT COUNT(*) FROM t_order WHERE order_no = ?", order_no);
}

static void create_order_table(outbox_relay *r) {
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_tx_execute(tx,
                             "CREATE TABLE IF NOT EXISTS t_order (id BIGINT AUTO_INCREMENT PRIMARY "
                             "KEY, order_no VARCHAR(64) NOT NULL UNIQUE, qty BIGINT, price DOUBLE, "
                             "note VARCHAR(200), blob_col VARBINARY(64))",
                             NULL, 0, NULL, NULL));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
}

/* Inserts one order through the tx; returns its id. */
static uint64_t insert_order(outbox_tx *tx, const char *order_no) {
  const uint8_t blob[] = {0, 1, 2, 0xff};
  outbox_param ps[5] = {p_text(order_no), p_int(3), p_double(9.5), p_null(),
                        p_bytes(blob, sizeof blob)};
  uint64_t affected = 0, id = 0;
  CHECK_OK(outbox_tx_execute(
      tx, "INSERT INTO t_order (order_no, qty, price, note, blob_col) VALUES (?, ?, ?, ?, ?)", ps,
      5, &affected, &id));
  CHECK(affected == 1);
  CHECK(id > 0);
  return id;
}

/* ---- tests ---------------------------------------------------------------------------- */

static void test_version_and_result_codes(void) {
  CHECK(outbox_version() != NULL && strlen(outbox_version()) > 0);
  CHECK(strcmp(outbox_result_str(OUTBOX_OK), "success") == 0);
  CHECK(strcmp(outbox_result_str(12345), "unknown result code") == 0);
  CHECK(outbox_result_str(-7) != NULL);
  CHECK(outbox_result_is_retriable(OUTBOX_ERR_DATABASE));
  CHECK(outbox_result_is_retriable(OUTBOX_ERR_PUBLISHER));
  CHECK(!outbox_result_is_retriable(OUTBOX_ERR_STATEMENT));
  CHECK(!outbox_result_is_retriable(OUTBOX_ERR_INVALID_VALUE));
  CHECK(!outbox_result_is_retriable(OUTBOX_OK));
  CHECK(!outbox_result_is_retriable(-1));
  /* The values are part of the ABI. */
  CHECK(OUTBOX_ERR_UNKNOWN_KEY == 3 && OUTBOX_ERR_INVALID_VALUE == 4 && OUTBOX_ERR_STOPPED == 11 &&
        OUTBOX_ERR_TIMED_OUT == 13 && OUTBOX_ERR_PANIC == 99);
}

static void test_conf_unknown_key_and_invalid_value_are_distinct(void) {
  char err[256];
  outbox_conf *c = outbox_conf_new();
  CHECK(c != NULL);
  memset(err, 'x', sizeof err);
  CHECK_OK(outbox_conf_set(c, "scan.interval.ms", "200", err, sizeof err));
  CHECK(err[0] == 'x'); /* errstr is written only on failure */
  CHECK_RC(outbox_conf_set(c, "scan.intervall.ms", "200", err, sizeof err), OUTBOX_ERR_UNKNOWN_KEY);
  CHECK(strstr(err, "scan.intervall.ms") != NULL);
  CHECK_RC(outbox_conf_set(c, "batch.size", "many", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "batch.size") != NULL && strstr(err, "many") != NULL);
  CHECK_RC(outbox_conf_set(c, "publisher", "kafka", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(last_error(), "publisher") != NULL);
  CHECK_RC(outbox_conf_set(c, "table", "t; DROP TABLE x", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  /* A fleet's keys: a shard list is checked entry by entry, its passwords never repeated. */
  CHECK_OK(outbox_conf_set(c, "shard.workers", "2", err, sizeof err));
  CHECK_RC(outbox_conf_set(c, "shards", "mysql://u:pw1@h/o_{3..1}", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shards") != NULL && strstr(err, "runs backwards") != NULL && strstr(err, "pw1") == NULL);
  CHECK_RC(outbox_conf_set(c, "shard.db.pool.max", "0", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shard.db.pool.max") != NULL);
  /* Relays splitting a fleet: the coordination database's URL is checked, its password hidden. */
  CHECK_RC(outbox_conf_set(c, "shard.coordination.url", "mysql://u:pw9@h:port/x", err, sizeof err),
           OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shard.coordination.url") != NULL && strstr(err, "pw9") == NULL);
  CHECK_RC(outbox_conf_set(c, "shard.lease.ms", "999", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shard.lease.ms") != NULL && strstr(err, "999") != NULL);
  CHECK_OK(outbox_conf_set(c, "shard.lease.ms", "15000", err, sizeof err));
  /* A catalog of shards: its URL checked like db.url, its re-read period bounded. */
  CHECK_RC(outbox_conf_set(c, "shard.catalog.url", "mysql://u:pw8@h:port/x", err, sizeof err),
           OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shard.catalog.url") != NULL && strstr(err, "pw8") == NULL);
  CHECK_RC(outbox_conf_set(c, "shard.catalog.reload.ms", "999", err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shard.catalog.reload.ms") != NULL);
  /* errstr may be NULL, or too small: it is truncated and stays NUL-terminated. */
  CHECK_RC(outbox_conf_set(c, "nope", "1", NULL, 0), OUTBOX_ERR_UNKNOWN_KEY);
  char tiny[8];
  CHECK_RC(outbox_conf_set(c, "nope", "1", tiny, sizeof tiny), OUTBOX_ERR_UNKNOWN_KEY);
  CHECK(strlen(tiny) == sizeof tiny - 1);
  outbox_conf_free(c);
}

static void test_conf_bad_utf8(void) {
  char err[256];
  outbox_conf *c = outbox_conf_new();
  CHECK_RC(outbox_conf_set(c, BAD_UTF8, "1", err, sizeof err), OUTBOX_ERR_INVALID_UTF8);
  CHECK(strstr(err, "key") != NULL);
  CHECK_RC(outbox_conf_set(c, "topic", BAD_UTF8, err, sizeof err), OUTBOX_ERR_INVALID_UTF8);
  CHECK(strstr(err, "value") != NULL);
  outbox_conf_free(c);
}

static void test_start_failures_consume_the_conf_and_write_nothing(void) {
  char err[512];
  outbox_relay *r = (outbox_relay *)0x1;
  outbox_relay *const sentinel = r;

  /* No db.url. */
  outbox_conf *c = outbox_conf_new();
  CHECK_OK(outbox_conf_set(c, "publisher", "none", err, sizeof err));
  CHECK_RC(outbox_start(c, &r, err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "db.url") != NULL);
  CHECK(r == sentinel);

  /* Inconsistent values. */
  c = test_conf();
  CHECK_OK(outbox_conf_set(c, "lease.ms", "1000", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "send.timeout.ms", "1000", err, sizeof err));
  CHECK_RC(outbox_start(c, &r, err, sizeof err), OUTBOX_ERR_INCONSISTENT_CONFIG);
  CHECK(strstr(err, "lease.ms") != NULL);
  CHECK(r == sentinel);

  /* Nobody listening: a retriable database error. */
  c = outbox_conf_new();
  CHECK_OK(outbox_conf_set(c, "publisher", "none", err, sizeof err));
  CHECK_OK(outbox_conf_set(c, "db.url", "mysql://root@127.0.0.1:1/nothing", err, sizeof err));
  outbox_result rc = outbox_start(c, &r, err, sizeof err);
  CHECK_RC(rc, OUTBOX_ERR_DATABASE);
  CHECK(outbox_result_is_retriable(rc));
  CHECK(r == sentinel);

  /* The table does not exist: the statement is refused (not retriable). */
  c = test_conf();
  CHECK_OK(outbox_conf_set(c, "table", "t_no_such_outbox", err, sizeof err));
  CHECK_RC(outbox_start(c, &r, err, sizeof err), OUTBOX_ERR_STATEMENT);
  CHECK(strstr(err, "t_no_such_outbox") != NULL);
  CHECK(r == sentinel);

  /* A relay given shards: a fleet is outboxd's (or outbox::Fleet's), said by name. */
  c = test_conf();
  CHECK_OK(outbox_conf_set(c, "shards", "mysql://root@127.0.0.1:3306/o_{0..3}", err, sizeof err));
  CHECK_RC(outbox_start(c, &r, err, sizeof err), OUTBOX_ERR_INVALID_VALUE);
  CHECK(strstr(err, "shards") != NULL && strstr(err, "fleet") != NULL);
  CHECK(r == sentinel);

  /* A NULL out pointer still consumes the conf (valgrind proves it is freed). */
  c = test_conf();
  CHECK_RC(outbox_start(c, NULL, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
}

static void test_migrate(void) {
  char err[512];
  outbox_conf *c = test_conf();
  CHECK_OK(outbox_migrate(c, err, sizeof err));
  CHECK_OK(outbox_migrate(c, err, sizeof err)); /* idempotent */
  CHECK_RC(outbox_migrate(NULL, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(strstr(err, "conf") != NULL);
  outbox_conf_free(c);
  c = outbox_conf_new();
  CHECK_RC(outbox_migrate(c, err, sizeof err), OUTBOX_ERR_INVALID_VALUE); /* no db.url */
  outbox_conf_free(c);
}

static void test_enqueue_in_committed_tx(void) {
  outbox_relay *r = test_relay();
  create_order_table(r);
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  insert_order(tx, "C-COMMIT-1");
  outbox_header hs[3] = {{"traceId", "abc-123"},
                         {"source", "c-test"},
                         {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}};
  outbox_event e = order_event("C-COMMIT-1");
  e.topic = "ORDER_TOPIC_C";
  e.tag = "created";
  e.headers = hs;
  e.headers_len = 3;
  uint64_t id = 0;
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  CHECK(id > 0);
  /* Not visible outside the transaction before the commit. */
  CHECK(events_of(r, "C-COMMIT-1") == 0);
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK(events_of(r, "C-COMMIT-1") == 1);
  CHECK(orders_of(r, "C-COMMIT-1") == 1);
  CHECK(query1(r, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = ? AND status = 'WAIT' AND "
                  "topic = 'ORDER_TOPIC_C' AND tag = 'created' AND "
                  "JSON_VALUE(headers, '$.traceId') = 'abc-123' AND JSON_VALUE(headers, "
                  "'$.traceparent') = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01'",
               "C-COMMIT-1") == 1);
  CHECK(query1(r, "SELECT payload = '{\"order\":1}' FROM t_event_record WHERE biz_no = ?",
               "C-COMMIT-1") == 1);
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

static void test_rolled_back_and_abandoned_tx_leave_nothing(void) {
  outbox_relay *r = test_relay();
  create_order_table(r);
  outbox_tx *tx = NULL;
  uint64_t id = 0;
  outbox_event e = order_event("C-ROLLBACK-1");

  CHECK_OK(outbox_tx_begin(r, &tx));
  insert_order(tx, "C-ROLLBACK-1");
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  CHECK_OK(outbox_tx_rollback(tx));
  /* Ended: only free is allowed. */
  CHECK_RC(outbox_tx_commit(tx), OUTBOX_ERR_TX_FINISHED);
  CHECK_RC(outbox_tx_rollback(tx), OUTBOX_ERR_TX_FINISHED);
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_TX_FINISHED);
  CHECK_RC(outbox_tx_execute(tx, "SELECT 1", NULL, 0, NULL, NULL), OUTBOX_ERR_TX_FINISHED);
  outbox_tx_free(tx);
  CHECK(events_of(r, "C-ROLLBACK-1") == 0);
  CHECK(orders_of(r, "C-ROLLBACK-1") == 0);

  /* Freed without commit or rollback: rolled back. */
  e = order_event("C-ABANDON-1");
  CHECK_OK(outbox_tx_begin(r, &tx));
  insert_order(tx, "C-ABANDON-1");
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  outbox_tx_free(tx);
  CHECK(events_of(r, "C-ABANDON-1") == 0);
  CHECK(orders_of(r, "C-ABANDON-1") == 0);

  /* After a commit, too, the tx only accepts free. */
  e = order_event("C-COMMIT-2");
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_enqueue_in_tx(tx, &e, &id));
  CHECK_OK(outbox_tx_commit(tx));
  CHECK_RC(outbox_tx_commit(tx), OUTBOX_ERR_TX_FINISHED);
  outbox_tx_free(tx);
  CHECK(events_of(r, "C-COMMIT-2") == 1);

  outbox_free(r); /* stops it too */
}

static void test_statement_errors_and_bound_parameters(void) {
  outbox_relay *r = test_relay();
  create_order_table(r);
  outbox_tx *tx = NULL;
  uint64_t affected = 77, id = 77;
  CHECK_OK(outbox_tx_begin(r, &tx));

  /* Refused by the database: not retriable, message from the server, outputs untouched. */
  outbox_result rc = outbox_tx_execute(tx, "INSERT INTO t_order (nope) VALUES (1)", NULL, 0,
                                       &affected, &id);
  CHECK_RC(rc, OUTBOX_ERR_STATEMENT);
  CHECK(!outbox_result_is_retriable(rc));
  CHECK(strstr(last_error(), "nope") != NULL);
  CHECK(affected == 77 && id == 77);
  CHECK_RC(outbox_tx_execute(tx, "SELEKT 1", NULL, 0, NULL, NULL), OUTBOX_ERR_STATEMENT);

  /* Wrong parameter count or kind: the caller's mistake. */
  outbox_param one = p_int(1);
  CHECK_RC(outbox_tx_execute(tx, "SELECT ?, ?", &one, 1, NULL, NULL), OUTBOX_ERR_INVALID_ARGUMENT);
  outbox_param bad_kind = p_int(1);
  bad_kind.kind = 42;
  CHECK_RC(outbox_tx_execute(tx, "SELECT ?", &bad_kind, 1, NULL, NULL),
           OUTBOX_ERR_INVALID_ARGUMENT);
  CHECK_RC(outbox_tx_execute(tx, "SELECT ?", NULL, 1, NULL, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  outbox_param null_text = p_text(NULL);
  CHECK_RC(outbox_tx_execute(tx, "SELECT ?", &null_text, 1, NULL, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  outbox_param bad_text = p_text(BAD_UTF8);
  CHECK_RC(outbox_tx_execute(tx, "SELECT ?", &bad_text, 1, NULL, NULL), OUTBOX_ERR_INVALID_UTF8);
  CHECK_RC(outbox_tx_execute(tx, BAD_UTF8, NULL, 0, NULL, NULL), OUTBOX_ERR_INVALID_UTF8);

  /* Parameters are bound, never interpolated: a quote is just data. */
  const char *evil = "x'); DROP TABLE t_order; --";
  insert_order(tx, evil);
  int64_t v = 0;
  bool found = false;
  outbox_param p = p_text(evil);
  CHECK_OK(outbox_tx_query_int64(tx, "SELECT COUNT(*) FROM t_order WHERE order_no = ?", &p, 1, &v,
                                 &found));
  CHECK(found && v == 1);
  /* No row, and a NULL value, are "not found". */
  CHECK_OK(outbox_tx_query_int64(tx, "SELECT id FROM t_order WHERE order_no = 'none'", NULL, 0, &v,
                                 &found));
  CHECK(!found && v == 0);
  CHECK_OK(outbox_tx_query_int64(tx, "SELECT NULL", NULL, 0, &v, &found));
  CHECK(!found);
  CHECK_RC(outbox_tx_query_int64(tx, "SELECT 'abc'", NULL, 0, &v, &found),
           OUTBOX_ERR_INVALID_ARGUMENT);
  /* The tx survived the failed statements. */
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK(orders_of(r, evil) == 1);
  outbox_free(r);
}

static void test_invalid_events(void) {
  outbox_relay *r = test_relay();
  outbox_tx *tx = NULL;
  uint64_t id = 99;
  char err[256];
  CHECK_OK(outbox_tx_begin(r, &tx));

  outbox_event e = order_event("C-BAD-1");
  e.payload_len = 0;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(last_error(), "payload") != NULL);
  CHECK_RC(outbox_validate_event(r, &e, err, sizeof err), OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(err, "payload") != NULL);

  e = order_event("C-BAD-1");
  e.payload = NULL; /* with a length */
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_NULL_ARGUMENT);

  e = order_event(NULL);
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(strstr(last_error(), "biz_no") != NULL);

  e = order_event("   ");
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);

  e = order_event(BAD_UTF8);
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_UTF8);
  e = order_event("C-BAD-1");
  e.event_type = BAD_UTF8;
  CHECK_RC(outbox_validate_event(r, &e, err, sizeof err), OUTBOX_ERR_INVALID_UTF8);

  e = order_event("C-BAD-1");
  e.topic = "bad topic!";
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);

  outbox_header reserved = {"eventId", "1"};
  e = order_event("C-BAD-1");
  e.headers = &reserved;
  e.headers_len = 1;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);
  outbox_header dup[2] = {{"k", "1"}, {"k", "2"}};
  e.headers = dup;
  e.headers_len = 2;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);
  outbox_header null_value = {"k", NULL};
  e.headers = &null_value;
  e.headers_len = 1;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_NULL_ARGUMENT);
  e.headers = NULL;
  e.headers_len = 3;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_NULL_ARGUMENT);
  /* A trace context (docs/tracing.md) is checked: a malformed traceparent, or a tracestate
   * without one, is refused naming the header. */
  outbox_header bad_trace = {"traceparent", "00-not-a-trace-01"};
  e.headers = &bad_trace;
  e.headers_len = 1;
  CHECK_RC(outbox_validate_event(r, &e, err, sizeof err), OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(err, "traceparent") != NULL && strstr(err, "00-not-a-trace-01") != NULL);
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);
  outbox_header lone_state = {"tracestate", "k=v"};
  e.headers = &lone_state;
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, &id), OUTBOX_ERR_INVALID_EVENT);

  CHECK(id == 99); /* never written on failure */
  e = order_event("C-GOOD-1");
  CHECK_OK(outbox_validate_event(r, &e, err, sizeof err));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK(events_of(r, "C-BAD-1") == 0);
  outbox_free(r);
}

/* The headers parameter of a host-owned insert, encoded by the library: a JSON object, or the
 * empty string (bind NULL) without headers; buffers written only when large enough. */
static void test_event_headers_json(void) {
  outbox_event e = order_event("C-HDR-1");
  size_t needed = 0;
  char buf[64];
  memset(buf, 'x', sizeof buf);
  CHECK_OK(outbox_event_headers_json(&e, buf, sizeof buf, &needed));
  CHECK(needed == 1 && buf[0] == '\0');
  outbox_header hs[2] = {{"source", "c"}, {"quote", "say \"hi\""}};
  e.headers = hs;
  e.headers_len = 2;
  char tiny[4] = {'x', 'x', 'x', 'x'};
  CHECK_RC(outbox_event_headers_json(&e, tiny, sizeof tiny, &needed), OUTBOX_ERR_BUFFER_TOO_SMALL);
  CHECK(tiny[0] == 'x');
  CHECK(needed == strlen("{\"quote\":\"say \\\"hi\\\"\",\"source\":\"c\"}") + 1);
  CHECK_OK(outbox_event_headers_json(&e, buf, sizeof buf, &needed));
  CHECK(strcmp(buf, "{\"quote\":\"say \\\"hi\\\"\",\"source\":\"c\"}") == 0);
  hs[1].key = BAD_UTF8;
  CHECK_RC(outbox_event_headers_json(&e, buf, sizeof buf, &needed), OUTBOX_ERR_INVALID_UTF8);
  CHECK_RC(outbox_event_headers_json(NULL, buf, sizeof buf, &needed), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_event_headers_json(&e, buf, sizeof buf, NULL), OUTBOX_ERR_NULL_ARGUMENT);
}

static void test_insert_statement_and_params(void) {
  outbox_relay *r = test_relay();
  size_t needed = 0;
  char small[4] = {'x', 'x', 'x', 'x'};
  CHECK_RC(outbox_insert_statement(r, NULL, 0, &needed), OUTBOX_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > 20);
  CHECK_RC(outbox_insert_statement(r, small, sizeof small, &needed), OUTBOX_ERR_BUFFER_TOO_SMALL);
  CHECK(small[0] == 'x');
  char *sql = malloc(needed);
  size_t needed2 = 0;
  CHECK_OK(outbox_insert_statement(r, sql, needed, &needed2));
  CHECK(needed2 == needed && strlen(sql) + 1 == needed);
  CHECK(strncmp(sql, "INSERT INTO t_event_record", 26) == 0);

  /* The plain INSERT's parameters are the first six of the scheduled one's. */
  size_t n = outbox_insert_param_count(), ns = outbox_insert_scheduled_param_count();
  const char *want[] = {"biz_no", "event_type", "payload", "topic",
                        "tag",    "headers",    "deliver_at_ms", "delay_ms"};
  CHECK(n == 6 && ns == 8);
  for (size_t i = 0; i < ns && i < 8; i++) CHECK(strcmp(outbox_insert_param_name(i), want[i]) == 0);
  CHECK(outbox_insert_param_name(ns) == NULL);
  char *scheduled = malloc(needed + 200);
  CHECK_OK(outbox_insert_scheduled_statement(r, scheduled, needed + 200, &needed2));
  CHECK(strncmp(scheduled, "INSERT INTO t_event_record", 26) == 0 && strstr(scheduled, "next_retry_time") != NULL);
  CHECK(strstr(sql, "next_retry_time") == NULL); /* due now: the column's default */

  /* The host-owned path: run the statement "with the host's driver" (here the library's tx,
   * standing in for it), then notify. */
  outbox_tx *tx = NULL;
  CHECK_OK(outbox_tx_begin(r, &tx));
  outbox_param ps[8] = {p_text("C-HOST-1"), p_text("ORDER_PAID"), p_bytes("{}", 2),
                        p_null(), p_null(), p_text("{\"via\":\"host\"}"), p_null(), p_null()};
  uint64_t affected = 0, id = 0;
  CHECK_OK(outbox_tx_execute(tx, sql, ps, 6, &affected, &id));
  CHECK(affected == 1 && id > 0);
  /* A scheduled one, an hour ahead, with the values outbox_schedule_params gives. */
  outbox_schedule later = {0, 3600 * 1000};
  int64_t at = 0, delay = 0;
  bool bind_at = false, bind_delay = false;
  CHECK_OK(outbox_schedule_params(&later, &at, &bind_at, &delay, &bind_delay, NULL, 0));
  ps[0] = p_text("C-HOST-2");
  ps[7] = p_int(delay);
  CHECK(!bind_at && bind_delay);
  CHECK_OK(outbox_tx_execute(tx, scheduled, ps, 8, &affected, &id));
  CHECK(affected == 1 && id > 0);
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  CHECK_OK(outbox_notify(r));
  CHECK(events_of(r, "C-HOST-1") == 1);
  CHECK(query1(r, "SELECT next_retry_time <= NOW(3) FROM t_event_record WHERE biz_no = ?", "C-HOST-1") == 1);
  CHECK(query1(r, "SELECT TIMESTAMPDIFF(SECOND, NOW(3), next_retry_time) BETWEEN 3590 AND 3600 "
                  "FROM t_event_record WHERE biz_no = ?", "C-HOST-2") == 1);
  free(scheduled);
  free(sql);
  outbox_free(r);
}

/* A scheduled event: its row is due when the schedule says, by the database's clock; the
 * host-owned path gets the same values from outbox_schedule_params; bad schedules are refused
 * naming the value, and nothing is written. */
static void test_scheduled_events(void) {
  outbox_relay *r = test_relay();
  outbox_tx *tx = NULL;
  uint64_t id = 0;
  char err[256];
  outbox_event e = order_event("C-SCHED-1");
  outbox_schedule later = {0, 3600 * 1000};
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_enqueue_scheduled_in_tx(tx, &e, &later, &id));
  e.biz_no = "C-SCHED-2";
  CHECK_OK(outbox_enqueue_scheduled_in_tx(tx, &e, NULL, &id)); /* NULL: not scheduled */
  outbox_schedule both = {1, 2}, negative = {0, -5}, far = {0, 400LL * 24 * 3600 * 1000};
  CHECK_RC(outbox_enqueue_scheduled_in_tx(tx, &e, &both, &id), OUTBOX_ERR_INVALID_EVENT);
  CHECK_RC(outbox_enqueue_scheduled_in_tx(tx, &e, &negative, &id), OUTBOX_ERR_INVALID_EVENT);
  CHECK_RC(outbox_enqueue_scheduled_in_tx(tx, &e, &far, &id), OUTBOX_ERR_INVALID_EVENT);
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);
  /* An hour ahead (to the second, the INSERT and this query share the clock), and now. */
  CHECK(query1(r, "SELECT TIMESTAMPDIFF(SECOND, NOW(3), next_retry_time) BETWEEN 3590 AND 3600 "
                  "FROM t_event_record WHERE biz_no = ?", "C-SCHED-1") == 1);
  CHECK(query1(r, "SELECT next_retry_time <= NOW(3) FROM t_event_record WHERE biz_no = ?",
               "C-SCHED-2") == 1);
  CHECK(events_of(r, "C-SCHED-2") == 1); /* the refused ones wrote nothing */

  int64_t at = -1, delay = -1;
  bool bind_at = true, bind_delay = false;
  CHECK_OK(outbox_schedule_params(&later, &at, &bind_at, &delay, &bind_delay, err, sizeof err));
  CHECK(!bind_at && bind_delay && delay == 3600 * 1000);
  CHECK_OK(outbox_schedule_params(NULL, &at, &bind_at, &delay, &bind_delay, err, sizeof err));
  CHECK(!bind_at && !bind_delay);
  CHECK_RC(outbox_schedule_params(&both, &at, &bind_at, &delay, &bind_delay, err, sizeof err),
           OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(err, "deliver_at_ms 1 and delay_ms 2") != NULL);
  CHECK_RC(outbox_schedule_params(&far, &at, &bind_at, &delay, &bind_delay, err, sizeof err),
           OUTBOX_ERR_INVALID_EVENT);
  CHECK(strstr(err, "34560000000 ms") != NULL);
  CHECK_RC(outbox_schedule_params(&later, NULL, &bind_at, &delay, &bind_delay, err, sizeof err),
           OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

/* Cancelling: a scheduled event is cancelled (row gone, audited), a second cancel says so, an
 * id never issued is refused naming it; by business key and type. */
static void test_cancel(void) {
  outbox_relay *r = test_relay();
  outbox_tx *tx = NULL;
  uint64_t ids[3] = {0, 0, 0};
  outbox_schedule later = {0, 3600 * 1000};
  outbox_event e = order_event("C-CANCEL-1");
  CHECK_OK(outbox_tx_begin(r, &tx));
  CHECK_OK(outbox_enqueue_scheduled_in_tx(tx, &e, &later, &ids[0]));
  e.biz_no = "C-CANCEL-2";
  e.event_type = "ORDER_TIMEOUT";
  CHECK_OK(outbox_enqueue_scheduled_in_tx(tx, &e, &later, &ids[1]));
  e.event_type = "ORDER_REMINDER";
  CHECK_OK(outbox_enqueue_scheduled_in_tx(tx, &e, &later, &ids[2]));
  CHECK_OK(outbox_tx_commit(tx));
  outbox_tx_free(tx);

  outbox_cancel_outcome outcome = OUTBOX_CANCEL_GONE;
  CHECK_OK(outbox_cancel(r, ids[0], &outcome));
  CHECK(outcome == OUTBOX_CANCELLED);
  CHECK(events_of(r, "C-CANCEL-1") == 0);
  CHECK(query1(r, "SELECT COUNT(*) FROM outbox_audit WHERE action = 'cancel' AND detail = ?",
               "cancelled before it was sent") == 1);
  CHECK_OK(outbox_cancel(r, ids[0], &outcome));
  CHECK(outcome == OUTBOX_CANCEL_ALREADY_CANCELLED);
  CHECK_RC(outbox_cancel(r, ids[2] + 1000, &outcome), OUTBOX_ERR_INVALID_EVENT);
  char err[256];
  size_t needed = 0;
  CHECK_OK(outbox_last_error(err, sizeof err, &needed));
  CHECK(strstr(err, "is not an event of t_event_record") != NULL);

  uint64_t n = 99;
  CHECK_OK(outbox_cancel_by_biz_no(r, "C-CANCEL-2", "ORDER_TIMEOUT", &n));
  CHECK(n == 1);
  CHECK(events_of(r, "C-CANCEL-2") == 1);
  CHECK_OK(outbox_cancel_by_biz_no(r, "C-CANCEL-2", NULL, &n));
  CHECK(n == 1);
  CHECK(events_of(r, "C-CANCEL-2") == 0);
  CHECK_RC(outbox_cancel_by_biz_no(r, BAD_UTF8, NULL, &n), OUTBOX_ERR_INVALID_UTF8);
  CHECK_RC(outbox_cancel_by_biz_no(r, NULL, NULL, &n), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_cancel(NULL, 1, &outcome), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_cancel(r, 1, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_OK(outbox_stop(r, 5000));
  outbox_free(r);
}

static void test_stats(void) {
  outbox_relay *r = test_relay();
  size_t needed = 0;
  CHECK_RC(outbox_stats(r, NULL, 0, &needed), OUTBOX_ERR_BUFFER_TOO_SMALL);
  CHECK(needed > 10);
  char buf[4096];
  CHECK_OK(outbox_stats(r, buf, sizeof buf, &needed));
  CHECK(strlen(buf) + 1 == needed);
  CHECK(buf[0] == '{' && strstr(buf, "\"sent\":0") != NULL);
  CHECK(strstr(buf, "\"gauges\":{") != NULL); /* the database answered */
  CHECK(strstr(buf, "\"instance_id\"") != NULL);
  CHECK_RC(outbox_stats(r, buf, sizeof buf, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_stats(r, NULL, 10, &needed), OUTBOX_ERR_NULL_ARGUMENT);
  outbox_free(r);
}

static void test_stop_is_idempotent_and_use_after_stop_fails(void) {
  outbox_relay *r = test_relay();
  outbox_tx *before = NULL, *after = (outbox_tx *)0x1;
  uint64_t id = 0;
  outbox_event e = order_event("C-STOP-1");
  CHECK_OK(outbox_tx_begin(r, &before));
  CHECK_OK(outbox_stop(r, 2000));
  CHECK_OK(outbox_stop(r, 2000)); /* double stop */
  CHECK_OK(outbox_stop(r, 0));
  CHECK_RC(outbox_notify(r), OUTBOX_ERR_STOPPED);
  CHECK_RC(outbox_tx_begin(r, &after), OUTBOX_ERR_STOPPED);
  CHECK(after == (outbox_tx *)0x1);
  CHECK_RC(outbox_enqueue_in_tx(before, &e, &id), OUTBOX_ERR_STOPPED);
  /* What is still allowed: finishing a tx begun before, stats, the insert statement. */
  CHECK_OK(outbox_tx_execute(before, "SELECT 1", NULL, 0, NULL, NULL));
  CHECK_OK(outbox_tx_commit(before));
  char buf[4096];
  size_t needed = 0;
  CHECK_OK(outbox_stats(r, buf, sizeof buf, &needed));
  CHECK_OK(outbox_insert_statement(r, buf, sizeof buf, &needed));
  outbox_free(r);
  /* A tx outlives its relay's handle: freeing it afterwards is fine. */
  outbox_tx_free(before);
}

static void test_null_arguments_everywhere(void) {
  char err[256];
  char buf[64];
  size_t needed = 0;
  uint64_t u = 0;
  int64_t v = 0;
  bool found = false;
  outbox_relay *r = test_relay();
  outbox_tx *tx = NULL;
  outbox_conf *c = outbox_conf_new();
  outbox_event e = order_event("C-NULL-1");
  CHECK_OK(outbox_tx_begin(r, &tx));

  CHECK_RC(outbox_conf_set(NULL, "topic", "x", err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK(strstr(err, "conf") != NULL);
  CHECK_RC(outbox_conf_set(c, NULL, "x", err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_conf_set(c, "topic", NULL, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_conf_set_dead_letter_cb(NULL, NULL, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_OK(outbox_conf_set_dead_letter_cb(c, NULL, NULL)); /* clearing is fine */
  CHECK_RC(outbox_migrate(NULL, NULL, 0), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_start(NULL, &r, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_notify(NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_stop(NULL, 0), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_stats(NULL, buf, sizeof buf, &needed), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_insert_statement(NULL, buf, sizeof buf, &needed), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_insert_statement(r, buf, sizeof buf, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_validate_event(NULL, &e, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_validate_event(r, NULL, err, sizeof err), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_begin(NULL, &tx), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_begin(r, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_execute(NULL, "SELECT 1", NULL, 0, &u, &u), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_execute(tx, NULL, NULL, 0, &u, &u), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_query_int64(NULL, "SELECT 1", NULL, 0, &v, &found), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_query_int64(tx, NULL, NULL, 0, &v, &found), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_query_int64(tx, "SELECT 1", NULL, 0, NULL, &found), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_query_int64(tx, "SELECT 1", NULL, 0, &v, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_enqueue_in_tx(NULL, &e, &u), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_enqueue_in_tx(tx, NULL, &u), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_enqueue_in_tx(tx, &e, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_commit(NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_tx_rollback(NULL), OUTBOX_ERR_NULL_ARGUMENT);
  CHECK_RC(outbox_last_error(buf, sizeof buf, NULL), OUTBOX_ERR_NULL_ARGUMENT);
  /* A failure of outbox_last_error does not replace the message it reports. */
  CHECK(strstr(last_error(), "out_needed") == NULL);
  CHECK(strstr(last_error(), "`tx`") != NULL);

  /* Free of NULL is a no-op, for every object. */
  outbox_conf_free(NULL);
  outbox_tx_free(NULL);
  outbox_free(NULL);

  /* Nothing was enqueued by the rejected calls; the tx is still usable. */
  CHECK_OK(outbox_tx_query_int64(tx, "SELECT COUNT(*) FROM t_event_record WHERE biz_no = 'C-NULL-1'",
                                 NULL, 0, &v, &found));
  CHECK(found && v == 0);
  outbox_tx_free(tx);
  outbox_conf_free(c);
  outbox_free(r);
}

#define THREADS 4
#define PER_THREAD 5

static void *enqueue_worker(void *arg) {
  outbox_relay *r = arg;
  for (int i = 0; i < PER_THREAD; i++) {
    outbox_tx *tx = NULL;
    uint64_t id = 0;
    outbox_event e = order_event("C-THREADS");
    if (outbox_tx_begin(r, &tx) != OUTBOX_OK) return (void *)1;
    if (outbox_enqueue_in_tx(tx, &e, &id) != OUTBOX_OK || outbox_tx_commit(tx) != OUTBOX_OK) {
      outbox_tx_free(tx);
      return (void *)1;
    }
    outbox_tx_free(tx);
    if (outbox_notify(r) != OUTBOX_OK) return (void *)1;
    char buf[4096];
    size_t needed;
    if (outbox_stats(r, buf, sizeof buf, &needed) != OUTBOX_OK) return (void *)1;
  }
  return NULL;
}

static void test_one_relay_shared_by_threads(void) {
  outbox_relay *r = test_relay();
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, enqueue_worker, r) == 0);
  for (int i = 0; i < THREADS; i++) {
    void *res = NULL;
    CHECK(pthread_join(t[i], &res) == 0);
    CHECK(res == NULL);
  }
  CHECK(events_of(r, "C-THREADS") == THREADS * PER_THREAD);
  outbox_free(r);
}

int main(int argc, char **argv) {
  static const h_test tests[] = {
      {"version_and_result_codes", test_version_and_result_codes},
      {"conf_unknown_key_and_invalid_value_are_distinct",
       test_conf_unknown_key_and_invalid_value_are_distinct},
      {"conf_bad_utf8", test_conf_bad_utf8},
      {"migrate", test_migrate},
      {"start_failures_consume_the_conf_and_write_nothing",
       test_start_failures_consume_the_conf_and_write_nothing},
      {"enqueue_in_committed_tx", test_enqueue_in_committed_tx},
      {"rolled_back_and_abandoned_tx_leave_nothing",
       test_rolled_back_and_abandoned_tx_leave_nothing},
      {"statement_errors_and_bound_parameters", test_statement_errors_and_bound_parameters},
      {"invalid_events", test_invalid_events},
      {"insert_statement_and_params", test_insert_statement_and_params},
      {"event_headers_json", test_event_headers_json},
      {"scheduled_events", test_scheduled_events},
      {"cancel", test_cancel},
      {"stats", test_stats},
      {"stop_is_idempotent_and_use_after_stop_fails",
       test_stop_is_idempotent_and_use_after_stop_fails},
      {"null_arguments_everywhere", test_null_arguments_everywhere},
      {"one_relay_shared_by_threads", test_one_relay_shared_by_threads},
  };
  return run_tests(tests, sizeof tests / sizeof tests[0], argc > 1 ? argv[1] : NULL);
}
