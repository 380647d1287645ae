package io.outbox;

import java.sql.Connection;
import java.sql.ResultSet;
import java.sql.Statement;

/**
 * Not a test: what a handler call across JNI costs. 20 000 events relayed onto a topic of their
 * own, then read by {@link OutboxConsumer#start} (a per-message handler) and by
 * {@link OutboxConsumer#startBatch} running the same handler on each message of the batch, twice
 * each, each with a group of its own, in one run. The handler credits the order and upserts its
 * user's row. Needs the broker on 127.0.0.1:9876 and the library built with {@code rocketmq,jni};
 * after {@code bindings/java/run-tests.sh} has built the classes:
 *
 * <pre>
 * java -Djava.library.path=$CARGO_TARGET_DIR/debug \
 *   -cp bindings/java/build/outbox.jar:bindings/java/build/test-classes:/usr/share/java/mariadb-java-client.jar \
 *   io.outbox.ConsumerBench
 * </pre>
 */
public final class ConsumerBench {
    private ConsumerBench() {}

    public static void main(String[] args) throws Exception {
        int n = Integer.getInteger("outbox.bench.events", 20000); // benches/by-language.sh
        try (TestDb db = new TestDb()) {
            String topic = "OUTBOX_JBENCH_" + Long.toHexString(System.nanoTime());
            OutboxConfig relayConfig = new OutboxConfig().set("db.url", db.url()).set("rocketmq.namesrv", "127.0.0.1:9876")
                    .set("publisher", "rocketmq").set("topic", topic).set("sent.rows", "keep");
            Outbox.migrate(relayConfig);
            try (Connection c = db.connect(); Statement s = c.createStatement()) {
                s.execute("CREATE TABLE credits (order_no VARCHAR(64) PRIMARY KEY, n INT NOT NULL)");
            }
            try (Outbox relay = Outbox.start(relayConfig)) {
                try (OutboxTransaction tx = relay.begin()) {
                    for (int i = 0; i < n; i++) {
                        tx.enqueue(Event.of("ORD-" + i, "ORDER_PAID", "{}").withHeader("userId", "u" + (i % 200)));
                    }
                    tx.commit();
                }
                while (db.count("status <> 'SUCCESS'") > 0) {
                    Thread.sleep(100);
                }
            }
            String[] shapes = {"start", "startBatch", "start", "startBatch"};
            for (int k = 0; k < shapes.length; k++) {
                String prefix = "g" + k + "-";
                ConsumerHandler handler = (tx, m) -> {
                    tx.execute("INSERT INTO credits (order_no, n) VALUES (?, 1)", prefix + m.bizNo());
                    tx.execute("INSERT INTO credits (order_no, n) VALUES (?, 1) ON DUPLICATE KEY UPDATE n = n + 1",
                            prefix + "user-" + m.property("userId"));
                };
                OutboxConfig config = new OutboxConfig().set("db.url", db.url()).set("rocketmq.namesrv", "127.0.0.1:9876");
                String group = "jbench_" + k + "_" + Long.toHexString(System.nanoTime());
                OutboxConsumer consumer = shapes[k].equals("start")
                        ? OutboxConsumer.start(config, topic, group, handler)
                        : OutboxConsumer.startBatch(config, topic, group, (tx, ms) -> {
                            for (ConsumerMessage m : ms) {
                                handler.handle(tx, m);
                            }
                        });
                long t0 = 0;
                while (true) {
                    OutboxConsumerStats s = consumer.stats();
                    if (s.processed() > 0 && t0 == 0) {
                        t0 = System.nanoTime();
                    }
                    if (s.processed() + s.duplicates() >= n) {
                        break;
                    }
                    Thread.sleep(10);
                }
                double rate = n / ((System.nanoTime() - t0) / 1e9);
                consumer.close();
                System.out.printf("  %-12s %8.0f msg/s%n", shapes[k], rate);
            }
        }
    }
}
