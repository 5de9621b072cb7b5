//! Sendium's storage stages.
//!
//! Four stages, each one trait with backends side by side and one conformance suite run
//! against all of them:
//!
//! | stage | owner actor | trait |
//! |---|---|---|
//! | pending | Ingress | [`PendingStore`] |
//! | router-queue | Selector | [`RouterQueueStore`] |
//! | routed-work | Router | [`RoutedWorkStore`] |
//! | dlr | DlrCorrelator | [`DlrStore`] |
//!
//! No cross-stage transaction is assumed: every record carries stable ids
//! ([`MessageId`], [`UnitId`], branch numbers) and the actors reconcile by them.
#![forbid(unsafe_code)]

pub mod backend;
pub mod dlr;
pub mod envelope;
pub mod error;
pub mod failpoint;
pub mod file;
pub mod ids;
pub mod inbound;
pub mod memory;
pub mod pending;
pub mod postgresql;
pub mod reassembly;
pub mod record;
pub mod routed_work;
pub mod router_queue;

#[cfg(test)]
mod conformance;

pub use backend::{Backend, StageCapabilities};
pub use dlr::{
    ClaimCreated, ClaimScope, Delivery, DeliveryContent, DeliveryFinish, DeliveryId, DeliveryResult, DlrCapabilities,
    DlrRetention, DlrState, DlrStats, DlrStore, DlrWrite, DlrWriteOutcome, ExpiryReport, Handoff, HandoffOutcome,
    IntermediateReceipt, PROGRESS_ACCEPTED, PROGRESS_BUFFERED, ProgressReport, ProviderReceipt, ReceiptMatch,
    ReceiptOutcome, ReceiptReservations, ReceiptTarget, ReplyPath, accepted_reports, buffered_report,
};
pub use envelope::{EnvelopeError, RecordKind};
pub use error::{BackendFailure, DlrError, FailureKind, PendingError, RoutedWorkError, RouterQueueError, StorageError};
pub use ids::{MessageId, ReadyCursor, ReadySeq, Timestamp, UnitId};
pub use inbound::{InboundGroup, InboundGroupKey, InboundMessage, InboundPart, RoutedInbound};
pub use pending::{
    AdmitOutcome, BlockingPendingWriter, Disposition, PendingCapabilities, PendingStats, PendingStore, ReadyUnit, Unit,
};
pub use record::{Address, Channel, GroupKey, PartInfo, PendingRecord};
pub use routed_work::{
    Branch, BranchDone, BranchFailure, BranchKind, BranchMove, BranchOutcome, RoutedUnit, RoutedWorkStats,
    RoutedWorkStore, RoutedWrite,
};
pub use router_queue::{RouterQueueStats, RouterQueueStore, RouterQueueWrite, StagedUnit};
