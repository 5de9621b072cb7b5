//! Inbound (mobile-originated, MO) messages: a subscriber's SMS that a provider hands to
//! Sendium, for the application that owns the number.
//!
//! The DLR store keeps them, because what happens to an inbound message downstream is
//! what happens to a receipt: it is delivered to an account's bound receiver or
//! transceiver session (held until one binds, within retention) or POSTed to a URL,
//! claimed with a lease and an attempt number, retried with backoff and given up (dead)
//! after retention. An inbound message is one more kind of [`Delivery`](crate::Delivery)
//! ([`DeliveryContent::Inbound`](crate::DeliveryContent::Inbound)), stored by the same
//! step that stores receipts, so it is exactly as durable as the DLR profile promises
//! receipts are, and the provider's `deliver_sm` is acknowledged only after that step.
//!
//! A multipart message arrives as parts. Each part is stored as it arrives (so it can be
//! acknowledged to the provider) in an open *group*; the store says when a group holds
//! every part, and the caller then writes the whole message, routed, as one delivery in
//! a step that also removes the group. A group still incomplete at its saved deadline is
//! written the same way with the parts it has, marked incomplete. The rule for a part
//! arriving at a group (the same as the pending stage's, see [`crate::reassembly`]):
//!
//! - no open group of its key: the part opens one, with the part's deadline;
//! - the open group has no part at this position: the part joins it;
//! - the open group has this position with the same payload: a retransmission, not
//!   stored again;
//! - the open group has this position with another payload: the open group is closed
//!   (due at once, delivered incomplete) and the part opens a new group of the key.
//!
//! A complete group stays its key's open group until it is written, so a late copy of
//! one of its parts is recognised as a retransmission.
//!
//! Groups are never dropped by [`DlrStore::expire`](crate::DlrStore::expire): one whose
//! last part never comes is due at its deadline and written, incomplete, by the caller
//! (or removed with [`DlrWrite::inbound_dropped`](crate::DlrWrite::inbound_dropped) when
//! no route takes it).

mod placement;

pub(crate) use self::placement::StepGroups;

use serde::{Deserialize, Serialize};

use crate::dlr::ReplyPath;
use crate::ids::{MessageId, Timestamp};
use crate::record::Address;

/// One inbound message (or, as [`InboundPart::message`], one part of it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundMessage {
    /// Sendium's id for it, given when it arrived (a UUIDv7). A message assembled from
    /// parts has its first part's id.
    pub id: MessageId,
    /// The destination (provider connection) it arrived from.
    pub from_destination: String,
    /// The sender: the subscriber's number.
    pub source: Address,
    /// The number it was sent to: a short code or long number.
    pub destination: Address,
    /// SMPP data_coding of `payload`.
    pub data_coding: u8,
    /// The text as encoded in `data_coding`, without any UDH; a whole message's parts
    /// joined in order.
    #[serde(with = "serde_bytes")]
    pub payload: Vec<u8>,
    pub received_at: Timestamp,
    /// The `[[mo-routes]]` entry it matched (for counts by route); empty for a part.
    pub route: String,
    /// The multipart deadline passed before every part came: `payload` holds the parts
    /// that did, in order.
    pub incomplete: bool,
}

/// What identifies a multipart inbound message's parts: the provider, both numbers, the
/// concatenation reference and the number of parts.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct InboundGroupKey {
    pub from_destination: String,
    pub source: String,
    pub destination: String,
    /// UDH (8- or 16-bit) or SAR reference, widened.
    pub reference: u16,
    pub total: u8,
}

impl InboundGroupKey {
    /// A stable byte form: the three names, each after its length (u32, big-endian),
    /// then the reference (u16) and the number of parts. The file store keys its open
    /// groups by it; the PostgreSQL store hashes it for the key's lock.
    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let names = [&self.from_destination, &self.source, &self.destination];
        let mut out = Vec::with_capacity(15 + names.iter().map(|n| n.len()).sum::<usize>());
        for n in names {
            out.extend_from_slice(&u32::try_from(n.len()).unwrap_or(u32::MAX).to_be_bytes());
            out.extend_from_slice(n.as_bytes());
        }
        out.extend_from_slice(&self.reference.to_be_bytes());
        out.push(self.total);
        out
    }
}

