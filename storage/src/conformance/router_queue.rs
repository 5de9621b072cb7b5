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
    assert_eq!(s.cursor().await.unwrap(), ReadySeq(0));
    let batch1 = vec![staged(1), staged(2), staged(3)];
    s.stage(&batch1, ReadySeq(3)).await.unwrap();
    let batch2 = vec![staged(5)];
    s.stage(&batch2, ReadySeq(6)).await.unwrap();
    assert_eq!(s.cursor().await.unwrap(), kept(6));
    // The cursor never moves back.
    s.stage(&[], ReadySeq(2)).await.unwrap();
    assert_eq!(s.cursor().await.unwrap(), kept(6));
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
    assert_eq!(st.cursor, kept, "release does not move the cursor");
}
