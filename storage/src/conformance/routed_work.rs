//! Conformance cases (test-only: the suite is compiled under `#[cfg(test)]`).

use super::Factory;
use crate::conformance::ops::RoutedWorkOps as _;
use crate::ids::{MessageId, Timestamp};
use crate::routed_work::{Branch, BranchDone, BranchFailure, BranchKind, BranchMove, BranchOutcome, RoutedUnit};

fn unit(branches: u16) -> RoutedUnit {
    let id = MessageId::generate();
    RoutedUnit {
        id,
        members: vec![id],
        route: "default".into(),
        routed_at: Timestamp::now(),
        branches: (0..branches)
            .map(|no| Branch {
                no,
                kind: if no == 0 { BranchKind::Primary } else { BranchKind::Copy },
                targets: vec!["a".into(), "b".into()],
                outcome: None,
                failed_over_from: Vec::new(),
            })
            .collect(),
    }
}

fn submitted(id: &str) -> BranchOutcome {
    BranchOutcome::Submitted {
        destination: "a".into(),
        provider_ids: vec![id.into()],
    }
}

pub(crate) async fn records_once_and_completes_first_outcome(f: &dyn Factory) {
    let s = f.routed_work().await;
    let u = unit(2);
    s.record(vec![u.clone()]).await.unwrap();
    let mut changed = u.clone();
    changed.branches[0].targets = vec!["z".into()];
    s.record(vec![changed]).await.unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(all, vec![u.clone()], "re-recording keeps the first routing decision");
    assert_eq!(s.stats().await.unwrap().open_branches, 2);

    s.complete(vec![BranchDone {
        unit: u.id,
        branch: 1,
        outcome: submitted("p1"),
    }])
    .await
    .unwrap();
    s.complete(vec![
        BranchDone {
            unit: u.id,
            branch: 1,
            outcome: submitted("p2"),
        },
        BranchDone {
            unit: MessageId::generate(),
            branch: 0,
            outcome: submitted("x"),
        },
    ])
    .await
    .unwrap();
    let got = s.load_after(None, 10).await.unwrap();
    assert_eq!(got[0].branches[1].outcome, Some(submitted("p1")), "first outcome wins");
    assert!(!got[0].is_complete());
    assert_eq!(s.stats().await.unwrap().open_branches, 1);
    s.complete(vec![BranchDone {
        unit: u.id,
        branch: 0,
        outcome: BranchOutcome::Failed {
            destination: Some("a".into()),
            failure: BranchFailure::Rejected { status: 0x45 },
        },
    }])
    .await
    .unwrap();
    let got = s.load_after(None, 10).await.unwrap();
    assert!(got[0].is_complete());
    assert_eq!(s.stats().await.unwrap().open_branches, 0);
}

pub(crate) async fn pages_and_removes(f: &dyn Factory) {
    let s = f.routed_work().await;
    let units: Vec<_> = (0..5).map(|_| unit(1)).collect();
    s.record(units.clone()).await.unwrap();
    let first = s.load_after(None, 2).await.unwrap();
    assert_eq!(
        first.iter().map(|u| u.id).collect::<Vec<_>>(),
        vec![units[0].id, units[1].id]
    );
    let rest = s.load_after(Some(units[1].id), 10).await.unwrap();
    assert_eq!(rest.len(), 3);
    s.remove(&[units[0].id, units[0].id, units[3].id]).await.unwrap();
    let st = s.stats().await.unwrap();
    assert_eq!(st.units, 3);
    assert_eq!(st.open_branches, 3);
    let left: Vec<_> = s
        .load_after(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.id)
        .collect();
    assert_eq!(left, vec![units[1].id, units[2].id, units[4].id]);
}

pub(crate) async fn applies_record_complete_and_remove_together(f: &dyn Factory) {
    let s = f.routed_work().await;
    let a = unit(1);
    let b = unit(1);
    s.record(vec![a.clone()]).await.unwrap();
    s.apply(crate::routed_work::RoutedWrite {
        record: vec![b.clone()],
        moves: Vec::new(),
        complete: vec![BranchDone {
            unit: b.id,
            branch: 0,
            outcome: submitted("pb"),
        }],
        remove: vec![a.id],
    })
    .await
    .unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].id, b.id);
    assert_eq!(
        all[0].branches[0].outcome,
        Some(submitted("pb")),
        "a unit recorded and completed in one write"
    );
    let st = s.stats().await.unwrap();
    assert_eq!((st.units, st.open_branches), (1, 0));
}

/// Failovers are recorded with the branch; the targets a branch left come last, the one
/// it left longest ago first, and a finished branch or an unknown unit is not moved.
pub(crate) async fn records_failovers_with_the_branch(f: &dyn Factory) {
    let s = f.routed_work().await;
    let mut u = unit(2);
    u.branches[0].targets = vec!["a".into(), "b".into(), "c".into()];
    s.record(vec![u.clone()]).await.unwrap();
    let moved = |from: &str| BranchMove {
        unit: u.id,
        branch: 0,
        from: from.into(),
    };
    let preference = |u: &RoutedUnit| u.branches[0].preference().map(str::to_string).collect::<Vec<_>>();
    s.move_branches(vec![moved("a")]).await.unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(all[0].branches[0].failed_over_from, vec!["a".to_string()]);
    assert_eq!(preference(&all[0]), vec!["b", "c", "a"]);
    // In one write with other changes, and twice from the same target: no change.
    s.apply(crate::routed_work::RoutedWrite {
        moves: vec![moved("b"), moved("b")],
        complete: vec![BranchDone {
            unit: u.id,
            branch: 1,
            outcome: submitted("p1"),
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(preference(&all[0]), vec!["c", "a", "b"]);
    s.move_branches(vec![moved("a")]).await.unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(preference(&all[0]), vec!["c", "b", "a"], "left again: last again");
    // A finished branch stays where it ended; an unknown unit is ignored.
    s.move_branches(vec![
        BranchMove {
            unit: u.id,
            branch: 1,
            from: "a".into(),
        },
        BranchMove {
            unit: MessageId::generate(),
            branch: 0,
            from: "a".into(),
        },
    ])
    .await
    .unwrap();
    let all = s.load_after(None, 10).await.unwrap();
    assert_eq!(all.len(), 1);
    assert!(all[0].branches[1].failed_over_from.is_empty());
    assert_eq!(s.stats().await.unwrap().open_branches, 1);
}
