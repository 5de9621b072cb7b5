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

/// The stable id of an admitted message or multipart part: the id returned in its
/// `submit_sm_resp` or HTTP 202.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MessageId(Uuid);

impl MessageId {
    /// A fresh, time-ordered id. Monotonic within the process.
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
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
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReadySeq(pub u64);

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
}
