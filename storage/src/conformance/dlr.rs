//! Conformance cases (test-only: the suite is compiled under `#[cfg(test)]`).

use std::time::Duration;

use super::DlrFactory as Factory;
use super::fixtures::{account_target, handoff, outcome_of, receipt, retention, target};
use crate::conformance::ops::DlrOps as _;
use crate::dlr::{
    ClaimCreated, ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryResult, DlrRetention, DlrState,
    DlrStore, DlrWrite, HandoffOutcome, IntermediateReceipt, ProgressReport, ReceiptMatch, ReceiptOutcome, ReplyPath,
};
use crate::ids::{MessageId, Timestamp};
use crate::inbound::{InboundGroup, InboundGroupKey, InboundMessage, InboundPart, RoutedInbound};
use crate::record::Address;

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
            .all(|d| outcome_of(d).state == DlrState::Delivered && d.attempt == 1)
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
    assert_eq!(outcome_of(&due[0]).state, DlrState::Undeliverable);
    assert_eq!(outcome_of(&due[0]).error, "045");
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
    assert_eq!(outcome_of(&due[0]).state, DlrState::Delivered);
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
    assert_eq!(outcome_of(&due[0]).state, DlrState::Rejected);
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
    assert_eq!(outcome_of(&due[0]).error, "001");
    // A refused submission keeps its own state.
    let mut refused = handoff(&[], vec![t.clone()]);
    refused.outcome = HandoffOutcome::Failed(outcome(DlrState::Refused, "069"));
    s.hand_off(vec![refused]).await.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(outcome_of(&due[0]).state, DlrState::Refused);
}

fn progress_of(d: &Delivery) -> &ProgressReport {
    match &d.content {
        DeliveryContent::Progress(p) => p,
        other => panic!("expected a progress report, got {other:?}"),
    }
}

/// Kannel progress reports: a submitted handoff creates a type 8 report for each Kannel
/// target whose mask has 8, once (a repeat creates none); an intermediate receipt creates
/// a type 4 report for each Kannel target whose mask has 4 while the message awaits its
/// final receipt, and none for an id nobody knows or after the message resolved.
pub(crate) async fn kannel_progress_reports(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let kannel = |mask: u8| {
        target(ReplyPath::Kannel {
            url: "http://127.0.0.1:1/dlr?type=%d".into(),
            mask,
        })
    };
    let (all, finals, smpp) = (kannel(31), kannel(3), target(ReplyPath::Smpp));
    let h = handoff(&["q1", "q2"], vec![all.clone(), finals.clone(), smpp]);
    s.hand_off(vec![h.clone()]).await.unwrap();
    s.hand_off(vec![h.clone()]).await.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1, "one type 8 report, not repeated: {due:?}");
    assert_eq!(due[0].target, all);
    let p = progress_of(&due[0]);
    assert_eq!(
        (p.kind, p.text.as_str(), p.smsc.as_str(), p.foreign_id.as_str()),
        (8, "ACK/", "up", "q1")
    );
    let buffered = |keys: &[&str]| IntermediateReceipt {
        destination: "up".into(),
        keys: keys.iter().map(|k| k.to_string()).collect(),
        text: "id:q2 stat:ENROUTE".into(),
        at: Timestamp::now(),
    };
    let step = |intermediate| DlrWrite {
        intermediate,
        ..DlrWrite::default()
    };
    let out = s
        .apply(step(vec![buffered(&["nobody", "q2"]), buffered(&["unknown"])]))
        .await;
    assert!(out.receipts.is_ok());
    assert_eq!(
        out.unmatched_intermediate,
        vec![1],
        "the receipt whose ids nobody knows"
    );
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1, "one type 4 report: {due:?}");
    assert_eq!(due[0].target, all);
    let p = progress_of(&due[0]);
    assert_eq!(
        (p.kind, p.text.as_str(), p.smsc.as_str(), p.foreign_id.as_str()),
        (4, "id:q2 stat:ENROUTE", "up", "q2")
    );
    // Nothing of the message changed: it still awaits both parts.
    assert_eq!(s.stats().await.unwrap().awaiting_receipts, 1);
    s.record_receipts(vec![
        receipt("q1", DlrState::Delivered),
        receipt("q2", DlrState::Delivered),
    ])
    .await
    .unwrap();
    s.apply(step(vec![buffered(&["q1"])])).await;
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 3, "the final receipts only: {due:?}");
    assert!(due.iter().all(|d| matches!(d.content, DeliveryContent::Receipt(_))));
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
        ..DlrWrite::default()
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
        ..DlrWrite::default()
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
    assert!(claimed.iter().all(|d| outcome_of(d).state == DlrState::Delivered));

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

