//! The routed-work stage: the destinations routing chose for each unit and which
//! branches are done.
//!
//! Owned by the Router actor. Recording a unit stores every branch of it — the primary
//! route with its failover targets and every copied route — in one transition, so a
//! restart restores recorded destinations to their workers, and a completed branch is
//! never sent again.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::backend::StageCapabilities;
use crate::error::RoutedWorkError;
use crate::ids::{MessageId, Timestamp, UnitId};

/// Primary branches carry the message's receipt; copies are delivered and tracked on
/// their own but owe the client nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BranchKind {
    Primary,
    Copy,
}

/// Why a branch failed, in receipt terms.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BranchFailure {
    /// No route matched the message.
    NoRoute,
    /// A multipart group expired before all its parts arrived.
    Expired,
    /// The provider refused the message permanently (SMPP command_status).
    Rejected { status: u32 },
    /// The message could not be encoded or split for the destination.
    Unencodable,
}

impl BranchFailure {
    /// Receipt `err:` code (3 digits) that the client sees.
    pub fn error_code(&self) -> String {
        match self {
            BranchFailure::NoRoute => "001".to_string(),
            BranchFailure::Expired => "002".to_string(),
            BranchFailure::Unencodable => "003".to_string(),
            // SMPP statuses above 999 are shown modulo 1000 so the field keeps 3 digits.
            BranchFailure::Rejected { status } => format!("{:03}", status % 1000),
        }
    }
}

/// How a branch ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BranchOutcome {
    /// The provider accepted every part; its ids, one per provider part, in part order.
    Submitted {
        destination: String,
        provider_ids: Vec<String>,
    },
    Failed {
        destination: Option<String>,
        failure: BranchFailure,
    },
}

/// One branch of a routed unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Branch {
    pub no: u16,
    pub kind: BranchKind,
    /// Destinations in failover order (first reachable wins). Empty when no route matched.
    pub targets: Vec<String>,
    pub outcome: Option<BranchOutcome>,
    /// Targets this branch failed over from, the longest ago first. They come after the
    /// other targets when the branch is placed, so a restart does not send it back to a
    /// destination it left (see [`Branch::preference`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_over_from: Vec<String>,
}

impl Branch {
    /// The targets in the order to try them: those the branch has not failed over from,
    /// in route order, then those it has, the longest ago first.
    pub fn preference(&self) -> impl Iterator<Item = &str> {
        let left = |t: &&String| self.failed_over_from.contains(*t);
        self.targets
            .iter()
            .filter(move |t| !left(t))
            .chain(self.failed_over_from.iter().filter(|t| self.targets.contains(*t)))
            .map(String::as_str)
    }

    /// Note that the branch left `from`. False when that changes nothing (the branch is
    /// finished, or `from` is already the last destination it left).
    pub fn moved_from(&mut self, from: &str) -> bool {
        if self.outcome.is_some() || self.failed_over_from.last().is_some_and(|l| l == from) {
            return false;
        }
        self.failed_over_from.retain(|l| l != from);
        self.failed_over_from.push(from.to_string());
        true
    }
}

/// Everything routing decided for one unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutedUnit {
    pub id: UnitId,
    /// Source record ids (parts) of the unit.
    pub members: Vec<MessageId>,
    /// Name of the route that matched (empty when none did).
    pub route: String,
    pub routed_at: Timestamp,
    pub branches: Vec<Branch>,
}

impl RoutedUnit {
    pub fn is_complete(&self) -> bool {
        self.branches.iter().all(|b| b.outcome.is_some())
    }
}

/// A branch leaving a destination that could not take it (a failover decision).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchMove {
    pub unit: UnitId,
    pub branch: u16,
    pub from: String,
}

/// A branch completion to record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BranchDone {
    pub unit: UnitId,
    pub branch: u16,
    pub outcome: BranchOutcome,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutedWorkStats {
    pub units: u64,
    pub open_branches: u64,
}

/// Several routed-work changes to make in one transition, applied in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutedWrite {
    pub record: Vec<RoutedUnit>,
    pub moves: Vec<BranchMove>,
    pub complete: Vec<BranchDone>,
    pub remove: Vec<UnitId>,
}

impl RoutedWrite {
    pub fn is_empty(&self) -> bool {
        self.record.is_empty() && self.moves.is_empty() && self.complete.is_empty() && self.remove.is_empty()
    }
}

/// The routed-work stage contract: one write, and the reads restore uses.
#[async_trait]
pub trait RoutedWorkStore: Send + Sync + 'static {
    fn capabilities(&self) -> StageCapabilities;

    /// Apply a write as one transition, durable (for a durable backend) when it returns,
    /// in this order:
    ///
    /// - record routed units. Re-recording a unit that is already recorded keeps the
    ///   existing record: routing decisions are not redone;
    /// - record failovers ([`Branch::moved_from`]); moves of unknown units or finished
    ///   branches are ignored;
    /// - record branch completions. A branch already completed keeps its first outcome;
    ///   completions for unknown units are ignored;
    /// - forget units whose sources completed; unknown ids are ignored.
    async fn apply(&self, write: RoutedWrite) -> Result<(), RoutedWorkError>;

    /// Recorded units with `id > after` in id order, at most `limit`; with several
    /// processes on one database (postgresql), those of the partitions this process
    /// works on.
    async fn load_after(&self, after: Option<UnitId>, limit: usize) -> Result<Vec<RoutedUnit>, RoutedWorkError>;

    async fn stats(&self) -> Result<RoutedWorkStats, RoutedWorkError>;
}
