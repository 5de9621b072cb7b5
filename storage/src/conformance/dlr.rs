//! Conformance cases (test-only: the suite is compiled under `#[cfg(test)]`).

use std::time::Duration;

use super::DlrFactory as Factory;
use super::fixtures::{account_target, handoff, receipt, retention, target};
use crate::conformance::ops::DlrOps as _;
use crate::dlr::{
    ClaimCreated, ClaimScope, DeliveryFinish, DeliveryResult, DlrRetention, DlrState, DlrWrite, HandoffOutcome,
    ReceiptMatch, ReceiptOutcome, ReplyPath,
};
use crate::ids::Timestamp;

const LEASE: Duration = Duration::from_secs(30);

fn outcome(state: DlrState, err: &str) -> ReceiptOutcome {
    ReceiptOutcome {
        state,
        error: err.into(),
        done_at: Timestamp::now(),
    }
}

fn later() -> Timestamp {
    Timestamp::now().saturating_add(Duration::from_secs(1))
}

pub(crate) async fn resolves_delivered_when_every_part_delivered(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let t1 = target(ReplyPath::Smpp);
    let t2 = target(ReplyPath::Http {
        url: "http://127.0.0.1:1/cb".into(),
    });
    let h = handoff(&["p1", "p2", "p3"], vec![t1.clone(), t2.clone()]);
    s.hand_off(vec![h.clone()]).await.unwrap();
    assert_eq!(s.stats().await.unwrap().correlations, 3);
    let m = s
        .record_receipts(vec![
            receipt("p1", DlrState::Delivered),
            receipt("p2", DlrState::Delivered),
        ])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![
            ReceiptMatch::Matched {
                unit: h.unit,
                resolved: false
            },
            ReceiptMatch::Matched {
                unit: h.unit,
                resolved: false
            }
        ]
    );
    assert!(
        s.claim_due(later(), LEASE, 10, ClaimScope::All)
            .await
            .unwrap()
            .is_empty(),
        "not resolved yet"
    );
    let m = s
        .record_receipts(vec![receipt("p3", DlrState::Delivered)])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![ReceiptMatch::Matched {
            unit: h.unit,
            resolved: true
        }]
    );
    let mut due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    due.sort_by_key(|d| d.id);
    assert_eq!(due.len(), 2, "one delivery per receipt target");
    assert_eq!(due[0].target, t1);
    assert_eq!(due[1].target, t2);
    assert!(
        due.iter()
            .all(|d| d.outcome.state == DlrState::Delivered && d.attempt == 1)
    );
    // A repeated receipt never produces another delivery.
    let m = s
        .record_receipts(vec![receipt("p3", DlrState::Delivered)])
        .await
        .unwrap();
    assert!(matches!(m[0], ReceiptMatch::Duplicate { .. } | ReceiptMatch::Orphaned));
    s.finish(
        due.iter()
            .map(|d| DeliveryFinish {
                id: d.id,
                attempt: d.attempt,
                result: DeliveryResult::Delivered,
            })
            .collect(),
    )
    .await
    .unwrap();
    let far = Timestamp::now().saturating_add(Duration::from_secs(120));
    assert!(s.claim_due(far, LEASE, 10, ClaimScope::All).await.unwrap().is_empty());
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 0);
}

pub(crate) async fn first_failure_resolves_at_once(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let h = handoff(&["a", "b"], vec![target(ReplyPath::Smpp)]);
    s.hand_off(vec![h.clone()]).await.unwrap();
    let m = s
        .record_receipts(vec![receipt("b", DlrState::Undeliverable)])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![ReceiptMatch::Matched {
            unit: h.unit,
            resolved: true
        }]
    );
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].outcome.state, DlrState::Undeliverable);
    assert_eq!(due[0].outcome.error, "045");
    let m = s
        .record_receipts(vec![receipt("a", DlrState::Delivered)])
        .await
        .unwrap();
    assert!(matches!(m[0], ReceiptMatch::Duplicate { .. } | ReceiptMatch::Orphaned));
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 1, "no second receipt");
}

pub(crate) async fn orphan_receipts_match_a_later_handoff(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let m = s
        .record_receipts(vec![receipt("early", DlrState::Delivered)])
        .await
        .unwrap();
    assert_eq!(m, vec![ReceiptMatch::Orphaned]);
    assert_eq!(s.stats().await.unwrap().orphans, 1);
    let h = handoff(&["early"], vec![target(ReplyPath::Smpp)]);
    s.hand_off(vec![h]).await.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1, "the orphan resolved the message at handoff");
    assert_eq!(due[0].outcome.state, DlrState::Delivered);
    assert_eq!(s.stats().await.unwrap().orphans, 0);
}

