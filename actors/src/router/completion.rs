//! A branch's end: its outcome handed to the DLR store when it owes a receipt, and the
//! source completed once every branch and handoff is terminal.

use std::time::Instant;

use sendium_storage::{
    BranchDone, BranchFailure, BranchKind, BranchOutcome, DlrState, Handoff, HandoffOutcome, ReceiptOutcome, Timestamp,
    UnitId,
};

use super::{BranchKey, RouterState, Tracked};
use crate::ingress::IngressMsg;

fn failure_state(f: &BranchFailure) -> DlrState {
    match f {
        BranchFailure::NoRoute | BranchFailure::Unencodable => DlrState::Undeliverable,
        BranchFailure::Expired => DlrState::Expired,
        BranchFailure::Rejected { .. } => DlrState::Rejected,
    }
}

impl RouterState {
    pub(super) fn needs_handoff(&self, t: &Tracked, branch: u16) -> bool {
        self.dlr_enabled && t.branch(branch).is_some_and(|b| b.kind == BranchKind::Primary) && !t.targets.is_empty()
    }

    /// The DLR handoff of a branch outcome.
    pub(super) fn handoff(t: &Tracked, branch: u16, outcome: &BranchOutcome, keys: &[String]) -> Handoff {
        Handoff {
            unit: t.unit.id,
            branch,
            destination: match outcome {
                BranchOutcome::Submitted { destination, .. } => destination.clone(),
                BranchOutcome::Failed { destination, .. } => destination.clone().unwrap_or_default(),
            },
            outcome: match outcome {
                BranchOutcome::Submitted { .. } => HandoffOutcome::Submitted {
                    provider_keys: keys.to_vec(),
                },
                BranchOutcome::Failed { failure, .. } => HandoffOutcome::Failed(ReceiptOutcome {
                    state: failure_state(failure),
                    error: failure.error_code(),
                    done_at: Timestamp::now(),
                }),
            },
            targets: t.targets.clone(),
            handed_off_at: Timestamp::now(),
        }
    }

    pub(super) fn handed_off(&mut self, keys: Vec<BranchKey>) {
        for key in keys {
            if let Some(t) = self.units.get_mut(&key.unit)
                && let Some((outcome, _, _)) = t.awaiting_handoff.remove(key.branch)
            {
                t.closing.push(key.branch);
                self.done.push(BranchDone {
                    unit: key.unit,
                    branch: key.branch,
                    outcome,
                });
            }
        }
    }

    pub(super) fn check_complete(&mut self, id: UnitId) {
        let Some(t) = self.units.get_mut(&id) else {
            return;
        };
        if t.completion_sent || !t.routed.is_complete() || !t.awaiting_handoff.is_empty() {
            return;
        }
        t.completion_sent = true;
        t.completion_asked = Some(Instant::now());
        self.shared.dir.ingress.send(IngressMsg::Complete(vec![id]));
    }
}
