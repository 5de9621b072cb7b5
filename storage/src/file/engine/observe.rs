//! The seam through which crash-image tests watch what the file stages do to the disk.
//!
//! Every change the file stages and the file DLR store make in a data directory is
//! reported here: the journal segments' writes and syncs, each store file's (through
//! [`FaultBackend`](super::backend::FaultBackend)), the manifest's write, sync and
//! rename, file creations and the directory's own fsync. A test watches a directory
//! with a [`Watcher`] that keeps what was written and what each sync made durable, and
//! rebuilds from that what a machine that lost power at any sync would find on its disk
//! (see `file::powerloss`).
//!
//! In production no directory is watched: a file looks its watcher up once when it is
//! opened, and each hook is then a check of an `Option` that is `None`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

/// One change to a watched data directory, reported after it succeeded.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum DiskEvent<'a> {
    /// A file was opened with `O_CREAT` (and `O_TRUNC` when `truncated`).
    Created {
        file: &'a str,
        truncated: bool,
    },
    Wrote {
        file: &'a str,
        at: u64,
        data: &'a [u8],
    },
    SetLen {
        file: &'a str,
        len: u64,
    },
    /// `fdatasync` or `fsync` of the file returned.
    Synced {
        file: &'a str,
    },
    Renamed {
        from: &'a str,
        to: &'a str,
    },
    /// `fsync` of the directory returned: its entries (creations, renames) are durable.
    DirSynced,
    /// The data directory itself was created (it did not exist).
    DirCreated,
    /// `fsync` of the directory that holds the data directory returned: a data
    /// directory just created is durable.
    ParentSynced,
}

/// What a test registers for a directory.
pub(crate) trait Watcher: Send + Sync {
    fn event(&self, event: DiskEvent<'_>);
}

type Registry = Vec<(PathBuf, Arc<dyn Watcher>)>;

static WATCHED: RwLock<Registry> = RwLock::new(Vec::new());

/// Watch `dir` until the guard is dropped.
#[cfg(test)]
pub(crate) fn watch(dir: &Path, watcher: Arc<dyn Watcher>) -> WatchGuard {
    WATCHED.write().push((dir.to_path_buf(), watcher));
    WatchGuard(dir.to_path_buf())
}

#[cfg(test)]
pub(crate) struct WatchGuard(PathBuf);

#[cfg(test)]
impl Drop for WatchGuard {
    fn drop(&mut self) {
        WATCHED.write().retain(|(d, _)| d != &self.0);
    }
}

/// The watcher of `dir`, if a test watches it.
pub(crate) fn watcher(dir: &Path) -> Option<Arc<dyn Watcher>> {
    let registry = WATCHED.read();
    if registry.is_empty() {
        return None;
    }
    registry.iter().find(|(d, _)| d == dir).map(|(_, w)| w.clone())
}

/// One file of a watched directory.
#[derive(Clone)]
pub(crate) struct Watched {
    watcher: Arc<dyn Watcher>,
    file: Arc<str>,
}

impl Watched {
    /// The file `name` of `dir`, if `dir` is watched.
    pub(crate) fn file(dir: &Path, name: &str) -> Option<Watched> {
        watcher(dir).map(|watcher| Watched {
            watcher,
            file: Arc::from(name),
        })
    }

    pub(crate) fn created(&self, truncated: bool) {
        self.watcher.event(DiskEvent::Created {
            file: &self.file,
            truncated,
        });
    }

    pub(crate) fn wrote(&self, at: u64, data: &[u8]) {
        self.watcher.event(DiskEvent::Wrote {
            file: &self.file,
            at,
            data,
        });
    }

    pub(crate) fn set_len(&self, len: u64) {
        self.watcher.event(DiskEvent::SetLen { file: &self.file, len });
    }

    pub(crate) fn synced(&self) {
        self.watcher.event(DiskEvent::Synced { file: &self.file });
    }
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watched").field("file", &self.file).finish()
    }
}