pub(crate) async fn repeated_handoff_is_idempotent(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let h = handoff(&["x1"], vec![target(ReplyPath::Smpp)]);
    s.hand_off(vec![h.clone()]).await.unwrap();
    s.hand_off(vec![h.clone()]).await.unwrap();
    assert_eq!(s.stats().await.unwrap().awaiting_receipts, 1);
    s.record_receipts(vec![receipt("x1", DlrState::Delivered)])
        .await
        .unwrap();
    // A repeat after resolution does not start the branch over.
    s.hand_off(vec![h]).await.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(s.stats().await.unwrap().awaiting_receipts, 0);
}

pub(crate) async fn resubmission_replaces_provider_ids(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let h = handoff(&["old"], vec![target(ReplyPath::Smpp)]);
    s.hand_off(vec![h.clone()]).await.unwrap();
    let mut again = h.clone();
    again.outcome = HandoffOutcome::Submitted {
        provider_keys: vec!["new".into()],
    };
    s.hand_off(vec![again]).await.unwrap();
    let m = s
        .record_receipts(vec![receipt("new", DlrState::Delivered)])
        .await
        .unwrap();
    assert_eq!(
        m,
        vec![ReceiptMatch::Matched {
            unit: h.unit,
            resolved: true
        }]
    );
    assert_eq!(s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap().len(), 1);
}

pub(crate) async fn failure_only_targets(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let mut t = target(ReplyPath::Smpp);
    t.failure_only = true;
    let ok = handoff(&["ok"], vec![t.clone()]);
    let bad = handoff(&["bad"], vec![t]);
    s.hand_off(vec![ok, bad.clone()]).await.unwrap();
    s.record_receipts(vec![
        receipt("ok", DlrState::Delivered),
        receipt("bad", DlrState::Rejected),
    ])
    .await
    .unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1, "failure-only receipts skip successes");
    assert_eq!(due[0].outcome.state, DlrState::Rejected);
    if let Some(gate) = s.capabilities().reservations {
        assert_eq!(gate.held(), 0, "the skipped receipt's reservation is released");
    }
}

pub(crate) async fn failed_handoff_delivers_failure_receipt(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let t = target(ReplyPath::Http {
        url: "http://127.0.0.1:1/cb".into(),
    });
    let mut h = handoff(&[], vec![t.clone()]);
    h.outcome = HandoffOutcome::Failed(outcome(DlrState::Undeliverable, "001"));
    s.hand_off(vec![h.clone()]).await.unwrap();
    s.hand_off(vec![h]).await.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].target, t);
    assert_eq!(due[0].outcome.error, "001");
}

pub(crate) async fn claims_are_leased_and_fenced(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    s.hand_off(vec![handoff(&["k"], vec![target(ReplyPath::Smpp)])])
        .await
        .unwrap();
    s.record_receipts(vec![receipt("k", DlrState::Delivered)])
        .await
        .unwrap();
    let now = later();
    let first = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(
        s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap().is_empty(),
        "a claim hides the delivery"
    );
    let after_lease = now.saturating_add(LEASE).saturating_add(Duration::from_secs(1));
    let second = s.claim_due(after_lease, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(second.len(), 1, "an expired lease makes it due again");
    assert_eq!(second[0].attempt, first[0].attempt + 1);
    // The stale attempt's result is ignored.
    s.finish(vec![DeliveryFinish {
        id: first[0].id,
        attempt: first[0].attempt,
        result: DeliveryResult::Delivered,
    }])
    .await
    .unwrap();
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 1);
    let retry_at = after_lease.saturating_add(Duration::from_secs(5));
    s.finish(vec![DeliveryFinish {
        id: second[0].id,
        attempt: second[0].attempt,
        result: DeliveryResult::Retry { at: retry_at },
    }])
    .await
    .unwrap();
    assert!(
        s.claim_due(after_lease, LEASE, 10, ClaimScope::All)
            .await
            .unwrap()
            .is_empty()
    );
    let third = s.claim_due(retry_at, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(third.len(), 1);
    s.finish(vec![DeliveryFinish {
        id: third[0].id,
        attempt: third[0].attempt,
        result: DeliveryResult::Dead,
    }])
    .await
    .unwrap();
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 0);
}

