//! How the PostgreSQL DLR store encodes values in its rows: conversion functions and the
//! stored shape of a receipt target; no SQL.
//!
//! Times are milliseconds since the Unix epoch (`bigint`), receipt states are SMPP
//! `message_state` numbers (`smallint`), and receipt targets are JSONB in a shape of
//! their own ([`StoredTarget`]), which the SQL also reads (the reply kind, the account,
//! whether the target is failure-only).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::dlr::{DlrState, ReceiptTarget, ReplyPath};
use crate::error::FailureKind;
use crate::ids::{MessageId, Timestamp};
use crate::record::Address;

pub(super) fn ms(t: Timestamp) -> i64 {
    i64::try_from(t.0).unwrap_or(i64::MAX)
}

pub(super) fn ts(v: i64) -> Timestamp {
    Timestamp(u64::try_from(v).unwrap_or(0))
}

pub(super) fn plus(t: i64, d: Duration) -> i64 {
    t.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// SMPP message_state numbers.
pub(super) fn state_code(s: DlrState) -> i16 {
    match s {
        DlrState::Delivered => 2,
        DlrState::Expired => 3,
        DlrState::Deleted => 4,
        DlrState::Undeliverable => 5,
        DlrState::Unknown => 7,
        DlrState::Rejected => 8,
    }
}

pub(super) fn state_of(code: i16) -> Option<DlrState> {
    Some(match code {
        2 => DlrState::Delivered,
        3 => DlrState::Expired,
        4 => DlrState::Deleted,
        5 => DlrState::Undeliverable,
        7 => DlrState::Unknown,
        8 => DlrState::Rejected,
        _ => return None,
    })
}

pub(super) const DELIVERED: i16 = 2;

/// Stored shape of a [`ReceiptTarget`] (JSONB). Its own type, so a change to the Rust
/// type cannot silently change what is on disk; `v` is the major version.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredTarget {
    v: u32,
    submit_id: Uuid,
    account: String,
    /// "smpp" or "http" (the SQL reads it to index SMPP deliveries by account).
    reply: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    source: StoredAddress,
    destination: StoredAddress,
    submitted_at: u64,
    /// Read by the resolution statement: skip this target on success.
    failure_only: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredAddress {
    ton: u8,
    npi: u8,
    addr: String,
}

const TARGET_VERSION: u32 = 1;

impl StoredTarget {
    pub(super) fn of(t: &ReceiptTarget) -> Self {
        let (reply, url) = match &t.reply {
            ReplyPath::Smpp => ("smpp", None),
            ReplyPath::Http { url } => ("http", Some(url.clone())),
        };
        let addr = |a: &Address| StoredAddress {
            ton: a.ton,
            npi: a.npi,
            addr: a.addr.clone(),
        };
        Self {
            v: TARGET_VERSION,
            submit_id: t.submit_id.as_uuid(),
            account: t.account.clone(),
            reply: reply.to_string(),
            url,
            source: addr(&t.source),
            destination: addr(&t.destination),
            submitted_at: t.submitted_at.0,
            failure_only: t.failure_only,
        }
    }

    pub(super) fn into_target(self) -> Result<ReceiptTarget, (FailureKind, String)> {
        if self.v != TARGET_VERSION {
            return Err((
                FailureKind::UnsupportedVersion,
                format!(
                    "receipt target version {} (this Sendium reads {TARGET_VERSION})",
                    self.v
                ),
            ));
        }
        let reply = match (self.reply.as_str(), self.url) {
            ("smpp", _) => ReplyPath::Smpp,
            ("http", Some(url)) => ReplyPath::Http { url },
            (other, _) => return Err((FailureKind::Corrupt, format!("receipt target reply {other:?}"))),
        };
        let addr = |a: StoredAddress| Address::new(a.ton, a.npi, a.addr);
        Ok(ReceiptTarget {
            submit_id: MessageId::from_uuid(self.submit_id),
            account: self.account,
            reply,
            source: addr(self.source),
            destination: addr(self.destination),
            submitted_at: Timestamp(self.submitted_at),
            failure_only: self.failure_only,
        })
    }
}

pub(super) fn targets_json(targets: &[ReceiptTarget]) -> Result<String, serde_json::Error> {
    serde_json::to_string(&targets.iter().map(StoredTarget::of).collect::<Vec<_>>())
}
