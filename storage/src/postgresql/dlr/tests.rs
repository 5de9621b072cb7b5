//! Unit tests of the PostgreSQL DLR store's parts that need no database: value encoding,
//! URL redaction, rounds. The store itself is tested against a throwaway cluster by the
//! conformance suite (`conformance/postgresql.rs`).
//!
//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).

use super::records::{DELIVERED, StoredTarget, state_code, state_of};
use super::redact;
use super::rounds::pick_round;
use crate::dlr::{DlrState, ReceiptTarget, ReplyPath};
use crate::error::FailureKind;
use crate::ids::{MessageId, Timestamp};
use crate::record::Address;

#[test]
fn states_round_trip_as_smpp_message_states() {
    for s in [
        DlrState::Delivered,
        DlrState::Expired,
        DlrState::Deleted,
        DlrState::Undeliverable,
        DlrState::Unknown,
        DlrState::Rejected,
        DlrState::Refused,
    ] {
        assert_eq!(state_of(state_code(s)), Some(s));
    }
    assert_eq!(state_code(DlrState::Delivered), DELIVERED);
    assert_eq!(state_of(0), None);
}

#[test]
fn targets_round_trip_and_reject_newer_versions() {
    let t = ReceiptTarget {
        submit_id: MessageId::generate(),
        account: "esme1".into(),
        reply: ReplyPath::Http {
            url: "http://127.0.0.1/cb".into(),
        },
        source: Address::new(5, 0, "Sendium"),
        destination: Address::new(1, 1, "447700900123"),
        submitted_at: Timestamp(1234),
        failure_only: true,
    };
    let json = serde_json::to_string(&StoredTarget::of(&t)).unwrap();
    assert!(json.contains("\"reply\":\"http\"") && json.contains("\"failure_only\":true"));
    let back: StoredTarget = serde_json::from_str(&json).unwrap();
    assert_eq!(back.into_target().unwrap(), t);
    let newer = json.replace("\"v\":1", "\"v\":2");
    let back: StoredTarget = serde_json::from_str(&newer).unwrap();
    assert_eq!(back.into_target().unwrap_err().0, FailureKind::UnsupportedVersion);
    let kannel = ReceiptTarget {
        reply: ReplyPath::Kannel {
            url: "http://127.0.0.1/dlr?type=%d".into(),
            mask: 19,
        },
        ..t
    };
    let json = serde_json::to_string(&StoredTarget::of(&kannel)).unwrap();
    assert!(
        json.contains("\"reply\":\"kannel\"") && json.contains("\"mask\":19"),
        "{json}"
    );
    let back: StoredTarget = serde_json::from_str(&json).unwrap();
    assert_eq!(back.into_target().unwrap(), kannel);
}

#[test]
fn urls_are_redacted() {
    let url = "postgres://u:hunter2@h/db";
    assert_eq!(redact("bad postgres://u:hunter2@h/db", url), "bad <url>");
    assert_eq!(redact("x hunter2 y", url), "x <password> y");
}

#[test]
fn rounds_keep_order_between_conflicting_items() {
    let keys = [vec![1], vec![2], vec![1, 3], vec![3], vec![4]];
    let (now, later) = pick_round(&[0, 1, 2, 3, 4], |i| keys[i].iter().copied());
    assert_eq!(now, vec![0, 1, 4]);
    assert_eq!(later, vec![2, 3]);
}