// ---- inbound (MO) messages -------------------------------------------------------------

/// An inbound message from provider `up`, from `447700900123` to `1234`.
pub(crate) fn mo_message(text: &str) -> InboundMessage {
    InboundMessage {
        id: MessageId::generate(),
        from_destination: "up".into(),
        source: Address::new(1, 1, "447700900123"),
        destination: Address::new(0, 1, "1234"),
        data_coding: 0,
        payload: text.as_bytes().to_vec(),
        received_at: Timestamp::now(),
        route: String::new(),
        incomplete: false,
    }
}

/// The group key of a `total`-part message with this `reference`.
pub(crate) fn mo_key(reference: u16, total: u8) -> InboundGroupKey {
    InboundGroupKey {
        from_destination: "up".into(),
        source: "447700900123".into(),
        destination: "1234".into(),
        reference,
        total,
    }
}

/// Part `seq` of the group `key`, its group due at `deadline` if it opens it.
pub(crate) fn mo_part(key: &InboundGroupKey, seq: u8, text: &str, deadline: Timestamp) -> InboundPart {
    InboundPart {
        key: key.clone(),
        seq,
        deadline,
        message: mo_message(text),
    }
}

/// `message` routed to `account` by `reply`.
pub(crate) fn routed(
    account: &str,
    reply: ReplyPath,
    mut message: InboundMessage,
    group: Option<u64>,
) -> RoutedInbound {
    message.route = "mo".into();
    RoutedInbound {
        account: account.into(),
        reply,
        message,
        group,
    }
}

/// A group's message routed over HTTP, as the correlator writes it.
pub(crate) fn routed_group(g: &InboundGroup) -> RoutedInbound {
    let message = g.assemble("").expect("a group has parts");
    routed("mo", mo_http(), message, Some(g.no))
}

pub(crate) fn mo_http() -> ReplyPath {
    ReplyPath::Http {
        url: "http://127.0.0.1:9/mo".into(),
    }
}

fn in_an_hour() -> Timestamp {
    Timestamp::now().saturating_add(Duration::from_secs(3600))
}

/// One step of these parts; its inbound result must be `Ok`.
pub(crate) async fn store_parts(s: &dyn DlrStore, parts: Vec<InboundPart>) -> Vec<InboundGroup> {
    let out = s
        .apply(DlrWrite {
            inbound_parts: parts,
            ..DlrWrite::default()
        })
        .await;
    out.inbound.unwrap();
    out.complete_groups
}

/// One step of these routed messages; its inbound result must be `Ok`.
pub(crate) async fn store_inbound(s: &dyn DlrStore, messages: Vec<RoutedInbound>) {
    let out = s
        .apply(DlrWrite {
            inbound: messages,
            ..DlrWrite::default()
        })
        .await;
    out.inbound.unwrap();
}

fn inbound_of(d: &Delivery) -> &InboundMessage {
    match &d.content {
        DeliveryContent::Inbound(m) => m,
        DeliveryContent::Receipt(_) | DeliveryContent::Progress(_) => {
            panic!("a receipt where an inbound message was expected: {d:?}")
        }
    }
}

