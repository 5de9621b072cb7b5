//! Conformance cases (test-only: the suite is compiled under `#[cfg(test)]`).

use super::Factory;
use crate::conformance::ops::RouterQueueOps as _;
use crate::ids::{MessageId, ReadySeq};
use crate::router_queue::StagedUnit;

fn staged(seq: u64) -> StagedUnit {
    StagedUnit {
        id: MessageId::generate(),
        seq: ReadySeq(seq),
    }
}

pub(crate) async fn stages_batches_with_cursor(f: &dyn Factory) {
    let s = f.router_queue().await;
    // A store that keeps no cursor answers 0 throughout.
    let kept = |seq: u64| if s.keeps_cursor() { ReadySeq(seq) } else { ReadySeq(0) };
    assert_eq!(s.cursor().await.unwrap(), crate::ReadyCursor::START);
    let batch1 = vec![staged(1), staged(2), staged(3)];
    s.stage(&batch1, ReadySeq(3)).await.unwrap();
    let batch2 = vec![staged(5)];
    s.stage(&batch2, ReadySeq(6)).await.unwrap();
    assert_eq!(s.cursor().await.unwrap(), kept(6).into());
    // The cursor never moves back.
    s.stage(&[], ReadySeq(2)).await.unwrap();
    assert_eq!(s.cursor().await.unwrap(), kept(6).into());
    let page = s.staged_after(ReadySeq(0), 2).await.unwrap();
    assert_eq!(page, vec![batch1[0], batch1[1]]);
    let page = s.staged_after(ReadySeq(2), 10).await.unwrap();
    assert_eq!(page, vec![batch1[2], batch2[0]]);
    // Staging the same unit again keeps one entry.
    s.stage(&[batch1[0]], ReadySeq(6)).await.unwrap();
    assert_eq!(s.stats().await.unwrap().staged, 4);
}

pub(crate) async fn releases_idempotently(f: &dyn Factory) {
    let s = f.router_queue().await;
    let batch = vec![staged(1), staged(2)];
    s.stage(&batch, ReadySeq(2)).await.unwrap();
    s.release(&[batch[0].id]).await.unwrap();
    s.release(&[batch[0].id, MessageId::generate()]).await.unwrap();
    assert_eq!(s.staged_after(ReadySeq(0), 10).await.unwrap(), vec![batch[1]]);
    let st = s.stats().await.unwrap();
    assert_eq!(st.staged, 1);
    let kept = if s.keeps_cursor() { ReadySeq(2) } else { ReadySeq(0) };
    assert_eq!(st.cursor, kept.into(), "release does not move the cursor");
}

/// Each priority lane keeps its own cursor, and none moves backwards.
pub(crate) async fn keeps_a_cursor_per_priority_lane(f: &dyn Factory) {
    let s = f.router_queue().await;
    let (bulk, urgent) = (ReadySeq::in_lane(0, 40), ReadySeq::in_lane(9, 41));
    let mut both = crate::ReadyCursor::from(bulk);
    both.advance(urgent);
    s.apply(crate::router_queue::RouterQueueWrite {
        stage: vec![
            StagedUnit {
                id: MessageId::generate(),
                seq: bulk,
            },
            StagedUnit {
                id: MessageId::generate(),
                seq: urgent,
            },
        ],
        cursor: Some(both),
        release: Vec::new(),
    })
    .await
    .unwrap();
    // Lane 9 behind and lane 5 ahead: only lane 5 moves.
    let mut mixed = crate::ReadyCursor::from(ReadySeq::in_lane(9, 7));
    mixed.advance(ReadySeq::in_lane(5, 50));
    s.stage(&[], ReadySeq::in_lane(0, 3)).await.unwrap();
    s.apply(crate::router_queue::RouterQueueWrite {
        cursor: Some(mixed),
        ..Default::default()
    })
    .await
    .unwrap();
    let cursor = s.cursor().await.unwrap();
    if s.keeps_cursor() {
        assert_eq!(cursor.lane(0), bulk);
        assert_eq!(cursor.lane(9), urgent);
        assert_eq!(cursor.lane(5), ReadySeq::in_lane(5, 50));
        assert_eq!(cursor.lane(3), ReadySeq(0));
        assert_eq!(s.stats().await.unwrap().cursor, cursor);
    } else {
        assert_eq!(cursor, crate::ReadyCursor::START);
    }
    // Staged units of every lane are restored, in seq order.
    let page = s.staged_after(ReadySeq(0), 10).await.unwrap();
    assert_eq!(page.iter().map(|u| u.seq).collect::<Vec<_>>(), vec![bulk, urgent]);
}
