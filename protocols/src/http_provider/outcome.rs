//! What an HTTP provider's answer (or its absence) means for a submission, in the terms
//! the destination worker already acts on ([`SubmitFailure`]).

use std::sync::atomic::{AtomicU64, Ordering};

use http::StatusCode;

use crate::http_client::Error;
use crate::smpp::client::SubmitFailure;

/// `ESME_RSYSERR`: what a 5xx is reported as (retried).
pub const SERVER_ERROR: u32 = 0x08;
/// `ESME_RTHROTTLED`: what a 429 is reported as (retried, counts towards failover).
pub const THROTTLED: u32 = 0x58;
/// `ESME_RSUBMITFAIL`: a 2xx without a readable message id (ends the branch).
pub const NO_MESSAGE_ID: u32 = 0x45;
/// `ESME_RINVSCHED`: a message scheduled for later, at a destination whose `fields` do
/// not carry `{deliver_at}` (it would be delivered at once).
pub const SCHEDULE_NOT_CARRIED: u32 = 0x61;

/// The status class a request ended in, the `class` label of
/// `sendium_http_destination_requests_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Ok,
    ClientError,
    Throttled,
    ServerError,
    Timeout,
    Error,
}

impl Class {
    pub const ALL: [Class; 6] = [
        Class::Ok,
        Class::ClientError,
        Class::Throttled,
        Class::ServerError,
        Class::Timeout,
        Class::Error,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Class::Ok => "2xx",
            Class::ClientError => "4xx",
            Class::Throttled => "429",
            Class::ServerError => "5xx",
            Class::Timeout => "timeout",
            Class::Error => "error",
        }
    }
}

/// Requests a destination sent since it started, counted by the class they ended in:
/// what `/admin/destinations` shows beside the `/metrics` counter.
#[derive(Debug, Default)]
pub struct ResultCounts([AtomicU64; Class::ALL.len()]);

impl ResultCounts {
    pub fn record(&self, class: Class) {
        self.0[class as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Each class's label with its count.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        Class::ALL
            .iter()
            .map(|c| (c.label(), self.0[*c as usize].load(Ordering::Relaxed)))
            .collect()
    }
}

/// The class of an answer's status.
pub fn class_of(status: StatusCode) -> Class {
    match status.as_u16() {
        200..=299 => Class::Ok,
        429 => Class::Throttled,
        500..=599 => Class::ServerError,
        _ => Class::ClientError,
    }
}

/// An answer that is not a success: 429 and 5xx are transient (the worker retries
/// them, and fails over if they last), any other status ends the branch with a REJECTD
/// receipt whose error code is the HTTP status.
pub fn failure_of(status: StatusCode) -> SubmitFailure {
    match class_of(status) {
        Class::Throttled => SubmitFailure::Status(THROTTLED),
        Class::ServerError => SubmitFailure::Status(SERVER_ERROR),
        _ => SubmitFailure::Status(u32::from(status.as_u16())),
    }
}

/// A request that got no answer. `NotBound` when nothing can have reached the provider
/// (retried here); `Disconnected`/`Timeout` when it may have (the worker moves the
/// branch on at once, at least once).
pub fn failure_of_error(e: &Error) -> (SubmitFailure, Class, bool) {
    match e {
        Error::Timeout(_) => (SubmitFailure::Timeout, Class::Timeout, false),
        Error::Forbidden | Error::Resolve(_) | Error::Connect(_) | Error::Trust(_) | Error::Tls(_) | Error::Closed => {
            (SubmitFailure::NotBound, Class::Error, true)
        }
        _ => (SubmitFailure::Disconnected, Class::Error, false),
    }
}

/// The message id at `pointer` (RFC 6901) of a JSON answer: a string, or a number
/// written in decimal. `None` when the body is not JSON or holds nothing usable there.
pub fn message_id(body: &[u8], pointer: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    match v.pointer(pointer)? {
        serde_json::Value::String(s) if !s.is_empty() => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_classified() {
        let s = |c| StatusCode::from_u16(c).unwrap();
        assert_eq!(class_of(s(201)), Class::Ok);
        assert_eq!(failure_of(s(429)), SubmitFailure::Status(THROTTLED));
        assert!(failure_of(s(429)).is_transient());
        assert_eq!(failure_of(s(503)), SubmitFailure::Status(SERVER_ERROR));
        assert!(failure_of(s(500)).is_transient());
        assert_eq!(failure_of(s(400)), SubmitFailure::Status(400));
        assert!(!failure_of(s(400)).is_transient());
        assert!(!failure_of(s(404)).is_transient());
        assert_eq!(class_of(s(302)), Class::ClientError);
        assert_eq!(Class::Throttled.label(), "429");
    }

    #[test]
    fn errors_are_classified() {
        let (f, c, conn) = failure_of_error(&Error::Timeout(std::time::Duration::from_secs(1)));
        assert_eq!((f, c, conn), (SubmitFailure::Timeout, Class::Timeout, false));
        let (f, _, conn) = failure_of_error(&Error::Connect(std::io::Error::other("refused")));
        assert_eq!((f, conn), (SubmitFailure::NotBound, true));
        assert!(f.is_transient());
    }

    #[test]
    fn message_ids_by_pointer() {
        assert_eq!(
            message_id(br#"{"data":[{"id":"ab-1"}]}"#, "/data/0/id").as_deref(),
            Some("ab-1")
        );
        assert_eq!(message_id(br#"{"id":12345}"#, "/id").as_deref(), Some("12345"));
        assert_eq!(
            message_id(br#"{"a/b":{"m~n":"x"}}"#, "/a~1b/m~0n").as_deref(),
            Some("x")
        );
        assert_eq!(message_id(br#"{"id":null}"#, "/id"), None);
        assert_eq!(message_id(br#"{"id":""}"#, "/id"), None);
        assert_eq!(message_id(b"not json", "/id"), None);
        assert_eq!(message_id(br#"{"x":1}"#, "/id"), None);
    }
}
