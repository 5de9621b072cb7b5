//! Opening the selected backend of each stage.
//!
//! Only what the configuration selected is opened, and only combinations that profile
//! validation accepted reach this point; a backend that cannot be opened stops startup
//! with an error that names it.

use std::sync::Arc;

use sendium_profiles::{Config, DlrBackend, StageBackend};
use sendium_storage::memory::{
    MemoryDlrStore, MemoryPendingStore, MemoryRoutedWorkStore, MemoryRouterQueueStore, PendingLimits,
};
use sendium_storage::{DlrRetention, DlrStore, PendingStore, RoutedWorkStore, RouterQueueStore};

/// The four stages' stores. They outlive every actor: the supervisor hands the same
/// store to each incarnation of its owner.
#[derive(Clone)]
pub struct Stores {
    pub pending: Arc<dyn PendingStore>,
    pub router_queue: Arc<dyn RouterQueueStore>,
    pub routed_work: Arc<dyn RoutedWorkStore>,
    /// `None` when DLR handling is disabled.
    pub dlr: Option<Arc<dyn DlrStore>>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{key} = \"{backend}\" is not available in this build")]
    NotAvailable { key: &'static str, backend: &'static str },
}

fn unavailable(key: &'static str, b: StageBackend) -> OpenError {
    OpenError::NotAvailable {
        key,
        backend: b.as_str(),
    }
}

impl Stores {
    pub fn open(cfg: &Config) -> Result<Stores, OpenError> {
        let limits = PendingLimits {
            max_records: u64::try_from(cfg.sms.pending.max_messages).unwrap_or(u64::MAX),
            idempotency_retention: cfg
                .http
                .as_ref()
                .map(|h| h.idempotency_retention)
                .unwrap_or(PendingLimits::default().idempotency_retention),
        };
        let pending: Arc<dyn PendingStore> = match cfg.sms.pending.backend {
            StageBackend::Memory => Arc::new(MemoryPendingStore::new(limits)),
            b => return Err(unavailable("sms.pending.backend", b)),
        };
        let router_queue: Arc<dyn RouterQueueStore> = match cfg.sms.router_queue.backend {
            StageBackend::Memory => Arc::new(MemoryRouterQueueStore::new()),
            b => return Err(unavailable("sms.router-queue.backend", b)),
        };
        let routed_work: Arc<dyn RoutedWorkStore> = match cfg.sms.routed_work.backend {
            StageBackend::Memory => Arc::new(MemoryRoutedWorkStore::new()),
            b => return Err(unavailable("sms.routed-work.backend", b)),
        };
        let retention = DlrRetention {
            retention: cfg.dlr.retention,
            orphan_retention: cfg.dlr.orphan_retention,
        };
        let dlr: Option<Arc<dyn DlrStore>> = match cfg.dlr.backend {
            DlrBackend::Memory => Some(Arc::new(MemoryDlrStore::new(
                u64::try_from(cfg.dlr.capacity).unwrap_or(u64::MAX),
                retention,
            ))),
            DlrBackend::Disabled => None,
            b => {
                return Err(OpenError::NotAvailable {
                    key: "dlr.backend",
                    backend: b.as_str(),
                });
            }
        };
        Ok(Stores {
            pending,
            router_queue,
            routed_work,
            dlr,
        })
    }
}