/// One part of a multipart inbound message, stored until its group is written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboundPart {
    pub key: InboundGroupKey,
    /// 1-based position in the message, at most `key.total` (the caller refuses a
    /// malformed part before it reaches the store).
    pub seq: u8,
    /// The group's deadline, from its first part's arrival; saved, so a restart does not
    /// extend it. A later part's own deadline does not move an open group's.
    pub deadline: Timestamp,
    /// This part's id, numbers, coding and payload (`route` empty, `incomplete` false).
    pub message: InboundMessage,
}

/// An open (or closed, not yet written) multipart group as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboundGroup {
    /// The store's number for this group, unique among the store's groups for as long
    /// as it exists (a key can have a closed group and a newer open one at once).
    pub no: u64,
    pub key: InboundGroupKey,
    pub deadline: Timestamp,
    /// Closed by a conflicting part: due at once whatever its deadline.
    pub closed: bool,
    /// The parts held, by `seq`, at most one per position.
    pub parts: Vec<InboundPart>,
}

impl InboundGroup {
    /// Every position from 1 to `key.total` is held.
    pub fn is_complete(&self) -> bool {
        self.parts.len() == usize::from(self.key.total)
    }

    /// Whether it should be written now: complete, closed, or past its deadline.
    pub fn is_due(&self, now: Timestamp) -> bool {
        self.due_at() <= now
    }

    /// When it is due: at once (time 0) when complete or closed, else at its deadline.
    /// The backends index groups by this, so a group that becomes ready is found
    /// without a scan, and ready groups come before those merely past their deadline.
    pub(crate) fn due_at(&self) -> Timestamp {
        if self.is_complete() || self.closed {
            Timestamp(0)
        } else {
            self.deadline
        }
    }

    /// The parts joined into one message (the first part's id, numbers and coding;
    /// payloads in `seq` order), incomplete unless every part is held. `None` without
    /// parts.
    pub fn assemble(&self, route: &str) -> Option<InboundMessage> {
        let first = self.parts.first()?;
        let mut message = first.message.clone();
        message.payload = self
            .parts
            .iter()
            .flat_map(|p| p.message.payload.iter().copied())
            .collect();
        message.route = route.to_string();
        message.incomplete = !self.is_complete();
        Some(message)
    }

    /// The message a written group is delivered as: the caller's (routed, from the group
    /// as the caller read it), with `payload` and `incomplete` from the parts the store
    /// removed. They differ only when a part joined after the caller read the group (a
    /// group past its deadline still takes parts until it is written): that part is then
    /// delivered, not dropped.
    pub(crate) fn deliver_as(&self, mut message: InboundMessage) -> InboundMessage {
        if let Some(held) = self.assemble(&message.route) {
            message.payload = held.payload;
            message.incomplete = held.incomplete;
        }
        message
    }
}

/// An inbound message routed to its target, for [`DlrWrite::inbound`](crate::DlrWrite::inbound).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedInbound {
    /// The SMPP account it goes to (`reply` [`ReplyPath::Smpp`]), or the route's name
    /// for a URL target (for the delivery's scope and logs; never an SMPP account).
    pub account: String,
    pub reply: ReplyPath,
    pub message: InboundMessage,
    /// The multipart group it was assembled from. The store removes the group in the
    /// same step and creates the delivery only if the group was still there (another
    /// step, or another process, may have written it first). The delivery's `payload`
    /// and `incomplete` are those of the parts removed: a part that joined after the
    /// caller read the group is delivered with it, not dropped.
    pub group: Option<u64>,
}

impl RoutedInbound {
    /// The delivery's target: whom the message goes to, from the subscriber to the
    /// number they wrote to.
    pub fn target(&self) -> crate::dlr::ReceiptTarget {
        crate::dlr::ReceiptTarget {
            submit_id: self.message.id,
            account: self.account.clone(),
            reply: self.reply.clone(),
            source: self.message.source.clone(),
            destination: self.message.destination.clone(),
            submitted_at: self.message.received_at,
            failure_only: false,
        }
    }
}
