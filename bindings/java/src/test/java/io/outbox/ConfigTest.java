package io.outbox;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.time.Duration;
import java.util.Arrays;
import java.util.Map;
import java.util.Properties;
import org.junit.Test;

/** Configuration: the library's keys, checked when set and at start, errors naming key and value. */
public class ConfigTest {
    @Test
    public void bad_value_throws_config_exception_naming_key_and_value() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> new OutboxConfig().set("scan.interval.ms", "soon"));
        assertEquals(OutboxConfigException.Kind.INVALID_VALUE, e.kind());
        assertEquals("scan.interval.ms", e.key());
        assertEquals("soon", e.value());
        assertTrue(e.getMessage(), e.getMessage().contains("scan.interval.ms") && e.getMessage().contains("soon"));
        assertTrue(e.reason(), e.reason().contains("whole number"));
    }

    @Test
    public void out_of_range_value_is_refused_with_its_range() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> new OutboxConfig().set("workers", 0));
        assertEquals("workers", e.key());
        assertEquals("0", e.value());
        assertTrue(e.getMessage(), e.getMessage().contains("from 1 to 256"));
    }

    @Test
    public void unknown_key_is_its_own_kind() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> new OutboxConfig().set("scan.intervall.ms", "100"));
        assertEquals(OutboxConfigException.Kind.UNKNOWN_KEY, e.kind());
        assertEquals("scan.intervall.ms", e.key());
        assertNull(e.value());
        assertTrue(e.getMessage(), e.getMessage().contains("scan.intervall.ms"));
    }

    @Test
    public void table_name_with_sql_is_refused() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> new OutboxConfig().set("table", "t; DROP TABLE x"));
        assertEquals("table", e.key());
        assertEquals("t; DROP TABLE x", e.value());
        OutboxConfigException e2 = assertThrows(OutboxConfigException.class, () -> OutboxEvents.insertStatement("x y"));
        assertEquals("table", e2.key());
    }

    @Test
    public void inconsistent_values_are_found_by_validate_and_start() {
        OutboxConfig c = new OutboxConfig().set("db.url", "mysql://root@127.0.0.1:3306/none").set("publisher", "none").set("lease.ms", 1000).set("send.timeout.ms", 500);
        OutboxConfigException e = assertThrows(OutboxConfigException.class, c::validate);
        assertEquals(OutboxConfigException.Kind.INCONSISTENT, e.kind());
        assertEquals(Arrays.asList("send.timeout.ms", "lease.ms"), e.keys());
        OutboxConfigException atStart = assertThrows(OutboxConfigException.class, () -> Outbox.start(c));
        assertEquals(OutboxConfigException.Kind.INCONSISTENT, atStart.kind());
        c.set("send.timeout.ms", Duration.ofMillis(250)).validate();
    }

    @Test
    public void start_without_db_url_names_db_url() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> Outbox.start(new OutboxConfig().set("publisher", "none")));
        assertEquals("db.url", e.key());
        assertTrue(e.getMessage(), e.getMessage().contains("db.url"));
    }

    @Test
    public void bad_db_url_is_refused_without_printing_the_password() {
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> new OutboxConfig().set("db.url", "postgres://u:hunter2@h/db"));
        assertEquals("db.url", e.key());
        assertFalse(e.getMessage(), e.getMessage().contains("hunter2"));
    }

    @Test
    public void rocketmq_publisher_needs_a_library_built_with_it() {
        org.junit.Assume.assumeFalse("this library was built with rocketmq", Outbox.features().contains("rocketmq"));
        OutboxConfig c = new OutboxConfig().set("db.url", "mysql://root@127.0.0.1:3306/none").set("publisher", "rocketmq");
        OutboxConfigException e = assertThrows(OutboxConfigException.class, () -> Outbox.start(c));
        assertEquals("publisher", e.key());
        assertEquals("rocketmq", e.value());
    }

    @Test
    public void get_returns_set_value_or_library_default() {
        OutboxConfig c = new OutboxConfig().set("batch.size", 50);
        assertEquals("50", c.get("batch.size"));
        assertEquals("t_event_record", c.get("table"));
        assertTrue(c.isSet("batch.size"));
        assertFalse(c.isSet("table"));
        assertThrows(OutboxConfigException.class, () -> c.get("no.such.key"));
    }

    @Test
    public void keys_lists_every_library_key_with_its_doc() {
        Map<String, String> keys = OutboxConfig.keys();
        assertTrue(keys.containsKey("db.url"));
        assertTrue(keys.containsKey("rocketmq.namesrv"));
        assertTrue(keys.get("scan.interval.ms").length() > 10);
        for (String k : keys.keySet()) {
            new OutboxConfig().get(k); // every listed key has a default
        }
    }

    @Test
    public void from_properties_strips_the_prefix_and_checks_each_key() {
        Properties p = new Properties();
        p.setProperty("outbox.batch.size", "7");
        p.setProperty("other.thing", "x");
        assertEquals("7", OutboxConfig.fromProperties(p, "outbox.").get("batch.size"));
        p.setProperty("outbox.batch.sise", "7");
        assertThrows(OutboxConfigException.class, () -> OutboxConfig.fromProperties(p, "outbox."));
    }

    @Test
    public void to_string_masks_secrets() {
        OutboxConfig c = new OutboxConfig().set("db.url", "mysql://app:hunter2@db:3306/orders").set("rocketmq.secret.key", "sk")
                .set("rocketmq.access.key", "ak");
        String s = c.toString();
        assertFalse(s, s.contains("hunter2"));
        assertFalse(s, s.contains("=sk"));
        assertTrue(s, s.contains("mysql://app:***@db:3306/orders"));
    }

    @Test
    public void to_string_masks_every_secret_and_url_password_the_library_declares() {
        OutboxConfig c = new OutboxConfig().set("console.admin.token", "admin-token-0123456789")
                .set("console.read.token", "read-token-0123456789").set("console.consumer.db.url", "mysql://cons:hunter3@db/inbox");
        String s = c.toString();
        assertFalse(s, s.contains("admin-token-0123456789"));
        assertFalse(s, s.contains("read-token-0123456789"));
        assertFalse(s, s.contains("hunter3"));
        assertTrue(s, s.contains("console.admin.token=***") && s.contains("console.read.token=***"));
        assertTrue(s, s.contains("mysql://cons:***@db/inbox"));
    }

    @Test
    public void null_key_or_value_is_a_java_npe_not_a_crash() {
        assertThrows(NullPointerException.class, () -> new OutboxConfig().set(null, "1"));
        assertThrows(NullPointerException.class, () -> new OutboxConfig().set("workers", (String) null));
        // Past the Java checks, the native side refuses null too.
        assertThrows(NullPointerException.class, () -> Native.configCheck(null, null));
        assertThrows(NullPointerException.class, () -> Native.configValidate(null, new String[0]));
        assertThrows(NullPointerException.class, () -> Native.start(new String[] {null}, new String[] {"x"}, null));
        assertThrows(IllegalArgumentException.class, () -> Native.start(new String[] {"workers"}, new String[0], null));
    }
}
