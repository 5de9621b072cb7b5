//! File backends on [redb]: one exclusively locked data directory ([`DataDir`]), one
//! redb file per stage.
//!
//! Opening, per stage configured as `file` (the others are not opened):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use sendium_storage::file::{DataDir, FilePendingStore, FileRouterQueueStore, FileRoutedWorkStore};
//! # use sendium_storage::memory::PendingLimits;
//! # fn main() -> Result<(), sendium_storage::BackendFailure> {
//! let dir = Arc::new(DataDir::open("/var/lib/sendium")?); // Locked if another process has it
//! let previous = dir.manifest()?;                          // the profile that last used it
//! let pending = FilePendingStore::open(&dir, PendingLimits::default())?;
//! let router_queue = FileRouterQueueStore::open(&dir)?;
//! let routed_work = FileRoutedWorkStore::open(&dir)?;
//! # Ok(()) }
//! ```
//!
//! Durability: pending `admit` and `complete` are durable through the pending journal
//! (one frame and one `fdatasync` per call, see `journal.rs`); `expire_groups`,
//! router-queue `stage`, routed-work `record` and `complete` commit with
//! `Durability::Immediate` (one `fdatasync` per call, never per record). Router-queue
//! `release` and routed-work `remove` commit with `Durability::None`: their loss in a
//! crash is repaired by reconciliation (see those methods). SIGKILL tests prove crash
//! recovery; the fsync on every durable commit is what carries the power-loss promise.

pub(crate) mod backend;
pub(crate) mod db;
pub mod dir;
mod dlr;
mod journal;
pub mod manifest;
mod pending;
pub(crate) mod records;
mod routed_work;
mod router_queue;

#[cfg(test)]
mod tests;

pub use backend::{FSYNC_SECONDS, fsyncs};
pub use db::FileOptions;
pub use dir::DataDir;
pub use dlr::FileDlrStore;
pub use manifest::Manifest;
pub use pending::FilePendingStore;
pub use routed_work::FileRoutedWorkStore;
pub use router_queue::FileRouterQueueStore;
