//! Events: as the caller writes them (`NewEvent`, validated) and as a relay claimed them
//! (`OutboundEvent`, ready to be sent).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::Error;

/// The id of an event row (`t_event_record.id`).
pub type EventId = u64;

/// Longest `biz_no` accepted (the column is `VARCHAR(64)`).
pub const MAX_BIZ_NO_CHARS: usize = 64;
/// Longest `event_type` accepted (the column is `VARCHAR(64)`).
pub const MAX_EVENT_TYPE_CHARS: usize = 64;
/// Longest topic or tag accepted (the columns are `VARCHAR(127)`).
pub const MAX_TOPIC_CHARS: usize = 127;

/// An event to write into the outbox table in the caller's transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewEvent {
    /// Business key (order number). Required; also the ordering key with `ordering=per-biz-no`.
    pub biz_no: String,
    /// Event type (`ORDER_CREATED`). Required; the default message tag.
    pub event_type: String,
    /// Message body, sent as is. Required, at most `payload.max.bytes`.
    pub payload: Vec<u8>,
    /// Topic for this event; `None` uses the configured default topic.
    pub topic: Option<String>,
    /// Message tag; `None` uses the event type.
    pub tag: Option<String>,
    /// Extra message properties.
    pub headers: BTreeMap<String, String>,
    /// When to send it (`docs/scheduling.md`); `None`: as soon as it commits.
    pub schedule: Option<Schedule>,
}

/// The longest an event may be scheduled ahead (366 days): a larger delay or a later time is a
/// mistake (milliseconds taken for seconds, a year typed wrong) more often than an intent.
pub const MAX_SCHEDULE_AHEAD: Duration = Duration::from_secs(366 * 24 * 3600);

/// When a scheduled event is due. Either way the database's clock decides when it is sent, as it
/// does every other time of the outbox: `After` counts from the INSERT's `NOW(3)`, and `At` is
/// compared with the database's `NOW(3)` (a time already past sends it at once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// At this wall-clock time (milliseconds are kept).
    At(SystemTime),
    /// This long after the INSERT (the database's clock).
    After(Duration),
}

impl Schedule {
    /// An absolute time as milliseconds since the Unix epoch (C, Java and Go pass this).
    pub fn at_unix_ms(ms: i64) -> Result<Schedule, Error> {
        if ms < 0 {
            return Err(invalid(
                "schedule",
                format!("deliver_at_ms {ms} is before 1970 (milliseconds since the Unix epoch expected)"),
            ));
        }
        Ok(Schedule::At(UNIX_EPOCH + Duration::from_millis(ms as u64)))
    }

    /// The schedule the C, Java and Go bindings pass: `deliver_at_ms` (milliseconds since the
    /// Unix epoch) or `delay_ms` (from the INSERT), 0 for the one not set; both 0: none (sent
    /// as soon as it commits). Both set, a negative value: an error naming it.
    pub fn from_millis(deliver_at_ms: i64, delay_ms: i64) -> Result<Option<Schedule>, Error> {
        match (deliver_at_ms, delay_ms) {
            (0, 0) => Ok(None),
            (_, d) if d < 0 => Err(invalid(
                "schedule",
                format!("delay_ms {d} is negative (a delay from the INSERT, in milliseconds)"),
            )),
            (0, d) => Ok(Some(Schedule::After(Duration::from_millis(d as u64)))),
            (a, 0) => Schedule::at_unix_ms(a).map(Some),
            (a, d) => Err(invalid(
                "schedule",
                format!("deliver_at_ms {a} and delay_ms {d} are both set: set one of them"),
            )),
        }
    }

