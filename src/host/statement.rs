//! Which statements would end a transaction behind the library's back: the rule both host
//! boundaries apply to statements a host runs through a library transaction (the C ABI's
//! `outbox_tx_execute`, Java's `OutboxTransaction`), so a consumer's handler cannot commit the
//! inbox marks with half of its work.

/// The statement `sql` starts with, in upper case, when it ends a transaction: explicitly
/// (COMMIT, ROLLBACK but not ROLLBACK TO a savepoint, BEGIN, START TRANSACTION, SET autocommit,
/// XA, LOCK/UNLOCK TABLES) or, with `implicit`, by committing implicitly (CREATE, ALTER, DROP,
/// RENAME, TRUNCATE, except of temporary tables).
pub(crate) fn ends_transaction(sql: &str, implicit: bool) -> Option<String> {
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == ';' || c == '(')
        .filter(|w| !w.is_empty())
        .take(3)
        .map(str::to_ascii_uppercase)
        .collect();
    let w = |i: usize| words.get(i).map(String::as_str).unwrap_or("");
    let explicit = match w(0) {
        "COMMIT" | "BEGIN" | "XA" | "UNLOCK" => true,
        "ROLLBACK" => w(1) != "TO",
        "START" => w(1) == "TRANSACTION",
        "LOCK" => w(1) == "TABLES" || w(1) == "TABLE",
        "SET" => {
            w(1).trim_start_matches("@@")
                .trim_start_matches("SESSION.")
                .starts_with("AUTOCOMMIT")
                || (w(1) == "SESSION" && w(2).starts_with("AUTOCOMMIT"))
        }
        _ => false,
    };
    let ddl = implicit && matches!(w(0), "CREATE" | "ALTER" | "DROP" | "RENAME" | "TRUNCATE") && w(1) != "TEMPORARY";
    (explicit || ddl).then(|| words.iter().take(2).cloned().collect::<Vec<_>>().join(" "))
}

#[cfg(test)]
mod tests {
    use super::ends_transaction;

    #[test]
    fn statements_that_end_a_transaction_are_recognised() {
        for sql in [
            "COMMIT",
            " commit work",
            "ROLLBACK;",
            "begin",
            "START TRANSACTION READ ONLY",
            "SET autocommit = 1",
            "SET @@autocommit=0",
            "set session autocommit = 1",
            "XA START 'x'",
            "LOCK TABLES t WRITE",
            "UNLOCK TABLES",
        ] {
            assert!(ends_transaction(sql, false).is_some(), "{sql}");
            assert!(ends_transaction(sql, true).is_some(), "{sql}");
        }
        for sql in [
            "ROLLBACK TO SAVEPOINT a",
            "SAVEPOINT a",
            "INSERT INTO commits VALUES (1)",
            "SELECT 'COMMIT'",
            "SET @x = 1",
            "SET SESSION innodb_lock_wait_timeout = 1",
            "UPDATE t SET begin = 1",
            "CREATE TABLE t (x INT)",
        ] {
            assert!(ends_transaction(sql, false).is_none(), "{sql}");
        }
        for sql in [
            "create table t (x int)",
            "TRUNCATE credits",
            "DROP TABLE t",
            "ALTER TABLE t ADD y INT",
        ] {
            assert!(ends_transaction(sql, true).is_some(), "{sql}");
        }
        assert_eq!(
            ends_transaction("truncate credits", true).as_deref(),
            Some("TRUNCATE CREDITS")
        );
        assert!(ends_transaction("CREATE TEMPORARY TABLE t (x INT)", true).is_none());
        assert_eq!(ends_transaction("commit", true).as_deref(), Some("COMMIT"));
    }
}
