//! The single-step writes the tests speak in, each one call of its store's one write.
//! Test-only: the stores offer only their batch writes, so a case that says `admit` still
//! exercises the contract the actors use.

use async_trait::async_trait;

use crate::dlr::{DeliveryFinish, DlrStore, DlrWrite, Handoff, ProviderReceipt, ReceiptMatch};
use crate::error::{DlrError, PendingError, RoutedWorkError, RouterQueueError};
use crate::ids::{ReadySeq, UnitId};
use crate::pending::{AdmitOutcome, PendingStore};
use crate::record::PendingRecord;
use crate::routed_work::{BranchDone, BranchMove, RoutedUnit, RoutedWorkStore, RoutedWrite};
use crate::router_queue::{RouterQueueStore, RouterQueueWrite, StagedUnit};

#[async_trait]
pub(crate) trait PendingOps {
    async fn admit(&self, batch: Vec<PendingRecord>) -> Result<Vec<AdmitOutcome>, PendingError>;
    async fn complete(&self, ids: &[UnitId]) -> Result<(), PendingError>;
}

#[async_trait]
impl<T: PendingStore + ?Sized> PendingOps for T {
    async fn admit(&self, batch: Vec<PendingRecord>) -> Result<Vec<AdmitOutcome>, PendingError> {
        self.commit(batch, &[]).await
    }

    async fn complete(&self, ids: &[UnitId]) -> Result<(), PendingError> {
        self.commit(Vec::new(), ids).await.map(|_| ())
    }
}

#[async_trait]
pub(crate) trait RouterQueueOps {
    async fn stage(&self, units: &[StagedUnit], cursor: ReadySeq) -> Result<(), RouterQueueError>;
    async fn release(&self, ids: &[UnitId]) -> Result<(), RouterQueueError>;
}

#[async_trait]
impl<T: RouterQueueStore + ?Sized> RouterQueueOps for T {
    async fn stage(&self, units: &[StagedUnit], cursor: ReadySeq) -> Result<(), RouterQueueError> {
        self.apply(RouterQueueWrite {
            stage: units.to_vec(),
            cursor: Some(cursor.into()),
            release: Vec::new(),
        })
        .await
    }

    async fn release(&self, ids: &[UnitId]) -> Result<(), RouterQueueError> {
        self.apply(RouterQueueWrite {
            release: ids.to_vec(),
            ..RouterQueueWrite::default()
        })
        .await
    }
}

#[async_trait]
pub(crate) trait RoutedWorkOps {
    async fn record(&self, units: Vec<RoutedUnit>) -> Result<(), RoutedWorkError>;
    async fn move_branches(&self, moves: Vec<BranchMove>) -> Result<(), RoutedWorkError>;
    async fn complete(&self, done: Vec<BranchDone>) -> Result<(), RoutedWorkError>;
    async fn remove(&self, ids: &[UnitId]) -> Result<(), RoutedWorkError>;
}

#[async_trait]
impl<T: RoutedWorkStore + ?Sized> RoutedWorkOps for T {
    async fn record(&self, units: Vec<RoutedUnit>) -> Result<(), RoutedWorkError> {
        self.apply(RoutedWrite {
            record: units,
            ..RoutedWrite::default()
        })
        .await
    }

    async fn move_branches(&self, moves: Vec<BranchMove>) -> Result<(), RoutedWorkError> {
        self.apply(RoutedWrite {
            moves,
            ..RoutedWrite::default()
        })
        .await
    }

    async fn complete(&self, done: Vec<BranchDone>) -> Result<(), RoutedWorkError> {
        self.apply(RoutedWrite {
            complete: done,
            ..RoutedWrite::default()
        })
        .await
    }

    async fn remove(&self, ids: &[UnitId]) -> Result<(), RoutedWorkError> {
        self.apply(RoutedWrite {
            remove: ids.to_vec(),
            ..RoutedWrite::default()
        })
        .await
    }
}

#[async_trait]
pub(crate) trait DlrOps {
    async fn hand_off(&self, batch: Vec<Handoff>) -> Result<(), DlrError>;
    async fn record_receipts(&self, batch: Vec<ProviderReceipt>) -> Result<Vec<ReceiptMatch>, DlrError>;
    async fn finish(&self, results: Vec<DeliveryFinish>) -> Result<(), DlrError>;
}

#[async_trait]
impl<T: DlrStore + ?Sized> DlrOps for T {
    async fn hand_off(&self, batch: Vec<Handoff>) -> Result<(), DlrError> {
        let step = DlrWrite {
            handoffs: batch,
            ..DlrWrite::default()
        };
        self.apply(step).await.handoffs
    }

    async fn record_receipts(&self, batch: Vec<ProviderReceipt>) -> Result<Vec<ReceiptMatch>, DlrError> {
        let step = DlrWrite {
            receipts: batch,
            ..DlrWrite::default()
        };
        self.apply(step).await.receipts
    }

    async fn finish(&self, results: Vec<DeliveryFinish>) -> Result<(), DlrError> {
        let step = DlrWrite {
            finishes: results,
            ..DlrWrite::default()
        };
        self.apply(step).await.finishes
    }
}
