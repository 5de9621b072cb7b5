//! The accepted message as the pending stage keeps it.
//!
//! A [`PendingRecord`] holds everything needed to deliver the message and to return
//! its receipt after a restart: payload and encoding, multipart state with the
//! group's absolute deadline, routing inputs, DLR return metadata, the idempotency
//! key and timestamps. It is plain data: protocols and actors convert into it.

use serde::{Deserialize, Serialize};

use crate::ids::{MessageId, Timestamp};

/// An SMPP address: type of number, numbering plan, digits.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct Address {
    pub ton: u8,
    pub npi: u8,
    pub addr: String,
}

impl Address {
    pub fn new(ton: u8, npi: u8, addr: impl Into<String>) -> Self {
        Self {
            ton,
            npi,
            addr: addr.into(),
        }
    }
}

/// How the message entered Sendium; decides how its receipt goes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Channel {
    /// `submit_sm` on a bound session: the receipt is a `deliver_sm` to a bound
    /// receiver/transceiver session of the same account.
    Smpp,
    /// `POST /v1/messages`: the receipt is POSTed to the record's `callback_url`.
    Http,
}

/// Multipart (concatenated SMS) state of one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartInfo {
    /// Concatenation reference (8-bit UDH references are widened).
    pub reference: u16,
    pub total: u8,
    /// 1-based position in the group.
    pub seq: u8,
    /// Absolute deadline: if the group is still incomplete then, it expires (and a
    /// failure receipt goes to every part that asked for one). Saved with the part so
    /// a restart does not extend it.
    pub expires_at: Timestamp,
}

/// One admitted message or multipart part.
///
/// Stored as a versioned CBOR envelope with short field names (a pending backlog of
/// millions is mostly these records; long names would add ~40% to the file).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRecord {
    /// The id returned to the client for this submission.
    pub id: MessageId,
    /// The originating account (SMPP system_id; HTTP API keys map to an account).
    #[serde(rename = "acct")]
    pub account: String,
    #[serde(rename = "ch")]
    pub channel: Channel,
    #[serde(rename = "src")]
    pub source: Address,
    #[serde(rename = "dst")]
    pub destination: Address,
    #[serde(default)]
    #[serde(rename = "svc")]
    pub service_type: String,
    /// esm_class as received, with the UDHI bit cleared: `payload` never contains a UDH.
    #[serde(default)]
    #[serde(rename = "esm")]
    pub esm_class: u8,
    #[serde(default)]
    #[serde(rename = "pid")]
    pub protocol_id: u8,
    #[serde(default)]
    #[serde(rename = "pri")]
    pub priority: u8,
    #[serde(rename = "dcs")]
    pub data_coding: u8,
    /// The user data of this message or part, exactly as received, without UDH.
    #[serde(with = "serde_bytes")]
    #[serde(rename = "ud")]
    pub payload: Vec<u8>,
    #[serde(default)]
    #[serde(rename = "part")]
    pub part: Option<PartInfo>,
    /// SMPP registered_delivery as received (HTTP: 0x01 when a callback_url is given).
    #[serde(default)]
    #[serde(rename = "rd")]
    pub registered_delivery: u8,
    #[serde(default)]
    #[serde(rename = "cb")]
    pub callback_url: Option<String>,
    #[serde(default)]
    #[serde(rename = "idem")]
    pub idempotency_key: Option<String>,
    #[serde(rename = "at")]
    pub accepted_at: Timestamp,
    /// The client's validity period as an absolute deadline (SMPP `validity_period`):
    /// a message not delivered by then fails with an EXPIRED receipt. `None`: the
    /// gateway's `[sms] max-age` alone bounds it.
    #[serde(default, rename = "vu", skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<Timestamp>,
    /// A Kannel-style `dlr-mask` (`/cgi-bin/sendsms`): `callback_url` is then a Kannel
    /// `dlr-url`, called with a GET for the report types in the mask (1 delivered,
    /// 2 undelivered, 16 refused by the provider). `None`: a `callback_url` gets the JSON
    /// POST. Minor version 1 of the record; absent in older ones.
    #[serde(default, rename = "dm", skip_serializing_if = "Option::is_none")]
    pub dlr_mask: Option<u8>,
    /// The `priority` (0–9) of the route this message matched when it was admitted: its
    /// place in the pending stage's ready order (higher first, arrival order within one
    /// priority). Minor version 2 of the record; absent (0) in older ones.
    #[serde(default, rename = "rp", skip_serializing_if = "is_zero")]
    pub route_priority: u8,
    /// The destination the client asked for (Kannel's `smsc` parameter): preferred when
    /// it is one of the matched route's `to` destinations, ignored otherwise. Minor
    /// version 2 of the record; absent in older ones.
    #[serde(default, rename = "sh", skip_serializing_if = "Option::is_none")]
    pub destination_hint: Option<String>,
    /// When the provider is to deliver the message (SMPP `schedule_delivery_time`, a
    /// Kannel `deferred`, the API's `deliver_at`), absolute: passed on to the provider,
    /// which holds it until then. `None`: at once. Minor version 3 of the record; absent
    /// in older ones.
    #[serde(default, rename = "da", skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<Timestamp>,
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