/// A routed inbound message is one delivery like a receipt's: due at once (or claimed by
/// its own step), claimed with its target and content, gone once delivered.
pub(crate) async fn an_inbound_message_is_delivered_like_a_receipt(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let r = routed("mo", mo_http(), mo_message("hello"), None);
    store_inbound(&*s, vec![r.clone()]).await;
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 1);
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert_eq!(due[0].target, r.target());
    assert_eq!(due[0].attempt, 1);
    assert_eq!(inbound_of(&due[0]), &r.message);
    assert!(due[0].expires_at > Timestamp::now(), "kept for the retention");
    s.finish(super::fixtures::delivered(&due)).await.unwrap();
    let far = Timestamp::now().saturating_add(Duration::from_secs(120));
    assert!(s.claim_due(far, LEASE, 10, ClaimScope::All).await.unwrap().is_empty());
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 0);

    // Claimed by the step that stores it, where the store claims in its writes.
    let r = routed("esme1", ReplyPath::Smpp, mo_message("again"), None);
    let out = s
        .apply(DlrWrite {
            inbound: vec![r.clone()],
            claim_created: Some(ClaimCreated {
                lease: LEASE,
                limit: 10,
            }),
            ..DlrWrite::default()
        })
        .await;
    out.inbound.unwrap();
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    let got = if s.capabilities().claims_in_writes {
        assert!(due.is_empty(), "claimed by the write: {due:?}");
        out.claimed
    } else {
        assert!(out.claimed.is_empty());
        due
    };
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].attempt, &got[0].target), (1, &r.target()));
    assert_eq!(inbound_of(&got[0]), &r.message);
    s.finish(super::fixtures::delivered(&got)).await.unwrap();
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 0);
}

