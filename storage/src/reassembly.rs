//! What an arriving multipart part does to the open group it names: the one rule every
//! pending backend applies, at admission and again when a journal is replayed.
//!
//! A group is open from its first part until its last part arrives (it becomes a ready
//! unit) or its saved deadline passes (it expires). Senders reuse references: 8-bit UDH
//! references wrap every 256 messages, so a new message to the same number can carry the
//! reference of a group that was abandoned (its sender disconnected, or Sendium was
//! killed, before the other parts came). Joining such a part to the abandoned group
//! would deliver a message made of two others and drop an acknowledged part, so:
//!
//! - no open group: the part starts one;
//! - the open group has another `total`: the part starts a new message;
//! - the open group has no part at this position: the part joins it;
//! - the open group has this position from the same submission (every field the
//!   client sent is equal): a retransmission, answered with the id it got before and
//!   not stored again;
//! - the open group has this position with other content: the part starts a new
//!   message.
//!
//! A part that starts a new message *supersedes* the open group: that group is closed at
//! once as incomplete, exactly as if its deadline had passed (each of its parts that asked
//! for a receipt gets a failure receipt), and a new group starts with the part.
//!
//! A completed group is remembered until its saved deadline (no part of it can be
//! expected later): while no group of its key is open, a part that is the same
//! submission as one of its parts is a retransmission (answered with that part's id),
//! and any other part starts a new message. So a part sent again after its message
//! completed never lingers as the first part of a group that the next message with
//! that reference would join.
//!
//! Submissions are compared by [`PendingRecord::submission_digest`], which the stores
//! keep beside each part's id.

use crate::ids::MessageId;
use crate::record::{GroupKey, PendingRecord};

/// Where an arriving part goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Into the open group, or into a new group when none is open.
    Join,
    /// The same submission again: answer with `existing`, store nothing.
    Retransmission { existing: MessageId },
    /// Close the open group as incomplete and start a new group with this part.
    Supersede,
}

/// One group of a key, as far as placing a part needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupView {
    /// The group's number of parts (that of its first part).
    pub total: u8,
    /// The id and [submission digest](PendingRecord::submission_digest) of the record
    /// first admitted at the arriving part's position, if any.
    pub at_seq: Option<(MessageId, u64)>,
}

/// What the store knows of the part's group key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyState {
    /// A group is open.
    Open(GroupView),
    /// No group is open; this one completed and its deadline has not passed.
    Completed(GroupView),
}

impl KeyState {
    /// An open (`open`) or completed group.
    pub fn new(open: bool, view: GroupView) -> Self {
        if open { Self::Open(view) } else { Self::Completed(view) }
    }
}

/// Decide where `part` goes; `digest` is its
/// [`submission_digest`](PendingRecord::submission_digest).
pub fn place(part: &PendingRecord, digest: u64, known: Option<KeyState>) -> Placement {
    let Some(info) = part.part else {
        return Placement::Join;
    };
    let same = |g: &GroupView| match g.at_seq {
        Some((existing, d)) if g.total == info.total && d == digest => Some(existing),
        _ => None,
    };
    match known {
        None => Placement::Join,
        Some(KeyState::Open(g)) => match (same(&g), g.total == info.total && g.at_seq.is_none()) {
            (Some(existing), _) => Placement::Retransmission { existing },
            (None, true) => Placement::Join,
            (None, false) => Placement::Supersede,
        },
        Some(KeyState::Completed(g)) => match same(&g) {
            Some(existing) => Placement::Retransmission { existing },
            None => Placement::Join,
        },
    }
}

