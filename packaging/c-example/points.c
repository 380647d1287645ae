/* A C program built against an installed liboutbox, the way a C service uses it: nothing but
 * `pkg-config --cflags --libs outbox` (or `--static ... outbox-static`).
 *
 *   points                               prints the library's version
 *   points DB_URL                        migrates DB_URL's outbox table, then credits points and
 *                                        enqueues the event in one transaction (publisher=none:
 *                                        another instance or outboxd relays it)
 *   points DB_URL NAMESRV TOPIC          the same, then relays it to RocketMQ and waits until the
 *                                        broker has acknowledged it
 *
 * Exits 0 on success, 1 with the library's message otherwise. scripts/release.d/c.sh builds and
 * runs it against the release tarball. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <outbox.h>

static char err[1024];

static int fail(const char *what, outbox_result rc) {
  fprintf(stderr, "points: %s: %s (%s)\n", what, outbox_result_str(rc), err[0] ? err : "no detail");
  return 1;
}

/* Runs a call; on failure prints what failed with the library's message and returns 1. */
#define TRY(what, call)                                  \
  do {                                                   \
    err[0] = '\0';                                       \
    outbox_result rc_ = (call);                          \
    if (rc_ != OUTBOX_OK) {                              \
      size_t needed_;                                    \
      if (err[0] == '\0') outbox_last_error(err, sizeof err, &needed_); \
      return fail(what, rc_);                            \
    }                                                    \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The event's status, read in a transaction of the relay's pool. */
static int status_of(outbox_relay *relay, uint64_t id, const char *status, int64_t *count) {
  outbox_tx *tx = NULL;
  outbox_param ps[2];
  memset(ps, 0, sizeof ps);
  ps[0].kind = OUTBOX_PARAM_INT64;
  ps[0].int_value = (int64_t)id;
  ps[1].kind = OUTBOX_PARAM_TEXT;
  ps[1].text = status;
  bool found = false;
  TRY("begin", outbox_tx_begin(relay, &tx));
  outbox_result rc = outbox_tx_query_int64(
      tx, "SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status = ?", ps, 2, count, &found);
  outbox_tx_free(tx);
  if (rc != OUTBOX_OK) return fail("query", rc);
  return 0;
}

/* Whether event `id` is still to be sent: its row is there and not SUCCESS (a sent row is deleted,
   the default `sent.rows = delete`, or kept as SUCCESS). */
static int unsent(outbox_relay *relay, uint64_t id, int64_t *count) {
  outbox_tx *tx = NULL;
  outbox_param p;
  memset(&p, 0, sizeof p);
  p.kind = OUTBOX_PARAM_INT64;
  p.int_value = (int64_t)id;
  bool found = false;
  TRY("begin", outbox_tx_begin(relay, &tx));
  outbox_result rc = outbox_tx_query_int64(
      tx, "SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status <> 'SUCCESS'", &p, 1, count, &found);
  outbox_tx_free(tx);
  if (rc != OUTBOX_OK) return fail("query", rc);
  return 0;
}

int main(int argc, char **argv) {
  printf("liboutbox %s\n", outbox_version());
  if (argc == 1) return 0;
  if (argc != 2 && argc != 4) {
    fprintf(stderr, "usage: points [DB_URL [NAMESRV TOPIC]]\n");
    return 2;
  }
  const char *db_url = argv[1];
  int publish = argc == 4;

  TRY("log level", outbox_set_log_level(OUTBOX_LOG_WARN)); /* quiet migrations */
  outbox_conf *conf = outbox_conf_new();
  TRY("db.url", outbox_conf_set(conf, "db.url", db_url, err, sizeof err));
  if (publish) {
    TRY("publisher", outbox_conf_set(conf, "publisher", "rocketmq", err, sizeof err));
    TRY("rocketmq.namesrv", outbox_conf_set(conf, "rocketmq.namesrv", argv[2], err, sizeof err));
    TRY("topic", outbox_conf_set(conf, "topic", argv[3], err, sizeof err));
    TRY("send.timeout.ms", outbox_conf_set(conf, "send.timeout.ms", "10000", err, sizeof err));
  } else {
    TRY("publisher", outbox_conf_set(conf, "publisher", "none", err, sizeof err));
  }
  TRY("migrate", outbox_migrate(conf, err, sizeof err));
  outbox_relay *relay = NULL;
  TRY("start", outbox_start(conf, &relay, err, sizeof err)); /* consumes conf */

  /* The business write and its event, in one transaction. */
  outbox_tx *tx = NULL;
  TRY("begin", outbox_tx_begin(relay, &tx));
  TRY("create table",
      outbox_tx_execute(tx, "CREATE TABLE IF NOT EXISTS points (member VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL)",
                        NULL, 0, NULL, NULL));
  outbox_param p[2];
  memset(p, 0, sizeof p);
  p[0].kind = OUTBOX_PARAM_TEXT;
  p[0].text = "M-1";
  p[1].kind = OUTBOX_PARAM_INT64;
  p[1].int_value = 42;
  TRY("credit", outbox_tx_execute(tx, "INSERT INTO points (member, points) VALUES (?, ?) "
                                      "ON DUPLICATE KEY UPDATE points = points + VALUES(points)",
                                  p, 2, NULL, NULL));
  static const uint8_t payload[] = "{\"member\":\"M-1\",\"points\":42}";
  outbox_event event;
  memset(&event, 0, sizeof event);
  event.biz_no = "M-1";
  event.event_type = "POINTS_CREDITED";
  event.payload = payload;
  event.payload_len = sizeof payload - 1;
  uint64_t id = 0;
  TRY("enqueue", outbox_enqueue_in_tx(tx, &event, &id));
  TRY("commit", outbox_tx_commit(tx)); /* and wakes the relay */
  outbox_tx_free(tx);
  printf("enqueued event %llu\n", (unsigned long long)id);

  int64_t n = 0;
  if (publish) {
    /* Up to 60 s: the first send to a new topic creates its route. */
    n = 1;
    for (int i = 0; i < 600 && n != 0; i++) {
      sleep_ms(100);
      if (unsent(relay, id, &n) != 0) return 1;
    }
    if (n != 0) {
      char stats[4096];
      size_t needed;
      outbox_stats(relay, stats, sizeof stats, &needed);
      fprintf(stderr, "points: event %llu not acknowledged within 60 s; stats %s\n", (unsigned long long)id, stats);
      return 1;
    }
    printf("relayed event %llu to %s on %s\n", (unsigned long long)id, argv[3], argv[2]);
  } else {
    if (status_of(relay, id, "WAIT", &n) != 0) return 1;
    if (n != 1) {
      fprintf(stderr, "points: event %llu is not WAIT\n", (unsigned long long)id);
      return 1;
    }
    printf("event %llu waits for a relay\n", (unsigned long long)id);
  }
  TRY("stop", outbox_stop(relay, 10000));
  outbox_free(relay);
  return 0;
}