/// An SMPP inbound message goes to its account like an SMPP receipt: a scoped claim takes
/// it only for a bound account, and a bind wakes it when it was parked.
pub(crate) async fn smpp_inbound_is_scoped_by_account_and_woken_by_a_bind(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    store_inbound(
        &*s,
        vec![
            routed("esme1", ReplyPath::Smpp, mo_message("to one"), None),
            routed("esme2", ReplyPath::Smpp, mo_message("to two"), None),
            routed("web", mo_http(), mo_message("to the web"), None),
        ],
    )
    .await;
    let now = later();
    let bound = ["esme2".to_string()];
    let got = s
        .claim_due(now, LEASE, 10, ClaimScope::SmppAccounts(&bound))
        .await
        .unwrap();
    let mut accounts: Vec<&str> = got.iter().map(|d| d.target.account.as_str()).collect();
    accounts.sort_unstable();
    assert_eq!(accounts, vec!["esme2", "web"]);
    let rest = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(rest.len(), 1);
    assert_eq!(inbound_of(&rest[0]).payload, b"to one");
    // esme1 is not bound: parked until it binds.
    let parked_until = now.saturating_add(Duration::from_secs(3600));
    s.finish(vec![DeliveryFinish {
        id: rest[0].id,
        attempt: rest[0].attempt,
        result: DeliveryResult::Retry { at: parked_until },
    }])
    .await
    .unwrap();
    assert!(s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap().is_empty());
    assert_eq!(s.wake_account("esme2", now).await.unwrap(), 0);
    assert_eq!(s.wake_account("esme1", now).await.unwrap(), 1);
    let woken = s.claim_due(now, LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(woken.len(), 1);
    assert_eq!((woken[0].id, woken[0].attempt), (rest[0].id, rest[0].attempt + 1));
}

/// A three-part message arriving out of order: its group is reported complete by the
/// step of its last part (not before), with its parts in order and the first part's
/// deadline; held parts are counted; writing it makes one delivery of the whole text,
/// and writing it again makes none.
pub(crate) async fn a_multipart_message_is_complete_at_its_last_part_and_written_once(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let key = mo_key(7, 3);
    let first_deadline = in_an_hour();
    assert!(
        store_parts(&*s, vec![mo_part(&key, 3, "three", first_deadline)])
            .await
            .is_empty()
    );
    assert!(
        store_parts(&*s, vec![mo_part(&key, 1, "one ", in_an_hour().saturating_add(LEASE))])
            .await
            .is_empty()
    );
    assert_eq!(s.stats().await.unwrap().inbound_parts, 2);
    assert!(
        s.due_inbound_groups(later(), 10).await.unwrap().is_empty(),
        "neither complete nor overdue"
    );
    let complete = store_parts(&*s, vec![mo_part(&key, 2, "two ", in_an_hour())]).await;
    assert_eq!(complete.len(), 1, "{complete:?}");
    let g = &complete[0];
    assert_eq!((&g.key, g.deadline, g.closed), (&key, first_deadline, false));
    assert_eq!(g.parts.iter().map(|p| p.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(g.is_complete());
    assert_eq!(s.stats().await.unwrap().inbound_parts, 3);
    assert_eq!(
        s.due_inbound_groups(later(), 10).await.unwrap(),
        complete,
        "due until written"
    );

    let r = routed_group(g);
    store_inbound(&*s, vec![r.clone()]).await;
    let st = s.stats().await.unwrap();
    assert_eq!((st.inbound_parts, st.pending_deliveries), (0, 1));
    assert!(s.due_inbound_groups(later(), 10).await.unwrap().is_empty());
    // Written again (a retried step, or another process): nothing more.
    store_inbound(&*s, vec![r.clone(), r.clone()]).await;
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 1);
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    let m = inbound_of(&due[0]);
    assert_eq!(m.payload, b"one two three");
    assert!(!m.incomplete);
    assert_eq!((m.id, m.route.as_str()), (g.parts[0].message.id, "mo"));
    // Twice in one step: one delivery.
    let key = mo_key(8, 2);
    store_parts(&*s, vec![mo_part(&key, 1, "a", in_an_hour())]).await;
    let g = store_parts(&*s, vec![mo_part(&key, 2, "b", in_an_hour())]).await;
    let r = routed_group(&g[0]);
    store_inbound(&*s, vec![r.clone(), r]).await;
    assert_eq!(s.stats().await.unwrap().pending_deliveries, 2);
}

/// A part the open group already holds with the same payload is a retransmission: not
/// stored again, in a later step or in the same one.
pub(crate) async fn a_retransmitted_part_is_not_stored_twice(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let key = mo_key(9, 2);
    let p1 = mo_part(&key, 1, "first ", in_an_hour());
    store_parts(&*s, vec![p1.clone(), p1.clone()]).await;
    assert_eq!(s.stats().await.unwrap().inbound_parts, 1);
    let mut again = p1.clone();
    again.message.id = MessageId::generate();
    assert!(store_parts(&*s, vec![again]).await.is_empty());
    assert_eq!(s.stats().await.unwrap().inbound_parts, 1);
    let complete = store_parts(&*s, vec![mo_part(&key, 2, "second", in_an_hour())]).await;
    assert_eq!(complete.len(), 1);
    assert_eq!(complete[0].parts[0].message, p1.message, "the first copy is kept");
    // A copy of a part of the complete (not yet written) group: still a retransmission.
    assert!(store_parts(&*s, vec![p1]).await.is_empty());
    assert_eq!(s.stats().await.unwrap().inbound_parts, 2);
}

/// A part at a position the open group holds with another payload closes that group
/// (due at once, reported) and opens a new group of the key with the part.
pub(crate) async fn a_conflicting_part_closes_the_open_group_and_opens_another(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let key = mo_key(10, 3);
    let old_deadline = in_an_hour();
    store_parts(
        &*s,
        vec![
            mo_part(&key, 1, "old 1", old_deadline),
            mo_part(&key, 2, "old 2", old_deadline),
        ],
    )
    .await;
    let new_deadline = in_an_hour().saturating_add(LEASE);
    let closed = store_parts(&*s, vec![mo_part(&key, 2, "new 2", new_deadline)]).await;
    assert_eq!(closed.len(), 1, "{closed:?}");
    let old = &closed[0];
    assert!(old.closed && !old.is_complete());
    assert_eq!(
        old.parts
            .iter()
            .map(|p| p.message.payload.as_slice())
            .collect::<Vec<_>>(),
        vec![b"old 1".as_slice(), b"old 2"]
    );
    assert_eq!(s.stats().await.unwrap().inbound_parts, 3);
    assert_eq!(
        s.due_inbound_groups(later(), 10).await.unwrap(),
        closed,
        "the new group is not due"
    );
    // The new group is the key's open one: the rest of the new message joins it.
    let complete = store_parts(
        &*s,
        vec![
            mo_part(&key, 1, "new 1", in_an_hour()),
            mo_part(&key, 3, "new 3", in_an_hour()),
        ],
    )
    .await;
    assert_eq!(complete.len(), 1, "{complete:?}");
    let new = &complete[0];
    assert_ne!(new.no, old.no);
    assert_eq!((new.deadline, new.closed), (new_deadline, false));
    assert_eq!(new.assemble("").unwrap().payload, b"new 1new 2new 3");
    // The closed group is written incomplete with the parts it has.
    let r = routed_group(old);
    assert!(r.message.incomplete);
    store_inbound(&*s, vec![r]).await;
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(inbound_of(&due[0]).payload, b"old 1old 2");
    assert!(inbound_of(&due[0]).incomplete);
}

/// `due_inbound_groups`: complete and closed groups, then those past their deadline
/// (oldest first), nothing else; reading changes nothing.
pub(crate) async fn due_inbound_groups_are_complete_closed_and_overdue_ones(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let ago = |secs: u64| Timestamp(Timestamp::now().0.saturating_sub(secs * 1000));
    let (overdue_a, overdue_b, pending, complete, conflicted) =
        (mo_key(1, 3), mo_key(2, 3), mo_key(3, 3), mo_key(4, 2), mo_key(5, 3));
    store_parts(&*s, vec![mo_part(&overdue_a, 1, "a", ago(10))]).await;
    store_parts(&*s, vec![mo_part(&overdue_b, 2, "b", ago(20))]).await;
    store_parts(&*s, vec![mo_part(&pending, 1, "p", in_an_hour())]).await;
    let c = store_parts(
        &*s,
        vec![
            mo_part(&complete, 1, "c1", in_an_hour()),
            mo_part(&complete, 2, "c2", in_an_hour()),
        ],
    )
    .await;
    store_parts(&*s, vec![mo_part(&conflicted, 1, "x", in_an_hour())]).await;
    let x = store_parts(&*s, vec![mo_part(&conflicted, 1, "y", in_an_hour())]).await;
    assert_eq!((c.len(), x.len()), (1, 1));
    let now = later();
    let due = s.due_inbound_groups(now, 10).await.unwrap();
    let keys: Vec<&InboundGroupKey> = due.iter().map(|g| &g.key).collect();
    assert_eq!(keys, vec![&complete, &conflicted, &overdue_b, &overdue_a], "{due:?}");
    assert!(due[1].closed);
    assert_eq!(
        s.due_inbound_groups(now, 10).await.unwrap(),
        due,
        "reading changes nothing"
    );
    assert_eq!(s.due_inbound_groups(now, 2).await.unwrap(), due[..2].to_vec());
    assert!(s.due_inbound_groups(now, 0).await.unwrap().is_empty());
    // Before the overdue ones' deadlines only the complete and closed ones.
    assert_eq!(s.due_inbound_groups(ago(30), 10).await.unwrap(), due[..2].to_vec());
    assert_eq!(s.stats().await.unwrap().inbound_parts, 7);
    // Written (or dropped), they are due no more.
    let out = s
        .apply(DlrWrite {
            inbound: vec![routed_group(&due[0])],
            inbound_dropped: vec![due[1].no, due[2].no],
            ..DlrWrite::default()
        })
        .await;
    out.inbound.unwrap();
    let left = s.due_inbound_groups(now, 10).await.unwrap();
    assert_eq!(left, due[3..].to_vec());
    let st = s.stats().await.unwrap();
    assert_eq!(
        (st.inbound_parts, st.pending_deliveries),
        (3, 1),
        "left: the overdue, pending and newly opened groups' parts; dropped groups make no delivery"
    );
}

/// A part that joins a group after the caller read it (the group was past its deadline
/// and not written yet) is delivered with the group, not dropped with it.
pub(crate) async fn a_part_joining_a_group_being_written_is_delivered_with_it(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let key = mo_key(11, 3);
    let deadline = Timestamp(Timestamp::now().0.saturating_sub(1000));
    store_parts(
        &*s,
        vec![mo_part(&key, 1, "1", deadline), mo_part(&key, 3, "3", deadline)],
    )
    .await;
    let due = s.due_inbound_groups(later(), 10).await.unwrap();
    assert_eq!(due.len(), 1);
    let stale = routed_group(&due[0]);
    assert!(stale.message.incomplete);
    let complete = store_parts(&*s, vec![mo_part(&key, 2, "2", in_an_hour())]).await;
    assert_eq!(complete.len(), 1, "the late part completed it");
    store_inbound(&*s, vec![stale]).await;
    let d = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(
        (inbound_of(&d[0]).payload.as_slice(), inbound_of(&d[0]).incomplete),
        (b"123".as_slice(), false)
    );
    assert_eq!(s.stats().await.unwrap().inbound_parts, 0);
}

/// An inbound delivery past retention is dead like a receipt's; held parts are not
/// expired (past their deadline they are due, and written by the caller).
pub(crate) async fn inbound_deliveries_expire_and_groups_do_not(f: &dyn Factory) {
    let short = DlrRetention {
        retention: Duration::from_secs(60),
        orphan_retention: Duration::from_secs(10),
    };
    let s = f.dlr(100, short).await;
    store_inbound(&*s, vec![routed("esme1", ReplyPath::Smpp, mo_message("late"), None)]).await;
    let key = mo_key(12, 2);
    store_parts(&*s, vec![mo_part(&key, 1, "half", in_an_hour())]).await;
    let before = Timestamp::now().saturating_add(Duration::from_secs(5));
    assert_eq!(s.expire(before, 100).await.unwrap().dead_deliveries, 0);
    let past = Timestamp::now().saturating_add(Duration::from_secs(7200));
    let r = s.expire(past, 100).await.unwrap();
    assert_eq!((r.dead_deliveries, r.unresolved, r.orphans), (1, 0, 0));
    let st = s.stats().await.unwrap();
    assert_eq!((st.pending_deliveries, st.inbound_parts), (0, 1));
    assert_eq!(s.due_inbound_groups(past, 10).await.unwrap().len(), 1);
}

/// Inbound messages and receipts in one step: each kind is stored as alone.
pub(crate) async fn a_step_stores_receipts_and_inbound_messages_together(f: &dyn Factory) {
    let s = f.dlr(100, retention()).await;
    let h = handoff(&["r1"], vec![target(ReplyPath::Smpp)]);
    let key = mo_key(13, 2);
    let out = s
        .apply(DlrWrite {
            handoffs: vec![h.clone()],
            receipts: vec![receipt("r1", DlrState::Delivered)],
            inbound_parts: vec![mo_part(&key, 1, "a", in_an_hour()), mo_part(&key, 2, "b", in_an_hour())],
            inbound: vec![routed("esme1", ReplyPath::Smpp, mo_message("whole"), None)],
            ..DlrWrite::default()
        })
        .await;
    out.handoffs.unwrap();
    out.inbound.unwrap();
    assert_eq!(
        out.receipts.unwrap(),
        vec![ReceiptMatch::Matched {
            unit: h.unit,
            resolved: true
        }]
    );
    assert_eq!(out.complete_groups.len(), 1);
    let due = s.claim_due(later(), LEASE, 10, ClaimScope::All).await.unwrap();
    let mut kinds: Vec<bool> = due
        .iter()
        .map(|d| matches!(d.content, DeliveryContent::Inbound(_)))
        .collect();
    kinds.sort_unstable();
    assert_eq!(kinds, vec![false, true], "{due:?}");
}
