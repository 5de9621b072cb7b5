//! Values the file backends store besides the contract's own record types
//! ([`crate::PendingRecord`], [`crate::RoutedUnit`]). Each is stored in its
//! [envelope](crate::envelope) under its own [`RecordKind`](crate::envelope::RecordKind);
//! fields added later must be `#[serde(default)]` (a new minor version).

use serde::{Deserialize, Serialize};

use crate::ids::{MessageId, Timestamp, UnitId};
use crate::pending::Disposition;

/// A ready unit of the pending stage, stored under its [`crate::ReadySeq`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UnitEntry {
    pub id: UnitId,
    pub disposition: Disposition,
    /// Source records in part order (repeats follow the part they repeat).
    pub members: Vec<MessageId>,
    /// How many members asked for a receipt: completion lowers the receipt counter by
    /// this much without reading (and decoding) every member record.
    #[serde(default)]
    pub receipts: u64,
}

/// The ids received for one sequence number of a multipart group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GroupPart {
    pub seq: u8,
    /// First is the one whose payload is used; the rest are repeats.
    pub ids: Vec<MessageId>,
    /// The first's [submission digest](crate::PendingRecord::submission_digest) (absent
    /// in groups stored without one: then it is computed from the record when needed).
    #[serde(default)]
    pub digest: Option<u64>,
}

/// A multipart group, stored under its encoded [`crate::GroupKey`] and total: in
/// `groups` while incomplete, in `completed_groups` from completion to its deadline.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct GroupState {
    /// Ordered by `seq`.
    pub parts: Vec<GroupPart>,
    /// The earliest saved deadline of any part: absolute, so a restart does not move it.
    pub deadline: Timestamp,
    #[serde(default)]
    pub receipts: u64,
}

impl GroupState {
    pub(crate) fn add(&mut self, seq: u8, id: MessageId, digest: u64) {
        match self.parts.binary_search_by_key(&seq, |p| p.seq) {
            Ok(i) => self.parts[i].ids.push(id),
            Err(i) => self.parts.insert(
                i,
                GroupPart {
                    seq,
                    ids: vec![id],
                    digest: Some(digest),
                },
            ),
        }
    }

    /// The part at position `seq`, if any.
    pub(crate) fn at(&self, seq: u8) -> Option<&GroupPart> {
        let i = self.parts.binary_search_by_key(&seq, |p| p.seq).ok()?;
        self.parts.get(i)
    }

    pub(crate) fn members(&self) -> Vec<MessageId> {
        self.parts.iter().flat_map(|p| p.ids.iter().copied()).collect()
    }
}

/// An idempotency key's first admission.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct IdempotencyEntry {
    pub id: MessageId,
    /// Retention deadline: from then on the key no longer deduplicates.
    pub expires_at: Timestamp,
    /// The first admission's submission digest: a reuse of the key for another message
    /// is told apart from a retry. Absent in entries of builds that did not keep it
    /// (those count as retries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<u64>,
}

/// A staged unit of the router-queue stage, stored under its ready seq.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StagedRecord {
    pub id: UnitId,
}
