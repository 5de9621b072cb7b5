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

use crate::dlr::{DlrState, ProgressReport, ReceiptTarget, ReplyPath};
use crate::error::FailureKind;
use crate::ids::{MessageId, Timestamp};
use crate::inbound::{InboundGroupKey, InboundMessage};
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

/// SMPP message_state numbers, and 108 for a refused submission.
pub(super) fn state_code(s: DlrState) -> i16 {
    match s {
        DlrState::Delivered => 2,
        DlrState::Expired => 3,
        DlrState::Deleted => 4,
        DlrState::Undeliverable => 5,
        DlrState::Unknown => 7,
        DlrState::Rejected => 8,
        // Not an SMPP message_state: a refused submission has none.
        DlrState::Refused => 108,
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
        108 => DlrState::Refused,
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
    /// "smpp", "http" or "kannel" (the SQL reads it to index SMPP deliveries by
    /// account; anything but "smpp" is delivered over HTTP).
    reply: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    url: Option<String>,
    /// A "kannel" reply's dlr-mask; absent in other targets (and in targets stored
    /// before Kannel replies existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mask: Option<u8>,
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

impl StoredAddress {
    fn of(a: &Address) -> Self {
        Self {
            ton: a.ton,
            npi: a.npi,
            addr: a.addr.clone(),
        }
    }

    fn into_address(self) -> Address {
        Address::new(self.ton, self.npi, self.addr)
    }
}

const TARGET_VERSION: u32 = 1;

impl StoredTarget {
    pub(super) fn of(t: &ReceiptTarget) -> Self {
        let (reply, url, mask) = match &t.reply {
            ReplyPath::Smpp => ("smpp", None, None),
            ReplyPath::Http { url } => ("http", Some(url.clone()), None),
            ReplyPath::Kannel { url, mask } => ("kannel", Some(url.clone()), Some(*mask)),
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
            mask,
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
            ("kannel", Some(url)) => ReplyPath::Kannel {
                url,
                mask: self.mask.unwrap_or_default(),
            },
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

/// Stored shape of an [`InboundMessage`] without its payload (JSONB; the payload is a
/// `bytea` column beside it). Its own type, like [`StoredTarget`]; `v` is the major
/// version.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredInbound {
    v: u32,
    id: Uuid,
    from_destination: String,
    source: StoredAddress,
    destination: StoredAddress,
    data_coding: u8,
    received_at: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    route: String,
    #[serde(default)]
    incomplete: bool,
}

const INBOUND_VERSION: u32 = 1;

impl StoredInbound {
    pub(super) fn of(m: &InboundMessage) -> Self {
        Self {
            v: INBOUND_VERSION,
            id: m.id.as_uuid(),
            from_destination: m.from_destination.clone(),
            source: StoredAddress::of(&m.source),
            destination: StoredAddress::of(&m.destination),
            data_coding: m.data_coding,
            received_at: m.received_at.0,
            route: m.route.clone(),
            incomplete: m.incomplete,
        }
    }

    pub(super) fn json(m: &InboundMessage) -> Result<String, serde_json::Error> {
        serde_json::to_string(&Self::of(m))
    }

    /// The message, from its stored JSON and payload.
    pub(super) fn decode(json: &str, payload: Vec<u8>) -> Result<InboundMessage, (FailureKind, String)> {
        let s: Self =
            serde_json::from_str(json).map_err(|e| (FailureKind::Corrupt, format!("inbound message: {e}")))?;
        if s.v != INBOUND_VERSION {
            return Err((
                FailureKind::UnsupportedVersion,
                format!("inbound message version {} (this Sendium reads {INBOUND_VERSION})", s.v),
            ));
        }
        Ok(InboundMessage {
            id: MessageId::from_uuid(s.id),
            from_destination: s.from_destination,
            source: s.source.into_address(),
            destination: s.destination.into_address(),
            data_coding: s.data_coding,
            payload,
            received_at: Timestamp(s.received_at),
            route: s.route,
            incomplete: s.incomplete,
        })
    }
}

/// Stored shape of a [`ProgressReport`] (JSONB), like [`StoredTarget`]; `v` is the major
/// version.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct StoredProgress {
    v: u32,
    kind: u8,
    text: String,
    smsc: String,
    foreign_id: String,
    at: u64,
}

const PROGRESS_VERSION: u32 = 1;

impl StoredProgress {
    pub(super) fn json(p: &ProgressReport) -> Result<String, serde_json::Error> {
        serde_json::to_string(&Self {
            v: PROGRESS_VERSION,
            kind: p.kind,
            text: p.text.clone(),
            smsc: p.smsc.clone(),
            foreign_id: p.foreign_id.clone(),
            at: p.at.0,
        })
    }

    pub(super) fn decode(json: &str) -> Result<ProgressReport, (FailureKind, String)> {
        let s: Self =
            serde_json::from_str(json).map_err(|e| (FailureKind::Corrupt, format!("progress report: {e}")))?;
        if s.v != PROGRESS_VERSION {
            return Err((
                FailureKind::UnsupportedVersion,
                format!(
                    "progress report version {} (this Sendium reads {PROGRESS_VERSION})",
                    s.v
                ),
            ));
        }
        Ok(ProgressReport {
            kind: s.kind,
            text: s.text,
            smsc: s.smsc,
            foreign_id: s.foreign_id,
            at: Timestamp(s.at),
        })
    }
}

/// The second key of a group key's transaction lock (its first is
/// [`INBOUND_LOCK_CLASS`]): the CRC-32 of its stable bytes. Two keys sharing a hash only
/// wait for each other.
pub(super) fn group_lock(key: &InboundGroupKey) -> i32 {
    i32::from_be_bytes(crate::envelope::crc32(&key.to_bytes()).to_be_bytes())
}

/// Advisory lock class of inbound group keys ("SDMO"), apart from the stages' ("SEND")
/// and from sqlx's one-key migration lock.
pub(super) const INBOUND_LOCK_CLASS: i32 = 0x5344_4D4F;
