//! Stable identities and time.
//!
//! Every message gets a [`MessageId`] at admission. It is a UUIDv7: time-ordered, so the
//! smallest id in a store is also the oldest record, and unique without coordination, so
//! recovery and cross-stage reconciliation can key on it alone (no cross-backend
//! transaction is ever assumed).

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A hash map keyed by ids this process makes or its configuration names: message and
/// unit ids, delivery ids, sequence numbers, destination names. The per-message paths look
/// such keys up several times per message; foldhash hashes a 16-byte id in a fraction of
/// SipHash's time (the standard library's default, whose protection against keys chosen to
/// collide these keys do not need: no outside party chooses them), and is still seeded
/// per process.
pub type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set of ids this process makes (see [`IdMap`]).
pub type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;

/// The stable id of an admitted message or multipart part: the id returned in its
/// `submit_sm_resp` or HTTP 202.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(Uuid);

/// The order of the id's bytes (big-endian: time order), compared as one 128-bit number:
/// the in-memory stages keep their records in B-trees keyed by ids, where a byte-wise
/// comparison is a `memcmp` call per key visited.
impl Ord for MessageId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.as_u128().cmp(&other.0.as_u128())
    }
}

impl PartialOrd for MessageId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// One 128-bit write (the bytes as a slice would be a length and a 16-byte write).
impl std::hash::Hash for MessageId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u128(self.0.as_u128());
    }
}

impl MessageId {
    /// A fresh, time-ordered id. Monotonic within the process.
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    /// The id as its `Display` writes it (hyphenated, lower case), written into `buf`
    /// rather than a new `String`: a receipt's text and TLV carry it.
    pub fn encode<'b>(&self, buf: &'b mut [u8; 36]) -> &'b str {
        self.0.hyphenated().encode_lower(buf)
    }

    /// The id's 16 bytes, big-endian: byte order equals time order, so they make a
    /// good ordered key for a file or database index.
    pub fn to_bytes(self) -> [u8; 16] {
        *self.0.as_bytes()
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }

    pub fn as_uuid(&self) -> Uuid {
        self.0
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    /// Milliseconds since the Unix epoch encoded in the id (UUIDv7 timestamp).
    pub fn timestamp(&self) -> Timestamp {
        let b = self.0.as_bytes();
        let ms = u64::from_be_bytes([0, 0, b[0], b[1], b[2], b[3], b[4], b[5]]);
        Timestamp(ms)
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MessageId({})", self.0.hyphenated())
    }
}

impl FromStr for MessageId {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s).map(Self)
    }
}

/// The id of a routable unit: a single message, or a reassembled multipart group.
/// For a single message it is the message's id; for a group it is the id of part 1.
pub type UnitId = MessageId;

/// Position of a unit in the pending stage's ready order. Selection walks units in this
/// order with a cursor, so it never needs to load the backlog at once.
///
/// The top bits hold the unit's *lane*: the `priority` (0–9) of the route its message
/// matched when admitted; the rest is a counter shared by every lane. Each lane is a
/// range of seqs, walked in arrival order with a cursor of its own ([`ReadyCursor`]), and
/// selection takes the highest lane first. Lane 0 is the seq as a plain counter (top
/// bits zero).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReadySeq(pub u64);

impl ReadySeq {
    /// Lanes: route priorities 0–9.
    pub const LANES: usize = 10;
    const LANE_SHIFT: u32 = 56;
    const COUNTER_MASK: u64 = (1 << Self::LANE_SHIFT) - 1;

    /// The seq of counter value `counter` in lane `lane` (a priority above 9 is lane 9).
    pub fn in_lane(lane: u8, counter: u64) -> Self {
        let lane = u64::from(lane.min(9));
        Self(lane << Self::LANE_SHIFT | (counter & Self::COUNTER_MASK))
    }

    pub fn lane(self) -> u8 {
        u8::try_from(self.0 >> Self::LANE_SHIFT).unwrap_or(u8::MAX)
    }

    /// The shared counter's value, without the lane.
    pub fn counter(self) -> u64 {
        self.0 & Self::COUNTER_MASK
    }

    /// The first seq past lane `lane` (the end of its range).
    pub fn lane_end(lane: u8) -> Self {
        Self((u64::from(lane.min(9)) + 1) << Self::LANE_SHIFT)
    }
}

/// Where selection stands in each lane of the ready order: every ready unit at or below a
/// lane's cursor was selected once. Selection reads the highest lane first.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ReadyCursor {
    /// Per lane, the last selected seq (0: nothing selected in that lane yet).
    lanes: [u64; ReadySeq::LANES],
}

impl ReadyCursor {
    /// Nothing selected in any lane.
    pub const START: ReadyCursor = ReadyCursor {
        lanes: [0; ReadySeq::LANES],
    };

    /// The cursor of `lane`: units of the lane after it are still to be selected.
    pub fn lane(&self, lane: u8) -> ReadySeq {
        self.lanes
            .get(usize::from(lane))
            .map_or(ReadySeq(0), |&seq| ReadySeq(seq))
    }