impl PendingRecord {
    /// Does this submission expect a receipt (on final outcome, or on failure only)?
    pub fn wants_receipt(&self) -> bool {
        self.registered_delivery & 0x03 != 0
    }

    /// registered_delivery 0b10: a receipt only if delivery fails.
    pub fn receipt_on_failure_only(&self) -> bool {
        self.registered_delivery & 0x03 == 0x02
    }

    /// The key parts of one multipart group share: who sent it, between which numbers,
    /// and its reference — as handsets and SMSCs reassemble. At most one group per key is
    /// open at a time (see [`crate::reassembly`]); the group's `total` is kept with it.
    pub fn group_key(&self) -> Option<GroupKey> {
        self.part.map(|p| GroupKey {
            account: self.account.clone(),
            source: self.source.addr.clone(),
            destination: self.destination.addr.clone(),
            reference: p.reference,
        })
    }

    /// A digest of every field the client sent: two admissions with the same digest are
    /// the same submission sent twice. The id, acceptance time and multipart deadline
    /// Sendium gave each admission are left out, and so are the validity deadline and the
    /// scheduled delivery time (a relative SMPP time resolves to another instant each time
    /// it is sent).
    /// CRC-64 over a length-prefixed encoding: stable across builds, so stored digests
    /// stay comparable after an upgrade.
    pub fn submission_digest(&self) -> u64 {
        let mut d = SUBMISSION_DIGEST.digest();
        let mut field = |bytes: &[u8]| {
            d.update(&u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
            d.update(bytes);
        };
        let channel: u8 = match self.channel {
            Channel::Smpp => 0,
            Channel::Http => 1,
        };
        let part = self.part.map_or([0; 4], |p| {
            let [hi, lo] = p.reference.to_be_bytes();
            [hi, lo, p.total, p.seq]
        });
        field(self.account.as_bytes());
        field(&[channel, self.source.ton, self.source.npi]);
        field(self.source.addr.as_bytes());
        field(&[self.destination.ton, self.destination.npi]);
        field(self.destination.addr.as_bytes());
        field(self.service_type.as_bytes());
        field(&[
            self.esm_class,
            self.protocol_id,
            self.priority,
            self.data_coding,
            self.registered_delivery,
        ]);
        field(&part);
        field(&self.payload);
        for optional in [&self.callback_url, &self.idempotency_key] {
            match optional {
                Some(s) => field(s.as_bytes()),
                None => field(&[0xff]),
            }
        }
        // Only when present, so digests stored before the field existed stay equal.
        if let Some(mask) = self.dlr_mask {
            field(&[mask]);
        }
        if let Some(hint) = &self.destination_hint {
            field(b"sh");
            field(hint.as_bytes());
        }
        d.finalize()
    }
}

/// Sliced 16 bytes at a time (the payload is most of what it covers); the values are
/// those of the byte-at-a-time table.
const SUBMISSION_DIGEST: crc::Crc<u64, crc::Table<16>> = crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);

/// Identity of a multipart group while its parts arrive.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GroupKey {
    pub account: String,
    pub source: String,
    pub destination: String,
    pub reference: u16,
}