    /// The values of the scheduled INSERT's `deliver_at_ms` and `delay_ms` parameters
    /// ([`INSERT_SCHEDULED_PARAMS`](crate::INSERT_SCHEDULED_PARAMS)).
    pub fn params(schedule: Option<&Schedule>) -> (Option<i64>, Option<i64>) {
        match schedule {
            None => (None, None),
            Some(Schedule::At(t)) => (
                Some(t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)),
                None,
            ),
            Some(Schedule::After(d)) => (None, Some(d.as_millis().min(i64::MAX as u128) as i64)),
        }
    }

    /// Checks the bound ([`MAX_SCHEDULE_AHEAD`], against this host's clock for `At`): the error
    /// names the value. A time in the past is accepted (the event is due at once).
    pub fn validate(&self) -> Result<(), Error> {
        let days = |d: Duration| d.as_secs_f64() / 86_400.0;
        match *self {
            Schedule::After(d) if d > MAX_SCHEDULE_AHEAD => Err(invalid(
                "schedule",
                format!(
                    "delay {} ms ({:.1} days) is longer than the most an event may wait, {} days",
                    d.as_millis(),
                    days(d),
                    days(MAX_SCHEDULE_AHEAD)
                ),
            )),
            Schedule::At(t) => {
                let ms = t.duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
                match t.duration_since(SystemTime::now()) {
                    Ok(ahead) if ahead > MAX_SCHEDULE_AHEAD => Err(invalid(
                        "schedule",
                        format!(
                            "deliver_at_ms {ms} is {:.1} days ahead, more than the most an event may wait, {} days",
                            days(ahead),
                            days(MAX_SCHEDULE_AHEAD)
                        ),
                    )),
                    _ => Ok(()),
                }
            }
            Schedule::After(_) => Ok(()),
        }
    }
}

impl NewEvent {
    pub fn new(biz_no: impl Into<String>, event_type: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        NewEvent {
            biz_no: biz_no.into(),
            event_type: event_type.into(),
            payload: payload.into(),
            ..Default::default()
        }
    }

    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }

    pub fn with_tag(mut self, tag: impl Into<String>) -> Self {
        self.tag = Some(tag.into());
        self
    }

    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key.into(), value.into());
        self
    }

    /// Sends the event at `at` (the database's clock decides; a time past sends it at once).
    pub fn deliver_at(mut self, at: SystemTime) -> Self {
        self.schedule = Some(Schedule::At(at));
        self
    }

    /// Sends the event `delay` after its INSERT (the database's clock).
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.schedule = Some(Schedule::After(delay));
        self
    }

    /// The caller's W3C trace context (docs/tracing.md): stored with the row and sent as the
    /// `traceparent` and `tracestate` message properties. Checked by [`NewEvent::validate`].
    pub fn with_trace_context(mut self, traceparent: impl Into<String>, tracestate: Option<String>) -> Self {
        self.headers.insert(crate::wire::TRACEPARENT.into(), traceparent.into());
        match tracestate {
            Some(ts) => self.headers.insert(crate::wire::TRACESTATE.into(), ts),
            None => self.headers.remove(crate::wire::TRACESTATE),
        };
        self
    }

    /// Checks every field; the error names the first field that is wrong and why.
    pub fn validate(&self, payload_max_bytes: usize) -> Result<(), Error> {
        text_field("biz_no", &self.biz_no, MAX_BIZ_NO_CHARS)?;
        text_field("event_type", &self.event_type, MAX_EVENT_TYPE_CHARS)?;
        if self.payload.is_empty() {
            return Err(invalid("payload", "must not be empty".into()));
        }
        if self.payload.len() > payload_max_bytes {
            return Err(invalid(
                "payload",
                format!(
                    "is {} bytes, more than payload.max.bytes = {payload_max_bytes}",
                    self.payload.len()
                ),
            ));
        }
        if let Some(topic) = &self.topic {
            text_field("topic", topic, MAX_TOPIC_CHARS)?;
            if !topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '%' || c == '|')
            {
                return Err(invalid(
                    "topic",
                    format!("{topic:?} has characters other than [A-Za-z0-9_%|-]"),
                ));
            }
        }
        if let Some(tag) = &self.tag {
            text_field("tag", tag, MAX_TOPIC_CHARS)?;
        }
        for (k, v) in &self.headers {
            if k.is_empty() || k.contains(['\0', '\u{1}', '\u{2}']) {
                return Err(invalid(
                    "headers",
                    format!("key {k:?} is empty or has control characters"),
                ));
            }
            if crate::wire::is_reserved(k) {
                return Err(invalid("headers", format!("key {k:?} is reserved (set by the relay)")));
            }
            if v.contains(['\0', '\u{1}', '\u{2}']) {
                return Err(invalid("headers", format!("value of {k:?} has control characters")));
            }
        }
        if let Some(schedule) = &self.schedule {
            schedule.validate()?;
        }
        crate::trace::check_headers(&self.headers)
    }

    /// The headers as stored in the `headers` column (a JSON object), or `None` when empty:
    /// the value hosts bind for the `headers` parameter of `insert_statement`.
    pub fn headers_json(&self) -> Option<String> {
        if self.headers.is_empty() {
            None
        } else {
            Some(serde_json::to_string(&self.headers).expect("a string map always serialises"))
        }
    }
}

