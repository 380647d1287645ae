//! Client errors, classified by their canonical descriptor into what the relay does with the
//! event ([`FailureKind`]), and described in one line for logs and `last_error`.

use rocketmq_client_rust::{ClientError, MQBrokerException, MQClientException};
use rocketmq_error::{CanonicalCondition, ErrorDescriptor};

use crate::publisher::{FailureKind, SendError};

/// The client's own error codes (`ClientErrorCode` in the client, which does not export them).
mod client_code {
    pub const CONNECT_BROKER_EXCEPTION: i32 = 10001;
    pub const ACCESS_BROKER_TIMEOUT: i32 = 10002;
    pub const BROKER_NOT_EXIST_EXCEPTION: i32 = 10003;
    pub const NO_NAME_SERVER_EXCEPTION: i32 = 10004;
    pub const NOT_FOUND_TOPIC_EXCEPTION: i32 = 10005;
    pub const REQUEST_TIMEOUT_EXCEPTION: i32 = 10006;
}

/// Broker response codes that mean "the broker as a whole cannot take messages now".
mod broker_code {
    /// From the name server: no live broker serves the topic. From a broker: it has no such topic.
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
}

/// How the message of a send that found no route for its topic begins. Whether that is the
/// broker's absence (no attempt used) or a topic that does not exist (an attempt) is decided
/// after the send, by [`RocketMqPublisher::judge_missing_routes`].
pub(super) const NO_ROUTE: &str = "no route for the topic";

pub(super) fn to_send_error(e: &ClientError) -> SendError {
    if is_route_missing(e) {
        return SendError::unavailable(format!("{NO_ROUTE}: {}", describe(e)));
    }
    SendError::new(classify(e), describe(e))
}

/// Whether the send failed because no route to its topic was found: the name server knows no
/// live broker serving it. Either every broker is gone (an outage) or the topic does not exist.
fn is_route_missing(e: &ClientError) -> bool {
    use rocketmq_error as re;
    // (A broker that answers a send with TOPIC_NOT_EXIST is up: that topic is refused.)
    is(e.descriptor(), &[&re::ROUTE_TOPIC_NOT_FOUND])
        || e.source_ref::<MQClientException>().is_some_and(|c| {
            matches!(
                c.response_code(),
                broker_code::TOPIC_NOT_EXIST | client_code::NOT_FOUND_TOPIC_EXCEPTION
            )
        })
}

/// A one-line description of a client error: its canonical code and message, plus what the
/// client or the broker said (never credentials: the client's errors do not carry them).
pub fn describe(e: &ClientError) -> String {
    let mut s = e.to_string();
    if let Some(c) = e.source_ref::<MQClientException>() {
        if let Some(m) = c.error_message() {
            // The client appends a FAQ link; keep the message itself.
            let m = m.split(" For more information").next().unwrap_or(m).trim();
            s.push_str(&format!(" (client code {}: {m})", c.response_code()));
        } else {
            s.push_str(&format!(" (client code {})", c.response_code()));
        }
    }
    if let Some(code) = e.broker_response_code() {
        let name = match code {
            1 => " SYSTEM_ERROR",
            2 => " SYSTEM_BUSY",
            13 => " MESSAGE_ILLEGAL",
            14 => " SERVICE_NOT_AVAILABLE",
            16 => " NO_PERMISSION",
            17 => " TOPIC_NOT_EXIST",
            _ => "",
        };
        s.push_str(&format!(" (broker response code {code}{name})"));
        if let Some(m) = e.source_ref::<MQBrokerException>().and_then(|b| b.error_message()) {
            s.push_str(&format!(": {m}"));
        }
    }
    s
}

