//! Fixtures the storage tests share: the conformance cases, the file stores' own tests
//! (crash images included) and the PostgreSQL-only cases.

use std::time::Duration;

use crate::dlr::{
    Delivery, DeliveryContent, DeliveryFinish, DeliveryResult, DlrRetention, DlrState, Handoff, HandoffOutcome,
    ProviderReceipt, ReceiptOutcome, ReceiptTarget, ReplyPath,
};
use crate::ids::{MessageId, Timestamp, UnitId};
use crate::record::Address;
use crate::routed_work::{Branch, BranchKind, RoutedUnit};

/// A single message `id` routed by `default` to one destination, its one branch open.
pub(crate) fn routed_to(id: UnitId, destination: &str) -> RoutedUnit {
    RoutedUnit {
        id,
        members: vec![id],
        route: "default".into(),
        routed_at: Timestamp::now(),
        branches: vec![Branch {
            no: 0,
            kind: BranchKind::Primary,
            targets: vec![destination.into()],
            outcome: None,
            failed_over_from: Vec::new(),
        }],
    }
}

/// Each claimed delivery done.
pub(crate) fn delivered(claimed: &[Delivery]) -> Vec<DeliveryFinish> {
    claimed
        .iter()
        .map(|d| DeliveryFinish {
            id: d.id,
            attempt: d.attempt,
            result: DeliveryResult::Delivered,
        })
        .collect()
}

/// An hour's retention, ten minutes for receipts nothing matches yet.
pub(crate) fn retention() -> DlrRetention {
    DlrRetention {
        retention: Duration::from_secs(3600),
        orphan_retention: Duration::from_secs(600),
    }
}

/// A submission of `esme1` owed a receipt by `reply`.
pub(crate) fn target(reply: ReplyPath) -> ReceiptTarget {
    account_target("esme1", reply)
}

/// A submission of `account` owed a receipt by `reply`.
pub(crate) fn account_target(account: &str, reply: ReplyPath) -> ReceiptTarget {
    ReceiptTarget {
        submit_id: MessageId::generate(),
        account: account.into(),
        reply,
        source: Address::new(5, 0, "Sendium"),
        destination: Address::new(1, 1, "447700900123"),
        submitted_at: Timestamp::now(),
        failure_only: false,
    }
}

/// A branch of a new unit submitted at destination `up` with these provider keys.
pub(crate) fn handoff(keys: &[&str], targets: Vec<ReceiptTarget>) -> Handoff {
    unit_handoff(MessageId::generate(), keys, targets)
}

/// Branch 0 of `unit` submitted at destination `up` with these provider keys.
pub(crate) fn unit_handoff(unit: UnitId, keys: &[&str], targets: Vec<ReceiptTarget>) -> Handoff {
    Handoff {
        unit,
        branch: 0,
        destination: "up".into(),
        outcome: HandoffOutcome::Submitted {
            provider_keys: keys.iter().map(|k| k.to_string()).collect(),
        },
        targets,
        handed_off_at: Timestamp::now(),
    }
}

/// A final receipt from `up` for `key`: err 000 when delivered, else 045.
pub(crate) fn receipt(key: &str, state: DlrState) -> ProviderReceipt {
    ProviderReceipt {
        destination: "up".into(),
        keys: vec![key.into()],
        outcome: ReceiptOutcome {
            state,
            error: if state == DlrState::Delivered { "000" } else { "045" }.into(),
            done_at: Timestamp::now(),
        },
    }
}

/// A receipt delivery's outcome (panics on another delivery: the case expected a
/// receipt).
pub(crate) fn outcome_of(d: &Delivery) -> &ReceiptOutcome {
    match &d.content {
        DeliveryContent::Receipt(o) => o,
        DeliveryContent::Inbound(_) | DeliveryContent::Progress(_) => {
            panic!("another delivery where a receipt was expected: {d:?}")
        }
    }
}
