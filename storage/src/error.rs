//! Storage errors: one enum per stage, each converting into [`StorageError`].
//!
//! Every failure is *fail closed*: the caller refuses admission (or retries the stage
//! transition) and never acknowledges work that was not stored as promised. The
//! [`BackendFailure`] names where it happened (a file path or database) so an operator
//! can act on the log line.

use std::fmt;

/// What went wrong underneath a stage, independent of the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The store cannot be reached or written right now (I/O error, database down).
    Unavailable,
    /// The disk (or database volume) is full.
    Full,
    /// Stored data failed to decode or a structural check.
    Corrupt,
    /// A record was written by an incompatible (newer major) version.
    UnsupportedVersion,
    /// Another process holds the store.
    Locked,
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailureKind::Unavailable => "storage unavailable",
            FailureKind::Full => "storage full",
            FailureKind::Corrupt => "corrupt storage",
            FailureKind::UnsupportedVersion => "unsupported record version",
            FailureKind::Locked => "storage locked by another process",
        })
    }
}

/// A backend failure with its location (file path, table, database).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} in {location}: {detail}")]
pub struct BackendFailure {
    pub kind: FailureKind,
    pub location: String,
    pub detail: String,
}

impl BackendFailure {
    pub fn new(kind: FailureKind, location: impl Into<String>, detail: impl fmt::Display) -> Self {
        Self {
            kind,
            location: location.into(),
            detail: detail.to_string(),
        }
    }
}

/// Errors of the pending stage (admission, selection reads, source completion).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PendingError {
    #[error("pending stage: {0}")]
    Backend(#[from] BackendFailure),
}

/// Errors of the router-queue stage (select-and-stage, release).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouterQueueError {
    #[error("router-queue stage: {0}")]
    Backend(#[from] BackendFailure),
}

/// Errors of the routed-work stage (route records, branch completion).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoutedWorkError {
    #[error("routed-work stage: {0}")]
    Backend(#[from] BackendFailure),
}

/// Errors of the DLR store (correlation, receipts, downstream deliveries).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DlrError {
    #[error("dlr store: {0}")]
    Backend(#[from] BackendFailure),
}

/// Any storage error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Pending(#[from] PendingError),
    #[error(transparent)]
    RouterQueue(#[from] RouterQueueError),
    #[error(transparent)]
    RoutedWork(#[from] RoutedWorkError),
    #[error(transparent)]
    Dlr(#[from] DlrError),
    #[error("{0}")]
    Open(BackendFailure),
}

impl StorageError {
    /// The underlying backend failure, whatever the stage.
    pub fn failure(&self) -> &BackendFailure {
        match self {
            StorageError::Pending(PendingError::Backend(f))
            | StorageError::RouterQueue(RouterQueueError::Backend(f))
            | StorageError::RoutedWork(RoutedWorkError::Backend(f))
            | StorageError::Dlr(DlrError::Backend(f))
            | StorageError::Open(f) => f,
        }
    }
}
