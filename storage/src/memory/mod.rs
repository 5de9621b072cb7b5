//! Memory backends: explicitly non-durable. They live as long as the process (the
//! supervisor owns them), so an actor restart rebuilds its projection from them, while a
//! process restart starts empty — exactly what the memory profile documents.

mod dlr;
mod pending;
pub(crate) mod routed_work;
pub(crate) mod router_queue;

pub use dlr::MemoryDlrStore;
pub use pending::{MemoryPendingStore, PendingLimits};
pub use routed_work::MemoryRoutedWorkStore;
pub use router_queue::MemoryRouterQueueStore;