pub(crate) async fn wake_account_makes_parked_smpp_receipts_due(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    s.hand_off(vec![handoff(&["w"], vec![target(ReplyPath::Smpp)])])
        .await
        .unwrap();
    s.record_receipts(vec![receipt("w", DlrState::Delivered)])
        .await
        .unwrap();
    let now = later();
    let d = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    let parked_until = now.saturating_add(Duration::from_secs(3600));
    s.finish(vec![DeliveryFinish {
        id: d[0].id,
        attempt: d[0].attempt,
        result: DeliveryResult::Retry { at: parked_until },
    }])
    .await
    .unwrap();
    assert!(s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap().is_empty());
    assert_eq!(s.wake_account("other", now).await.unwrap(), 0);
    assert_eq!(s.wake_account("esme1", now).await.unwrap(), 1);
    assert_eq!(s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap().len(), 1);
}

pub(crate) async fn a_scoped_claim_takes_http_and_the_smpp_receipts_of_its_accounts(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let http = ReplyPath::Http {
        url: "http://127.0.0.1:9/receipts".to_string(),
    };
    s.hand_off(vec![
        handoff(&["a"], vec![account_target("esme1", ReplyPath::Smpp)]),
        handoff(&["b"], vec![account_target("esme2", ReplyPath::Smpp)]),
        handoff(&["c"], vec![account_target("esme3", http)]),
    ])
    .await
    .unwrap();
    s.record_receipts(vec![
        receipt("a", DlrState::Delivered),
        receipt("b", DlrState::Delivered),
        receipt("c", DlrState::Delivered),
    ])
    .await
    .unwrap();
    let now = later();
    let bound = ["esme2".to_string()];
    let got = s
        .claim_due(now, LEASE, 10, ClaimScope::SmppAccounts(&bound))
        .await
        .unwrap();
    let mut accounts: Vec<&str> = got.iter().map(|d| d.target.account.as_str()).collect();
    accounts.sort_unstable();
    assert_eq!(
        accounts,
        vec!["esme2", "esme3"],
        "HTTP, and SMPP of the bound accounts only"
    );
    assert!(
        s.claim_due(now, LEASE, 10, ClaimScope::SmppAccounts(&bound))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        s.claim_due(now, LEASE, 10, ClaimScope::SmppAccounts(&[]))
            .await
            .unwrap()
            .is_empty()
    );
    // Bound elsewhere (or nowhere), esme1's receipt stays due for the process it binds to.
    let rest = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].target.account, "esme1");
}

pub(crate) async fn expires_after_retention(f: &dyn Factory) {
    let short = DlrRetention {
        retention: Duration::from_secs(60),
        orphan_retention: Duration::from_secs(10),
    };
    let s = f.dlr(100, short).await;
    s.hand_off(vec![handoff(&["never"], vec![target(ReplyPath::Smpp)])])
        .await
        .unwrap();
    s.hand_off(vec![handoff(&["done"], vec![target(ReplyPath::Smpp)])])
        .await
        .unwrap();
    s.record_receipts(vec![
        receipt("done", DlrState::Delivered),
        receipt("stray", DlrState::Delivered),
    ])
    .await
    .unwrap();
    let before = Timestamp::now().saturating_add(Duration::from_secs(5));
    let r = s.expire(before, 100).await.unwrap();
    assert_eq!((r.unresolved, r.dead_deliveries, r.orphans), (0, 0, 0));
    let past = Timestamp::now().saturating_add(Duration::from_secs(120));
    let r = s.expire(past, 100).await.unwrap();
    assert_eq!(r.unresolved, 1);
    assert_eq!(r.dead_deliveries, 1);
    assert_eq!(r.orphans, 1);
    let st = s.stats().await.unwrap();
    assert_eq!(
        (st.awaiting_receipts, st.pending_deliveries, st.orphans, st.correlations),
        (0, 0, 0, 0)
    );
}