    /// Move the cursor of `seq`'s lane to `seq`; a cursor never moves backwards. Returns
    /// whether it moved.
    pub fn advance(&mut self, seq: ReadySeq) -> bool {
        match self.lanes.get_mut(usize::from(seq.lane())) {
            Some(at) if seq.0 > *at => {
                *at = seq.0;
                true
            }
            _ => false,
        }
    }

    /// Advance every lane to `other`'s cursor where it is further.
    pub fn merge(&mut self, other: &ReadyCursor) {
        for seq in other.positions() {
            self.advance(seq);
        }
    }

    /// The lanes' cursors that moved past the start, lowest lane first.
    pub fn positions(&self) -> impl Iterator<Item = ReadySeq> + '_ {
        self.lanes.iter().filter(|&&seq| seq != 0).map(|&seq| ReadySeq(seq))
    }

    /// The highest counter any lane's cursor reached (for status pages).
    pub fn furthest(&self) -> u64 {
        self.positions().map(ReadySeq::counter).max().unwrap_or(0)
    }
}

/// A cursor at `seq` in `seq`'s lane, at the start in every other.
impl From<ReadySeq> for ReadyCursor {
    fn from(seq: ReadySeq) -> Self {
        let mut c = ReadyCursor::START;
        c.advance(seq);
        c
    }
}

/// Milliseconds since the Unix epoch. Stored records keep absolute times (deadlines,
/// acceptance) so a restart does not move them.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn now() -> Self {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        Self(u64::try_from(ms).unwrap_or(u64::MAX))
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    pub fn as_unix_seconds(self) -> i64 {
        i64::try_from(self.0 / 1000).unwrap_or(i64::MAX)
    }

    pub fn saturating_add(self, d: Duration) -> Self {
        let add = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(add))
    }

    /// How long ago this was, seen from `now` (zero if in the future).
    pub fn age(self, now: Timestamp) -> Duration {
        Duration::from_millis(now.0.saturating_sub(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_encoded_id_is_its_display() {
        for _ in 0..100 {
            let id = MessageId::generate();
            assert_eq!(id.encode(&mut [0; 36]), id.to_string());
        }
        let id = MessageId::from_bytes([0xAB; 16]);
        assert_eq!(id.encode(&mut [0; 36]), "abababab-abab-abab-abab-abababababab");
    }

    #[test]
    fn ids_are_time_ordered_and_round_trip() {
        let a = MessageId::generate();
        let b = MessageId::generate();
        assert!(a < b, "v7 ids generated later sort later");
        let parsed: MessageId = a.to_string().parse().unwrap();
        assert_eq!(parsed, a);
        assert_eq!(MessageId::from_bytes(a.to_bytes()), a);
        let age = a.timestamp().age(Timestamp::now());
        assert!(age < Duration::from_secs(5));
    }

    #[test]
    fn ids_order_as_their_bytes_do() {
        // The file and database indexes order ids by their bytes; the in-memory stages
        // must agree with them (restore and selection walk both).
        let mut bytes: Vec<[u8; 16]> = (0u8..=255)
            .map(|i| {
                let mut b = [i.wrapping_mul(37); 16];
                b[15 - usize::from(i % 16)] = i;
                b[usize::from(i % 7)] ^= 0x80;
                b
            })
            .collect();
        bytes.push([0; 16]);
        bytes.push([0xFF; 16]);
        let mut ids: Vec<MessageId> = bytes.iter().map(|b| MessageId::from_bytes(*b)).collect();
        bytes.sort();
        ids.sort();
        assert_eq!(ids.iter().map(|id| id.to_bytes()).collect::<Vec<_>>(), bytes);
        for (a, b) in ids.iter().zip(ids.iter().skip(1)) {
            assert_eq!(a.cmp(b), a.to_bytes().cmp(&b.to_bytes()));
            assert_eq!(b.cmp(a), b.to_bytes().cmp(&a.to_bytes()));
        }
    }

    #[test]
    fn a_seq_carries_its_lane_and_a_cursor_moves_per_lane_never_back() {
        let plain = ReadySeq(42);
        assert_eq!((plain.lane(), plain.counter()), (0, 42), "lane 0 is the plain counter");
        assert_eq!(ReadySeq::in_lane(0, 42), plain);
        let urgent = ReadySeq::in_lane(9, 43);
        assert_eq!((urgent.lane(), urgent.counter()), (9, 43));
        assert_eq!(ReadySeq::in_lane(12, 1).lane(), 9, "priorities above 9 share lane 9");
        assert!(ReadySeq::lane_end(8) <= ReadySeq::in_lane(9, 0) && urgent < ReadySeq::lane_end(9));

        let mut c = ReadyCursor::START;
        assert!(c.advance(plain) && c.advance(urgent));
        assert!(!c.advance(ReadySeq::in_lane(9, 5)), "never backwards");
        assert_eq!((c.lane(0), c.lane(9), c.lane(4)), (plain, urgent, ReadySeq(0)));
        assert_eq!(c.furthest(), 43);
        let mut other = ReadyCursor::from(ReadySeq::in_lane(4, 50));
        other.advance(ReadySeq(7));
        c.merge(&other);
        assert_eq!(
            c.positions().collect::<Vec<_>>(),
            vec![plain, ReadySeq::in_lane(4, 50), urgent]
        );
    }
}
