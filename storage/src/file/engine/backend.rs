//! The redb storage backend of every file store: redb's own [`FileBackend`] plus fault
//! injection, so tests can prove that a full or failing disk fails closed.
//!
//! Faults come from the process-wide failpoints (`SENDIUM_FAILPOINT=disk-full=error@N`,
//! `disk-io-error=error@N`, used by the black-box tests) and, in unit tests, from a
//! per-store [`FaultSwitch`]. With no failpoint configured the check is one relaxed
//! atomic load per I/O call (plus the switch's), which is noise next to a `pwrite`.

use std::fmt;
use std::fs::File;
use std::io;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, DatabaseError, StorageBackend};

use super::observe::Watched;
use crate::failpoint;

/// In-process fault switches of one store file (unit tests turn them on and off; a
/// failpoint, once on, stays on like a full disk).
#[derive(Debug, Default)]
pub(crate) struct FaultSwitch {
    pub full: AtomicBool,
    pub io: AtomicBool,
    /// Only the journal's fdatasync fails (its write succeeds first).
    pub sync: AtomicBool,
}

/// [`FileBackend`] with fault injection.
pub(crate) struct FaultBackend {
    inner: FileBackend,
    faults: Arc<FaultSwitch>,
    /// The store file's name (`pending.redb`, ...), the label of its fsync timings.
    name: &'static str,
    /// Under a crash-image test: where its writes and syncs are reported.
    watched: Option<Watched>,
    /// Set when the handle must close without writing (see [`StoreFile`]'s close):
    /// every write and sync then fails, so redb's close cannot make the handle's
    /// non-durable commits durable, and the file stays as of its last durable commit for
    /// the next open to recover.
    ///
    /// [`StoreFile`]: super::db::StoreFile
    discard: Arc<AtomicBool>,
}

impl fmt::Debug for FaultBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultBackend").field("faults", &self.faults).finish()
    }
}

impl FaultBackend {
    pub(crate) fn new(
        file: File,
        name: &'static str,
        faults: Arc<FaultSwitch>,
        watched: Option<Watched>,
        discard: Arc<AtomicBool>,
    ) -> Result<Self, DatabaseError> {
        Ok(Self {
            inner: FileBackend::new(file)?,
            faults,
            name,
            watched,
            discard,
        })
    }

    fn check_discard(&self) -> io::Result<()> {
        if self.discard.load(Ordering::Acquire) {
            return Err(io::Error::other("the handle is closing without writing"));
        }
        Ok(())
    }
}

/// Before a write or an extension of a store file (redb's or the journal's):
/// ENOSPC when the disk is "full".
pub(crate) fn check_space(faults: &FaultSwitch) -> io::Result<()> {
    if failpoint::error("disk-full") || faults.full.load(Ordering::Relaxed) {
        return Err(io::Error::from(rustix::io::Errno::NOSPC));
    }
    check_io(faults)
}

/// Before any other I/O call: the injected generic I/O error.
pub(crate) fn check_io(faults: &FaultSwitch) -> io::Result<()> {
    if failpoint::error("disk-io-error") || faults.io.load(Ordering::Relaxed) {
        return Err(io::Error::other("injected I/O error (failpoint disk-io-error)"));
    }
    Ok(())
}

impl StorageBackend for FaultBackend {
    fn len(&self) -> Result<u64, io::Error> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        check_io(&self.faults)?;
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        self.check_discard()?;
        check_space(&self.faults)?;
        self.inner.set_len(len)?;
        if let Some(w) = &self.watched {
            w.set_len(len);
        }
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        self.check_discard()?;
        check_io(&self.faults)?;
        timed_sync(self.name, || self.inner.sync_data())?;
        if let Some(w) = &self.watched {
            w.synced();
        }
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        self.check_discard()?;
        check_space(&self.faults)?;
        self.inner.write(offset, data)?;
        if let Some(w) = &self.watched {
            w.wrote(offset, data);
        }
        Ok(())
    }

    fn close(&self) -> Result<(), io::Error> {
        self.inner.close()
    }

    // Locking is redb's own (it guards the file against a second opener); delegate all of it.
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

/// fdatasync calls made by every store file of the process (exported as
/// `sendium_storage_fsyncs_total`: fsyncs per acknowledged message is how group commit
/// is judged).
static FSYNCS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long each fdatasync of a store file took, by file name.
pub const FSYNC_SECONDS: &str = "sendium_storage_fsync_seconds";

/// Run one fdatasync (or fsync) of the store file `name`: counted, and its duration
/// recorded in [`FSYNC_SECONDS`]. A durable acknowledgement waits for one of these, so
/// this histogram is how an operator tells a slow disk from a slow gateway.
pub(crate) fn timed_sync(name: &'static str, sync: impl FnOnce() -> io::Result<()>) -> io::Result<()> {
    FSYNCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    let result = sync();
    metrics::histogram!(FSYNC_SECONDS, "file" => name).record(started.elapsed().as_secs_f64());
    result
}

/// fdatasync calls so far, all store files together.
pub fn fsyncs() -> u64 {
    FSYNCS.load(std::sync::atomic::Ordering::Relaxed)
}
