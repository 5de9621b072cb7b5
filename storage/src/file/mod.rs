//! File backends on [redb]: one exclusively locked data directory ([`DataDir`]), one
//! redb file per stage.
//!
//! Each stage is a module here: `pending`, `router_queue`, `routed_work`, `dlr`, and
//! `records` (values the pending and router-queue stages store). What they stand on,
//! the data directory, the redb store files and the stages' journal, is the engine in
//! `engine/`.
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
//! Durability: pending `admit` and `complete`, router-queue `stage` and routed-work
//! `record` and `complete` are durable through the stages' journal before they return
//! (one frame per call, its `fdatasync` shared with every frame flushed with it, see
//! `engine/journal.rs`); `expire_groups` commits with `Durability::Immediate`.
//! Router-queue `release` and routed-work `remove` are journaled without waiting for the
//! sync: their loss in a crash is repaired by reconciliation (see those methods).
//! SIGKILL tests prove crash recovery; the fsync before every acknowledgement is what
//! carries the power-loss promise.

mod dlr;
mod engine;
mod pending;
pub(crate) mod records;
mod routed_work;
mod router_queue;

#[cfg(test)]
mod powerloss;
#[cfg(test)]
mod tests;

pub use dlr::FileDlrStore;
pub use engine::backend::{FSYNC_SECONDS, fsyncs};
pub use engine::db::FileOptions;
pub use engine::dir::DataDir;
pub use engine::manifest::Manifest;
/// The engine's public modules, reachable as `file::dir` and `file::manifest`.
pub use engine::{dir, manifest};
pub use pending::FilePendingStore;
pub use routed_work::FileRoutedWorkStore;
pub use router_queue::FileRouterQueueStore;
