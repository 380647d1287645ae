// A Java program run against the released jar alone, the way a service uses it: no
// -Djava.library.path, no JDBC driver; the jar carries the native library and extracts it.
//
//   java -cp outbox-<version>.jar Points.java                              prints what it loaded
//   java -cp outbox-<version>.jar Points.java DB_URL                       migrates, credits points
//                                         and enqueues the event in one transaction (publisher=none)
//   java -cp outbox-<version>.jar Points.java DB_URL NAMESRV TOPIC         the same, then relays it
//                                         and waits until the broker has acknowledged it
//
// scripts/release.d/java.sh runs it (Java 11+ runs a single source file without compiling it first).
import io.outbox.Event;
import io.outbox.Outbox;
import io.outbox.OutboxConfig;
import io.outbox.OutboxTransaction;

import java.time.Duration;

public class Points {
    public static void main(String[] args) throws Exception {
        System.out.println("outbox " + Outbox.version() + " " + Outbox.features() + " loaded from " + Outbox.libraryLocation());
        if (args.length == 0) {
            return;
        }
        if (args.length != 1 && args.length != 3) {
            System.err.println("usage: Points [DB_URL [NAMESRV TOPIC]]");
            System.exit(2);
        }
        boolean publish = args.length == 3;
        Outbox.setLogLevel(System.Logger.Level.WARNING);
        OutboxConfig config = new OutboxConfig().dbUrl(args[0]);
        if (publish) {
            config.set("publisher", "rocketmq").set("rocketmq.namesrv", args[1]).set("topic", args[2])
                    .set("send.timeout.ms", 10_000);
        } else {
            config.set("publisher", "none");
        }
        Outbox.migrate(config);
        try (Outbox outbox = Outbox.start(config)) {
            long id;
            try (OutboxTransaction tx = outbox.begin()) {
                tx.execute("CREATE TABLE IF NOT EXISTS points (member VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL)");
                tx.execute("INSERT INTO points (member, points) VALUES (?, ?) ON DUPLICATE KEY UPDATE points = points + VALUES(points)",
                        "M-1", 42);
                id = tx.enqueue(Event.of("M-1", "POINTS_CREDITED", "{\"member\":\"M-1\",\"points\":42}"));
                tx.commit(); // and wakes the relay
            }
            System.out.println("enqueued event " + id);
            // Sent: the row deleted (sent.rows = delete, the default) or SUCCESS; not sent: WAIT.
            String want = publish ? "sent" : "WAIT";
            long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos(); // a new topic's first send creates its route
            while (publish ? unsent(outbox, id) != 0 : status(outbox, id, "WAIT") != 1) {
                if (!publish || System.nanoTime() > deadline) {
                    System.err.println("event " + id + " is not " + want + "; stats " + outbox.stats());
                    System.exit(1);
                }
                Thread.sleep(100);
            }
            System.out.println(publish ? "relayed event " + id + " to " + args[2] + " on " + args[1]
                    : "event " + id + " waits for a relay");
            outbox.stop(Duration.ofSeconds(10));
        }
    }

    private static long unsent(Outbox outbox, long id) {
        try (OutboxTransaction tx = outbox.begin()) {
            return tx.queryLong("SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status <> 'SUCCESS'", id).orElse(0);
        }
    }

    private static long status(Outbox outbox, long id, String status) {
        try (OutboxTransaction tx = outbox.begin()) {
            return tx.queryLong("SELECT COUNT(*) FROM t_event_record WHERE id = ? AND status = ?", id, status).orElse(0);
        }
    }
}