/// One batched step behaves as its parts in turn: a receipt matches a handoff of the
/// same step, a repeated receipt is a duplicate, and a delivery result is fenced.
pub(crate) async fn a_batched_step_equals_its_parts_in_turn(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let done = handoff(&["a1"], vec![target(ReplyPath::Smpp)]);
    s.hand_off(vec![done]).await.unwrap();
    s.record_receipts(vec![receipt("a1", DlrState::Delivered)])
        .await
        .unwrap();
    let claimed = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(claimed.len(), 1);

    let t = target(ReplyPath::Smpp);
    let step = DlrWrite {
        handoffs: vec![handoff(&["b1", "b2"], vec![t.clone()])],
        receipts: vec![
            receipt("b1", DlrState::Delivered),
            receipt("b1", DlrState::Delivered),
            receipt("b2", DlrState::Delivered),
            receipt("nobody", DlrState::Delivered),
        ],
        finishes: vec![DeliveryFinish {
            id: claimed[0].id,
            attempt: claimed[0].attempt + 1,
            result: DeliveryResult::Delivered,
        }],
        claim_created: None,
    };
    let out = s.apply(step).await;
    out.handoffs.unwrap();
    out.finishes.unwrap();
    let matches = out.receipts.unwrap();
    assert_eq!(matches.len(), 4);
    assert!(
        matches!(matches[0], ReceiptMatch::Matched { resolved: false, .. }),
        "{matches:?}"
    );
    assert!(matches!(matches[1], ReceiptMatch::Duplicate { .. }), "{matches:?}");
    assert!(
        matches!(matches[2], ReceiptMatch::Matched { resolved: true, .. }),
        "{matches:?}"
    );
    assert_eq!(matches[3], ReceiptMatch::Orphaned);

    // The stale result left the first delivery claimed: it comes back after its lease.
    let after_lease = later().saturating_add(LEASE).saturating_add(Duration::from_secs(1));
    let due = s.claim_due(after_lease, LEASE, 10, ClaimScope::All).await.unwrap();
    let targets: Vec<_> = due.iter().map(|d| d.target.submit_id).collect();
    assert_eq!(due.len(), 2, "the fenced delivery and the new one: {due:?}");
    assert!(targets.contains(&t.submit_id));

    let empty = s.apply(DlrWrite::default()).await;
    assert_eq!(empty.receipts.unwrap(), Vec::new());
}

/// A step asked to claim the deliveries it creates hands at most `limit` of them back,
/// claimed as `claim_due` would (attempt 1, leased): `claim_due` does not give those out
/// again until the lease lapses, their results are fenced by that attempt, and every
/// other delivery the step created is due as usual. (PostgreSQL claims in its writes;
/// memory and file leave everything to `claim_due`.)
pub(crate) async fn a_step_may_claim_the_deliveries_it_creates(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let keys = ["c1", "c2", "c3"];
    let step = DlrWrite {
        handoffs: keys
            .iter()
            .map(|k| handoff(&[k], vec![target(ReplyPath::Smpp)]))
            .collect(),
        receipts: keys.iter().map(|k| receipt(k, DlrState::Delivered)).collect(),
        finishes: Vec::new(),
        claim_created: Some(ClaimCreated { lease: LEASE, limit: 2 }),
    };
    let out = s.apply(step).await;
    out.handoffs.unwrap();
    let matches = out.receipts.unwrap();
    assert!(
        matches
            .iter()
            .all(|m| matches!(m, ReceiptMatch::Matched { resolved: true, .. }))
    );
    let claimed = out.claimed;
    // A store that says it claims in its writes does, up to the limit; one that does not
    // claims nothing (and the correlator then runs claim rounds for everything).
    if s.capabilities().claims_in_writes {
        assert_eq!(claimed.len(), 2, "{claimed:?}");
    } else {
        assert!(claimed.is_empty(), "{claimed:?}");
    }
    assert!(claimed.iter().all(|d| d.attempt == 1), "{claimed:?}");
    assert!(claimed.iter().all(|d| d.outcome.state == DlrState::Delivered));

    // The others are due now; the claimed ones are not.
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len() + claimed.len(), 3, "due {due:?} claimed {claimed:?}");
    for d in &due {
        assert!(claimed.iter().all(|c| c.id != d.id), "handed out twice: {d:?}");
    }

    // A claimed delivery's result is fenced by its attempt: a stale one changes nothing,
    // the right one finishes it.
    if let Some(c) = claimed.first() {
        s.finish(vec![DeliveryFinish {
            id: c.id,
            attempt: c.attempt + 1,
            result: DeliveryResult::Delivered,
        }])
        .await
        .unwrap();
        s.finish(vec![DeliveryFinish {
            id: c.id,
            attempt: c.attempt,
            result: DeliveryResult::Delivered,
        }])
        .await
        .unwrap();
    }
    let mut finished: Vec<DeliveryFinish> = super::fixtures::delivered(&due);
    s.finish(std::mem::take(&mut finished)).await.unwrap();
    // After the lease only the unfinished claimed one (if any) comes back.
    let after_lease = later().saturating_add(LEASE).saturating_add(Duration::from_secs(1));
    let back = s.claim_due(after_lease, LEASE, 10, ClaimScope::All).await.unwrap();
    let expected: Vec<_> = claimed.iter().skip(1).map(|d| d.id).collect();
    assert_eq!(back.iter().map(|d| d.id).collect::<Vec<_>>(), expected);
}
