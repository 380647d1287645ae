package io.outbox;

import java.net.URI;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.concurrent.ThreadLocalRandom;

/**
 * A database of its own for one test class, {@code outbox_j_<random>}, created on the MariaDB
 * server of {@code $OUTBOX_TEST_MYSQL} (default {@code mysql://root@127.0.0.1:3306}), migrated by
 * the library and dropped at the end.
 */
final class TestDb implements AutoCloseable {
    final String name;
    private final String user;
    private final String password;
    private final String hostPort;

    TestDb() {
        String server = System.getenv().getOrDefault("OUTBOX_TEST_MYSQL", "mysql://root@127.0.0.1:3306");
        URI u = URI.create(server);
        String info = u.getUserInfo() == null ? "root" : u.getUserInfo();
        int colon = info.indexOf(':');
        user = colon < 0 ? info : info.substring(0, colon);
        password = colon < 0 ? "" : info.substring(colon + 1);
        hostPort = u.getHost() + ":" + (u.getPort() < 0 ? 3306 : u.getPort());
        name = String.format("outbox_j_%08x", ThreadLocalRandom.current().nextInt());
        try (Connection c = DriverManager.getConnection(jdbcUrl(""), user, password); Statement s = c.createStatement()) {
            s.execute("CREATE DATABASE " + name);
        } catch (SQLException e) {
            throw new AssertionError("MariaDB on " + hostPort + " (set $OUTBOX_TEST_MYSQL): " + e.getMessage(), e);
        }
    }

    private String jdbcUrl(String db) {
        return "jdbc:mariadb://" + hostPort + "/" + db;
    }

    /** The library's URL for this database. */
    String url() {
        return "mysql://" + user + (password.isEmpty() ? "" : ":" + password) + "@" + hostPort + "/" + name;
    }

    /** An enqueue-only config for this database (fast scans, for tests that relay). */
    OutboxConfig config() {
        return new OutboxConfig().set("db.url", url()).set("publisher", "none");
    }

    /** A new JDBC connection to this database. */
    Connection connect() throws SQLException {
        return DriverManager.getConnection(jdbcUrl(name), user, password);
    }

    long count(String sqlWhere) throws SQLException {
        try (Connection c = connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT COUNT(*) FROM t_event_record" + (sqlWhere.isEmpty() ? "" : " WHERE " + sqlWhere))) {
            rs.next();
            return rs.getLong(1);
        }
    }

    String status(long id) throws SQLException {
        try (Connection c = connect(); Statement s = c.createStatement();
                ResultSet rs = s.executeQuery("SELECT status FROM t_event_record WHERE id = " + id)) {
            return rs.next() ? rs.getString(1) : null;
        }
    }

    @Override
    public void close() {
        try (Connection c = DriverManager.getConnection(jdbcUrl(""), user, password); Statement s = c.createStatement()) {
            s.execute("DROP DATABASE IF EXISTS " + name);
        } catch (SQLException e) {
            System.err.println("could not drop " + name + ": " + e.getMessage());
        }
    }
}
