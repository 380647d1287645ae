//! The stable queue set of an ordered topic, and which queue a key goes to (`ordering =
//! per-biz-no`, see `docs/ordering.md`). Broker-neutral: a publisher that sends each key to one
//! queue of its topic (the RocketMQ one) keeps the set here, in `outbox_topic_queue`, so every
//! instance and every restart hashes a key to the same queue whether or not each broker is in
//! the route right now.

use std::collections::HashMap;

use crate::wire::QueueRef;

/// The form of a `biz_no` that picks its queue: what the database's default collation compares
/// (letter case and trailing spaces ignored), so spellings the database treats as one key share
/// a queue. An approximation of the collation for non-ASCII letters, which only matters for keys
/// that differ in nothing else.
pub fn queue_key(biz_no: &str) -> String {
    biz_no.trim_end_matches(' ').to_uppercase()
}

/// The index of the queue of `biz_no` among `n` queues of the stable set: FNV-1a of
/// [`queue_key`], modulo `n`. Never changes for a given key and `n`.
pub fn queue_index(biz_no: &str, n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    let h = queue_key(biz_no).bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    (h % n as u64) as usize
}

/// The queue book: the stable queue set of each ordered topic, kept in `outbox_topic_queue` so
/// every instance (and every restart) hashes keys over the same set, whether or not each broker
/// is in the route right now. Queues are only ever added (a broker seen for the first time);
/// adding one moves some keys to other queues, which is why it is logged at WARN.
pub struct QueueBook {
    pool: mysql::Pool,
    /// Per topic: the set, and when it was read.
    cache: parking_lot::Mutex<HashMap<String, (std::time::Instant, Vec<QueueRef>)>>,
}

/// How long a cached queue set is used before it is read again, so every instance learns within
/// this time the queues another one added.
const BOOK_TTL: std::time::Duration = std::time::Duration::from_secs(30);

impl QueueBook {
    pub fn new(pool: mysql::Pool) -> QueueBook {
        QueueBook {
            pool,
            cache: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// Fails with the database's message when the book's table is missing (migration V6).
    pub fn check(&self) -> crate::error::Result<()> {
        use mysql::prelude::Queryable;
        self.pool
            .get_conn()?
            .query_drop("SELECT topic FROM outbox_topic_queue LIMIT 0")?;
        Ok(())
    }

    /// The stable queue set of `topic`, sorted, after adding the queues of `live` (the route as
    /// the client sees it now, queues of `topic`) that the book did not hold. Reads the database only when `live`
    /// holds a queue the cached set lacks, or nothing is cached yet.
    pub fn queues(&self, topic: &str, live: &[QueueRef]) -> crate::error::Result<Vec<QueueRef>> {
        if let Some((at, known)) = self.cache.lock().get(topic) {
            if at.elapsed() < BOOK_TTL && live.iter().all(|q| known.binary_search(q).is_ok()) {
                return Ok(known.clone());
            }
        }
        let set = self.merge(topic, live)?;
        self.cache
            .lock()
            .insert(topic.to_string(), (std::time::Instant::now(), set.clone()));
        Ok(set)
    }

    /// The size of `topic`'s queue set as last read, if it was, without any I/O (expired or
    /// not): enough to tell which queue of the set a key hashes to, as a hint.
    pub fn cached_len(&self, topic: &str) -> Option<usize> {
        self.cache
            .lock()
            .get(topic)
            .map(|(_, set)| set.len())
            .filter(|&n| n > 0)
    }

    /// Forgets the cached sets, so the next call reads what other instances added.
    pub fn refresh(&self) {
        self.cache.lock().clear();
    }

    fn merge(&self, topic: &str, live: &[QueueRef]) -> crate::error::Result<Vec<QueueRef>> {
        use mysql::prelude::Queryable;
        let mut conn = self.pool.get_conn()?;
        let read = |conn: &mut mysql::PooledConn| -> crate::error::Result<Vec<QueueRef>> {
            let rows: Vec<(String, u32)> = conn.exec(
                "SELECT broker_name, queue_id FROM outbox_topic_queue WHERE topic = ? ORDER BY broker_name, queue_id",
                (topic,),
            )?;
            let mut v: Vec<QueueRef> = rows
                .into_iter()
                .map(|(broker, queue_id)| QueueRef {
                    topic: topic.to_string(),
                    broker,
                    queue_id,
                })
                .collect();
            v.sort();
            Ok(v)
        };
        let before = read(&mut conn)?;
        let new: Vec<&QueueRef> = live.iter().filter(|q| before.binary_search(q).is_err()).collect();
        if new.is_empty() {
            return Ok(before);
        }
        conn.exec_batch(
            "INSERT IGNORE INTO outbox_topic_queue (topic, broker_name, queue_id) VALUES (?, ?, ?)",
            new.iter().map(|q| (topic, q.broker.as_str(), q.queue_id)),
        )?;
        let after = read(&mut conn)?;
        let added: Vec<String> = new.iter().map(|q| q.in_topic()).collect();
        if before.is_empty() {
            log::info!("ordered topic {topic}: queue set {}", join(&after));
        } else {
            log::warn!(
                "ordered topic {topic}: queues {} joined the queue set (now {} queues); keys hashed \
                 to them move, so events of a key still in flight on its old queue may be read \
                 after newer ones",
                added.join(", "),
                after.len()
            );
        }
        Ok(after)
    }
}

fn join(qs: &[QueueRef]) -> String {
    qs.iter().map(QueueRef::in_topic).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_index_is_stable_and_ignores_case_and_trailing_spaces() {
        assert_eq!(queue_index("ord-7", 16), queue_index("ORD-7  ", 16));
        let spread: std::collections::HashSet<usize> = (0..200).map(|i| queue_index(&format!("K{i}"), 8)).collect();
        assert_eq!(spread.len(), 8, "200 keys reach every one of 8 queues");
        assert_eq!(queue_index("x", 0), 0);
    }
}
