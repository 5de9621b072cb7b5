//! The storage engine under the file stages: the locked data directory, the redb store
//! files, and the journal that makes the stages' commits durable.
//!
//! | module | what it holds |
//! |---|---|
//! | [`dir`] | the data directory, its exclusive lock and its file names |
//! | [`manifest`] | `manifest.json`: the profile that last used the directory |
//! | [`db`] | one redb store file: opening, layout check, transactions, reopening after a failed disk, the hop off the async runtime |
//! | [`backend`] | redb's file backend with fault injection (`disk-full`, `disk-io-error`), fsync metrics |
//! | [`journal`] | the stages' journal (`journal.0`, `journal.1`): frames, group commit, segments, checkpoints, recovery scans |
//! | [`observe`] | the seam crash-image tests watch every write, sync, create and rename through |
//! | [`journaled`] | the background stages' engine: state in memory, changes journaled, the store file a checkpoint image |
//!
//! The stages (`pending`, `router_queue`, `routed_work`, `dlr`) sit beside this module
//! and own only their tables, records and frames.

pub(crate) mod backend;
pub(crate) mod db;
pub mod dir;
pub(crate) mod journal;
pub(crate) mod journaled;
pub mod manifest;
pub(crate) mod observe;