/// A group key as bytes: three length-prefixed strings and the reference (the prefix
/// every open group of the key starts with; see [`group_key_bytes`]).
pub(crate) fn group_prefix(gk: &GroupKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(gk.account.len() + gk.source.len() + gk.destination.len() + 15);
    for s in [&gk.account, &gk.source, &gk.destination] {
        out.extend_from_slice(&u32::try_from(s.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    out.extend_from_slice(&gk.reference.to_be_bytes());
    out
}

/// A stored group's key: its [`group_prefix`], then its total. Stable,
/// so it keys the table across restarts.
pub(crate) fn group_key_bytes(prefix: &[u8], total: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(prefix.len() + 1);
    out.extend_from_slice(prefix);
    out.push(total);
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn part(reference: u16, total: u8, seq: u8, text: &str) -> PendingRecord {
        let mut p = crate::conformance::part("esme1", "46711111111", reference, total, seq, Duration::from_secs(60));
        p.payload = text.as_bytes().to_vec();
        p
    }

    fn view(total: u8, at_seq: Option<&PendingRecord>) -> GroupView {
        GroupView {
            total,
            at_seq: at_seq.map(|r| (r.id, r.submission_digest())),
        }
    }

    fn open(total: u8, at_seq: Option<&PendingRecord>) -> Option<KeyState> {
        Some(KeyState::Open(view(total, at_seq)))
    }

    fn completed(total: u8, at_seq: Option<&PendingRecord>) -> Option<KeyState> {
        Some(KeyState::Completed(view(total, at_seq)))
    }

    fn placed(p: &PendingRecord, known: Option<KeyState>) -> Placement {
        place(p, p.submission_digest(), known)
    }

    #[test]
    fn a_part_without_an_open_group_starts_one() {
        assert_eq!(placed(&part(9, 3, 2, "b"), None), Placement::Join);
    }

    #[test]
    fn a_missing_position_joins_the_open_group() {
        assert_eq!(placed(&part(9, 3, 2, "b"), open(3, None)), Placement::Join);
    }

    #[test]
    fn the_same_submission_again_is_a_retransmission() {
        let first = part(9, 3, 1, "a");
        // Sent again: a new id, a later acceptance time and deadline, nothing else new.
        let mut again = part(9, 3, 1, "a");
        again.accepted_at = first.accepted_at.saturating_add(Duration::from_secs(5));
        if let Some(p) = again.part.as_mut() {
            p.expires_at = p.expires_at.saturating_add(Duration::from_secs(5));
        }
        assert_eq!(
            placed(&again, open(3, Some(&first))),
            Placement::Retransmission { existing: first.id }
        );
    }

    #[test]
    fn other_content_at_a_taken_position_starts_a_new_message() {
        let old = part(9, 3, 1, "old text");
        assert_eq!(
            placed(&part(9, 3, 1, "new text"), open(3, Some(&old))),
            Placement::Supersede
        );
        // Any field the client sent counts, not only the text.
        let mut other_coding = part(9, 3, 1, "old text");
        other_coding.data_coding = 8;
        assert_eq!(placed(&other_coding, open(3, Some(&old))), Placement::Supersede);
        let mut other_receipt = part(9, 3, 1, "old text");
        other_receipt.registered_delivery = 0;
        assert_eq!(placed(&other_receipt, open(3, Some(&old))), Placement::Supersede);
        let mut other_source = part(9, 3, 1, "old text");
        other_source.source.ton = 1;
        assert_eq!(placed(&other_source, open(3, Some(&old))), Placement::Supersede);
    }

    #[test]
    fn another_total_starts_a_new_message() {
        // Even at a free position, and even with the same text.
        assert_eq!(placed(&part(9, 2, 2, "b"), open(3, None)), Placement::Supersede);
        let old = part(9, 3, 1, "a");
        assert_eq!(placed(&part(9, 2, 1, "a"), open(3, Some(&old))), Placement::Supersede);
    }

    #[test]
    fn a_part_of_a_completed_group_sent_again_is_a_retransmission() {
        let first = part(9, 3, 3, "c");
        assert_eq!(
            placed(&part(9, 3, 3, "c"), completed(3, Some(&first))),
            Placement::Retransmission { existing: first.id }
        );
    }

    #[test]
    fn any_other_part_after_completion_starts_a_new_group() {
        let first = part(9, 3, 3, "c");
        assert_eq!(
            placed(&part(9, 3, 3, "other"), completed(3, Some(&first))),
            Placement::Join
        );
        assert_eq!(placed(&part(9, 2, 2, "c"), completed(3, Some(&first))), Placement::Join);
        // Nothing to supersede: the completed message is delivered as it was.
        assert_eq!(placed(&part(9, 3, 1, "a"), completed(3, None)), Placement::Join);
    }

    #[test]
    fn digests_tell_submissions_apart_by_every_field() {
        let a = part(9, 3, 1, "ab");
        let mut b = a.clone();
        b.payload = b"a".to_vec();
        b.service_type = "b".into();
        assert_ne!(
            a.submission_digest(),
            b.submission_digest(),
            "fields are length-prefixed"
        );
        let mut c = a.clone();
        c.callback_url = Some(String::new());
        assert_ne!(a.submission_digest(), c.submission_digest(), "absent is not empty");
        let mut d = a.clone();
        d.id = MessageId::generate();
        assert_eq!(a.submission_digest(), d.submission_digest());
    }

    /// Digests are stored with open and completed groups and compared after an upgrade:
    /// the sliced CRC-64 must give the byte-at-a-time table's values, and a record's
    /// digest must stay the one earlier builds stored.
    #[test]
    fn digests_stay_what_earlier_builds_stored() {
        let bytewise = crc::Crc::<u64>::new(&crc::CRC_64_XZ);
        let sliced = crc::Crc::<u64, crc::Table<16>>::new(&crc::CRC_64_XZ);
        let data: Vec<u8> = (0..300u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for start in 0..17 {
            for end in (start..data.len()).step_by(5) {
                assert_eq!(sliced.checksum(&data[start..end]), bytewise.checksum(&data[start..end]));
            }
        }
        let mut a = part(9, 3, 1, "ab");
        a.source.addr = "SENDIUM".into();
        assert_eq!(a.submission_digest(), 0xb56a_bd1e_67d3_904c);
    }

    #[test]
    fn group_keys_encode_unambiguously() {
        let gk = |a: &str, s: &str| crate::record::GroupKey {
            account: a.into(),
            source: s.into(),
            destination: "d".into(),
            reference: 1,
        };
        assert_ne!(group_prefix(&gk("ab", "c")), group_prefix(&gk("a", "bc")));
        // Every total of one key shares the prefix, and only those.
        let prefix = group_prefix(&gk("a", "b"));
        assert!(group_key_bytes(&prefix, 3).starts_with(&prefix));
        assert_eq!(group_key_bytes(&prefix, 3).len(), prefix.len() + 1);
    }
}