/// One claimed event, ready to be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundEvent {
    /// Row id; also the message key and the `eventId` property (unique within one table).
    pub id: EventId,
    /// The dedup key, unique across outbox tables and databases (the row's `event_key`, given
    /// one at its first claim): the `eventKey` property, what consumers' inboxes key on.
    pub key: String,
    pub biz_no: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    /// The row's topic, or the configured default when the row has none.
    pub topic: String,
    /// The row's tag, if it set one. Publishers fall back to their own default (the event type).
    pub tag: Option<String>,
    /// Extra user properties stored with the row.
    pub headers: BTreeMap<String, String>,
    /// Attempts already made before this one (the row's `retry_count` when it was claimed).
    pub attempt: u32,
    /// When the row was written (its `create_time`, the database's clock), in milliseconds since
    /// the Unix epoch; 0 when unknown. Sent as the `eventCreatedAt` property, from which a
    /// consumer measures commit → credited.
    pub created_ms: u64,
}

fn text_field(field: &'static str, value: &str, max_chars: usize) -> Result<(), Error> {
    if value.trim().is_empty() {
        return Err(invalid(field, "is required and must not be blank".into()));
    }
    let n = value.chars().count();
    if n > max_chars {
        return Err(invalid(field, format!("is {n} characters, more than {max_chars}")));
    }
    if value.contains('\0') {
        return Err(invalid(field, "contains a NUL character".into()));
    }
    Ok(())
}

fn invalid(field: &'static str, reason: String) -> Error {
    Error::InvalidEvent { field, reason }
}

/// Parses the `headers` column back into a map; a malformed value yields an empty map and a
/// warning rather than a stuck row.
pub(crate) fn parse_headers(id: EventId, raw: Option<&str>) -> BTreeMap<String, String> {
    match raw {
        None | Some("") => BTreeMap::new(),
        Some(s) => serde_json::from_str(s).unwrap_or_else(|e| {
            log::warn!("event {id}: headers column is not a JSON string map ({e}); sending without them");
            BTreeMap::new()
        }),
    }
}

/// The longest event key stored (`event_key` is `CHAR(36)`: a UUID in its text form).
pub const EVENT_KEY_CHARS: usize = 36;

/// A new event key: a UUID version 7 in its 36-character text form (48 bits of Unix time in
/// milliseconds, then 74 random bits). Unique across outbox tables and databases without
/// coordination, and time-ordered. The relay gives one to every row it claims without a key and
/// stores it with the row, so every copy of the event carries the same key.
pub fn new_event_key() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let r: u128 = rand::random();
    let mut v: u128 = (u128::from(ms) & 0xFFFF_FFFF_FFFF) << 80;
    v |= 0x7 << 76; // version 7
    v |= ((r >> 64) & 0x0FFF) << 64; // rand_a: 12 bits
    v |= 0b10 << 62; // variant RFC 9562
    v |= r & 0x3FFF_FFFF_FFFF_FFFF; // rand_b: 62 bits
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod key_tests {
    use super::*;

    #[test]
    fn event_keys_are_version_7_uuids_and_distinct() {
        let a = new_event_key();
        let b = new_event_key();
        assert_ne!(a, b);
        assert_eq!(a.len(), EVENT_KEY_CHARS);
        let parts: Vec<&str> = a.split('-').collect();
        assert_eq!(
            parts.iter().map(|p| p.len()).collect::<Vec<_>>(),
            [8, 4, 4, 4, 12],
            "{a}"
        );
        assert!(parts[2].starts_with('7'), "version 7: {a}");
        assert!(matches!(&parts[3][..1], "8" | "9" | "a" | "b"), "variant: {a}");
        assert!(a
            .bytes()
            .all(|c| c == b'-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // The time prefix: later keys sort after earlier ones (different milliseconds).
        let ms_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let ms_key = u64::from_str_radix(&a.replace('-', "")[..12], 16).unwrap();
        assert!(ms_now.abs_diff(ms_key) < 60_000);
    }
}