/// Whether a failed request provably never left this process: the connection was refused or
/// could not be made, or the transport failed in a phase before anything was written (connect,
/// endpoint validation, before the write). Anything else may have reached the broker.
fn never_left(e: &ClientError) -> bool {
    let shared = e.clone().into_shared_error();
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(shared.as_ref());
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            ) {
                return true;
            }
        }
        if let Some(canonical) = err.downcast_ref::<rocketmq_error::Error>() {
            if let Ok(view) = canonical.diagnostic_view() {
                let before_write = view.fields().any(|f| {
                    f.name() == "phase"
                        && matches!(
                            f.value(),
                            rocketmq_error::ViewValueRef::Text("connect" | "endpoint_validation" | "before_write")
                        )
                });
                if before_write {
                    return true;
                }
            }
        }
        current = err.source();
    }
    false
}

fn is(d: &ErrorDescriptor, candidates: &[&'static ErrorDescriptor]) -> bool {
    candidates.iter().any(|c| c.code() == d.code())
}

/// Classifies a client error by its canonical descriptor (and, for the descriptors that wrap a
/// code, by the client's or the broker's response code).
///
/// - [`FailureKind::Unavailable`]: the request provably never reached a broker that could store
///   it: no route for the topic, the connection refused or not made (the transport failed while
///   connecting, before anything was written), the producer not running, the broker busy or not
///   serving (it answered, refusing).
/// - [`FailureKind::Timeout`]: the outcome is unknown: no answer within the budget, or a
///   connection lost once the request may have been written (a stalled broker: the kernel
///   accepts and buffers, the broker stores the request when it resumes). Counted as an attempt
///   and as a possible duplicate.
/// - [`FailureKind::Rejected`]: the message itself was refused (too large, invalid, bad topic,
///   no permission), or an error nobody classified (counted, so a poison message ends FAIL).
pub fn classify(e: &ClientError) -> FailureKind {
    use rocketmq_error as re;
    if is_route_missing(e) {
        return FailureKind::Unavailable;
    }
    let d = e.descriptor();
    // A connection that failed: free only if nothing can have been written.
    if is(
        d,
        &[
            &re::TRANSPORT_CONNECTION_FAILED,
            &re::TRANSPORT_SESSION_FAILED,
            &re::TRANSPORT_DISPATCH_FAILED,
        ],
    ) {
        return if never_left(e) {
            FailureKind::Unavailable
        } else {
            FailureKind::Timeout
        };
    }
    if is(
        d,
        &[
            &re::TRANSPORT_CONNECTION_TIMEOUT,
            &re::TRANSPORT_DNS_FAILED,
            &re::TRANSPORT_START_FAILED,
            &re::TRANSPORT_ENDPOINT_INVALID,
            &re::TRANSPORT_ADMISSION_QUEUE_SATURATED,
            &re::TRANSPORT_REMOTE_RATE_LIMITED,
            &re::ROUTE_TOPIC_NOT_FOUND,
            &re::ROUTE_CLUSTER_NOT_FOUND,
            &re::BROKER_LOOKUP_NOT_FOUND,
            &re::BROKER_LEADERSHIP_NOT_MASTER,
            &re::RPC_BROKER_ADDRESS_NOT_FOUND,
            &re::CLIENT_LIFECYCLE_NOT_STARTED,
            &re::CLIENT_LIFECYCLE_SHUTTING_DOWN,
            &re::CLIENT_LIFECYCLE_INVALID_STATE,
            &re::CLIENT_COMPONENT_UNAVAILABLE,
            &re::CORE_LIFECYCLE_NOT_INITIALIZED,
        ],
    ) {
        return FailureKind::Unavailable;
    }
    if is(
        d,
        &[
            &re::TRANSPORT_RESPONSE_TIMEOUT,
            &re::TRANSPORT_WRITE_TIMEOUT,
            &re::CORE_OPERATION_TIMED_OUT,
        ],
    ) {
        return FailureKind::Timeout;
    }
    if is(d, &[&re::BROKER_OPERATION_FAILED]) {
        return match e.broker_response_code() {
            Some(broker_code::SYSTEM_BUSY | broker_code::SERVICE_NOT_AVAILABLE) => FailureKind::Unavailable,
            Some(
                broker_code::FLUSH_DISK_TIMEOUT | broker_code::FLUSH_SLAVE_TIMEOUT | broker_code::SLAVE_NOT_AVAILABLE,
            ) => FailureKind::Timeout,
            _ => FailureKind::Rejected,
        };
    }
    if let Some(c) = e.source_ref::<MQClientException>() {
        // The client wraps its own conditions in an argument error with a code of its own.
        return match c.response_code() {
            client_code::CONNECT_BROKER_EXCEPTION
            | client_code::BROKER_NOT_EXIST_EXCEPTION
            | client_code::NO_NAME_SERVER_EXCEPTION
            | client_code::NOT_FOUND_TOPIC_EXCEPTION => FailureKind::Unavailable,
            client_code::ACCESS_BROKER_TIMEOUT | client_code::REQUEST_TIMEOUT_EXCEPTION => FailureKind::Timeout,
            _ => FailureKind::Rejected,
        };
    }
    if is(
        d,
        &[
            &re::BROKER_MESSAGE_TOO_LARGE,
            &re::BROKER_MESSAGE_INVALID,
            &re::BROKER_TOPIC_NOT_FOUND,
            &re::PROTOCOL_MESSAGE_PROPERTY_INVALID,
            &re::CORE_ARGUMENT_INVALID,
        ],
    ) {
        return FailureKind::Rejected;
    }
    // Anything else: go by the descriptor's canonical condition.
    match d.condition() {
        CanonicalCondition::Unavailable | CanonicalCondition::ResourceExhausted => FailureKind::Unavailable,
        CanonicalCondition::DeadlineExceeded => FailureKind::Timeout,
        _ => FailureKind::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(d: &'static ErrorDescriptor) -> ClientError {
        ClientError::from_error(rocketmq_error::Error::new(d))
    }

    fn connection_failed_in(phase: &str) -> ClientError {
        ClientError::from_error(
            rocketmq_error::Error::new(&rocketmq_error::TRANSPORT_CONNECTION_FAILED)
                .with_context(rocketmq_error::ErrorContext::new().with_text(rocketmq_error::fields::PHASE, phase)),
        )
    }

    #[test]
    fn a_connection_that_failed_is_free_only_if_nothing_can_have_been_written() {
        // Refused, or failed while connecting: the request never left.
        for phase in ["connect", "endpoint_validation", "before_write"] {
            assert_eq!(
                classify(&connection_failed_in(phase)),
                FailureKind::Unavailable,
                "{phase}"
            );
        }
        let refused = ClientError::from_error(rocketmq_error::Error::caused_by(
            &rocketmq_error::TRANSPORT_CONNECTION_FAILED,
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        ));
        assert_eq!(classify(&refused), FailureKind::Unavailable);
        // Lost while writing or waiting for the answer (a stalled broker), or no telling: the
        // broker may store it, so it is an unknown outcome (an attempt, a possible duplicate).
        for phase in ["writing", "awaiting_response", "read", "write", "closed"] {
            assert_eq!(classify(&connection_failed_in(phase)), FailureKind::Timeout, "{phase}");
        }
        assert_eq!(
            classify(&err(&rocketmq_error::TRANSPORT_CONNECTION_FAILED)),
            FailureKind::Timeout
        );
        let reset = ClientError::from_error(rocketmq_error::Error::caused_by(
            &rocketmq_error::TRANSPORT_CONNECTION_FAILED,
            std::io::Error::from(std::io::ErrorKind::ConnectionReset),
        ));
        assert_eq!(classify(&reset), FailureKind::Timeout);
    }

    #[test]
    fn broker_unreachable_errors_are_unavailable() {
        for d in [
            &rocketmq_error::TRANSPORT_CONNECTION_TIMEOUT,
            &rocketmq_error::ROUTE_TOPIC_NOT_FOUND,
            &rocketmq_error::CLIENT_LIFECYCLE_NOT_STARTED,
            &rocketmq_error::TRANSPORT_ADMISSION_QUEUE_SATURATED,
        ] {
            assert_eq!(classify(&err(d)), FailureKind::Unavailable, "{}", d.code());
        }
        assert_eq!(classify(&ClientError::not_started()), FailureKind::Unavailable);
        assert_eq!(classify(&ClientError::route_not_found("T")), FailureKind::Unavailable);
        assert_eq!(
            classify(&ClientError::broker_not_found("broker-a")),
            FailureKind::Unavailable
        );
        // What the producer returns when it has no route ("No route available", "No route info"),
        // and the name server's TOPIC_NOT_EXIST for a topic no live broker serves (a killed broker).
        for code in [10001, 10003, 10004, 10005, 17] {
            let e = ClientError::from(MQClientException::new_with_code(code, "No route available"));
            assert_eq!(classify(&e), FailureKind::Unavailable, "client code {code}");
        }
        for e in [
            ClientError::from(MQClientException::new_with_code(17, "Topic route was not found")),
            ClientError::route_not_found("T"),
        ] {
            assert!(
                to_send_error(&e).message.starts_with(NO_ROUTE),
                "judged after the send: {}",
                describe(&e)
            );
        }
        let connection = to_send_error(&connection_failed_in("connect"));
        assert!(!connection.message.starts_with(NO_ROUTE));
        for code in [2, 14] {
            let e = ClientError::broker_operation_failed("BROKER_OPERATION", code, "busy");
            assert_eq!(classify(&e), FailureKind::Unavailable, "broker code {code}");
        }
    }

    #[test]
    fn timeouts_are_unknown_outcomes() {
        assert_eq!(classify(&ClientError::timeout("send", 3000)), FailureKind::Timeout);
        assert_eq!(
            classify(&err(&rocketmq_error::TRANSPORT_RESPONSE_TIMEOUT)),
            FailureKind::Timeout
        );
        let e = ClientError::from(MQClientException::new_with_code(10006, "request timeout"));
        assert_eq!(classify(&e), FailureKind::Timeout);
        let e = ClientError::broker_operation_failed("BROKER_OPERATION", 10, "flush disk timeout");
        assert_eq!(classify(&e), FailureKind::Timeout);
    }

    #[test]
    fn message_errors_are_rejected() {
        // The client's own checks (body too large for its limit, blank topic, ...).
        let e = ClientError::from(MQClientException::new_with_code(
            13,
            "the message body size over max value",
        ));
        assert_eq!(classify(&e), FailureKind::Rejected);
        let e = ClientError::from(MQClientException::new("The specified topic is blank"));
        assert_eq!(classify(&e), FailureKind::Rejected);
        // The broker refusing the message.
        for code in [13, 16, 17, 1] {
            let e = ClientError::broker_operation_failed("BROKER_OPERATION", code, "refused");
            assert_eq!(classify(&e), FailureKind::Rejected, "broker code {code}");
        }
        let e: ClientError = MQBrokerException::new(13, "message body size exceeds").into();
        assert_eq!(classify(&e), FailureKind::Rejected);
        assert!(describe(&e).contains("13"), "{}", describe(&e));
        assert_eq!(
            classify(&ClientError::invalid_property("UNIQ_KEY")),
            FailureKind::Rejected
        );
        assert_eq!(
            classify(&err(&rocketmq_error::BROKER_MESSAGE_TOO_LARGE)),
            FailureKind::Rejected
        );
    }

    #[test]
    fn descriptions_keep_the_client_message() {
        let e = ClientError::from(MQClientException::new_with_code(
            13,
            "the message body size over max value, MAX: 4",
        ));
        let d = describe(&e);
        assert!(d.contains("client code 13") && d.contains("over max value"), "{d}");
    }
}
