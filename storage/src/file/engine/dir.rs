//! The data directory of the file backends and its exclusive lock.
//!
//! One directory (`[storage.file] dir`) holds every file-backed stage, each in its own
//! redb file so the three owners' write transactions and fsyncs do not queue behind one
//! writer lock, and the DLR store keeps its own namespace:
//!
//! ```text
//! <dir>/LOCK               exclusive lock, holder's pid
//! <dir>/manifest.json      which backend each stage used (see manifest.rs)
//! <dir>/journal.0          the stages' journal, two segments (see `engine::journal`)
//! <dir>/journal.1
//! <dir>/pending.redb       pending stage
//! <dir>/router-queue.redb  router-queue stage
//! <dir>/routed-work.redb   routed-work stage
//! <dir>/dlr.redb           DLR store
//! ```
//!
//! The lock is what makes "one process per spool" true: a second Sendium (or a second
//! [`DataDir`] in the same process) on the same directory fails with
//! [`FailureKind::Locked`] before it touches a store file. It is an advisory `flock`
//! held for the `DataDir`'s lifetime (every store keeps an `Arc` of it), released by the
//! kernel when the process dies, SIGKILL included, so no stale lock survives a crash.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use std::sync::Arc;

use super::journal::Journal;
use crate::error::{BackendFailure, FailureKind};

/// File names inside the data directory.
pub const LOCK_FILE: &str = "LOCK";
pub const PENDING_FILE: &str = "pending.redb";
/// The segments of the stages' journal (see `engine::journal`): acknowledged commits not
/// yet checkpointed into their stage's file.
pub const JOURNAL_FILES: [&str; 2] = ["journal.0", "journal.1"];
pub const ROUTER_QUEUE_FILE: &str = "router-queue.redb";
pub const ROUTED_WORK_FILE: &str = "routed-work.redb";
/// The file DLR store.
pub const DLR_FILE: &str = "dlr.redb";

/// How often, and how long apart, [`DataDir::open`] tries again when the lock's holder
/// is this very process. A handle this process has just closed can still hold the lock
/// for a moment: a child process being started (fork, then exec) holds copies of every
/// descriptor until its exec closes them. Sendium itself starts no child processes, so
/// this is for processes that do, such as the test suite's (its SIGKILL tests spawn
/// children while other tests close and reopen directories). A directory this process
/// really holds open is refused after these tries.
const SELF_HELD_RETRIES: u32 = 50;
const SELF_HELD_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// The pid the lock file names (its holder, while it is locked).
fn holder_pid(lock: &mut File) -> Option<u32> {
    let mut holder = String::new();
    lock.seek(SeekFrom::Start(0)).ok()?;
    lock.read_to_string(&mut holder).ok()?;
    holder.trim().parse().ok()
}

/// An opened, exclusively locked data directory.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    /// Holding the open file holds the lock.
    _lock: File,
    /// The stages' journal, opened by the first file stage that needs it.
    journal: parking_lot::Mutex<Option<Arc<Journal>>>,
}

impl DataDir {
    /// Create the directory if needed and lock it. Fails with [`FailureKind::Locked`]
    /// when another process (or, after about a second of retries, another `DataDir` of
    /// this process: see [`SELF_HELD_RETRIES`]) holds it.
    pub fn open(path: impl AsRef<Path>) -> Result<DataDir, BackendFailure> {
        let path = path.as_ref().to_path_buf();
        let loc = path.display().to_string();
        create_durably(&path)?;
        let lock_path = path.join(LOCK_FILE);
        let lock_loc = lock_path.display().to_string();
        // No truncate: the file may hold the current holder's pid.
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(|e| io_failure(&lock_loc, "cannot open the lock file", &e))?;
        let mut attempts = 0;
        let locked = loop {
            match lock.try_lock() {
                Err(TryLockError::WouldBlock)
                    if attempts < SELF_HELD_RETRIES && holder_pid(&mut lock) == Some(std::process::id()) =>
                {
                    attempts += 1;
                    std::thread::sleep(SELF_HELD_WAIT);
                }
                other => break other,
            }
        };
        match locked {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let who = match holder_pid(&mut lock) {
                    Some(pid) if pid == std::process::id() => format!(" (pid {pid}: this process)"),
                    Some(pid) => format!(" (pid {pid})"),
                    None => String::new(),
                };
                return Err(BackendFailure::new(
                    FailureKind::Locked,
                    loc.clone(),
                    format!("data directory {loc} is locked by another Sendium process{who}"),
                ));
            }
            Err(TryLockError::Error(e)) => return Err(io_failure(&lock_loc, "cannot lock the data directory", &e)),
        }
        let pid = std::process::id();
        lock.set_len(0)
            .and_then(|()| lock.seek(SeekFrom::Start(0)))
            .and_then(|_| lock.write_all(format!("{pid}\n").as_bytes()))
            .map_err(|e| io_failure(&lock_loc, "cannot write the lock holder's pid", &e))?;
        Ok(DataDir {
            path,
            _lock: lock,
            journal: parking_lot::Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pending_path(&self) -> PathBuf {
        self.path.join(PENDING_FILE)
    }

    pub fn journal_paths(&self) -> [PathBuf; 2] {
        JOURNAL_FILES.map(|name| self.path.join(name))
    }

    /// The journal every file stage of this directory writes (opened on first use).
    /// Blocking.
    pub(crate) fn journal(&self) -> Result<Arc<Journal>, BackendFailure> {
        let mut slot = self.journal.lock();
        if let Some(j) = slot.as_ref() {
            return Ok(j.clone());
        }
        let j = Journal::open(self)?;
        *slot = Some(j.clone());
        Ok(j)
    }

    /// Every file stage of the profile is open: journal frames of stages that were not
    /// opened (the running profile keeps them in memory) stop holding up its segments.
    pub fn file_stages_opened(&self) {
        if let Some(j) = self.journal.lock().as_ref() {
            j.forget_unopened();
        }
    }

    pub fn router_queue_path(&self) -> PathBuf {
        self.path.join(ROUTER_QUEUE_FILE)
    }

    pub fn routed_work_path(&self) -> PathBuf {
        self.path.join(ROUTED_WORK_FILE)
    }

    pub fn dlr_path(&self) -> PathBuf {
        self.path.join(DLR_FILE)
    }

    /// fsync the directory itself, so a file created or renamed in it survives a crash.
    pub(crate) fn sync(&self) -> Result<(), BackendFailure> {
        let loc = self.path.display().to_string();
        File::open(&self.path)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_failure(&loc, "cannot fsync the data directory", &e))?;
        if let Some(w) = super::observe::watcher(&self.path) {
            w.event(super::observe::DiskEvent::DirSynced);
        }
        Ok(())
    }
}

/// Create `path` and the directories above it that are missing, and fsync the
/// directory holding each one created: without that, a power cut soon after the first
/// start can take the new data directory — and every acknowledged message in it — away.
fn create_durably(path: &Path) -> Result<(), BackendFailure> {
    let loc = path.display().to_string();
    let missing: Vec<&Path> = path
        .ancestors()
        .take_while(|p| !p.as_os_str().is_empty() && !p.exists())
        .collect();
    fs::create_dir_all(path).map_err(|e| io_failure(&loc, "cannot create the data directory", &e))?;
    if missing.is_empty() {
        return Ok(());
    }
    let watcher = super::observe::watcher(path);
    if let Some(w) = &watcher {
        w.event(super::observe::DiskEvent::DirCreated);
    }
    for created in missing {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent).and_then(|d| d.sync_all()).map_err(|e| {
            io_failure(
                &parent.display().to_string(),
                "cannot fsync the directory holding the data directory",
                &e,
            )
        })?;
    }
    if let Some(w) = &watcher {
        w.event(super::observe::DiskEvent::ParentSynced);
    }
    Ok(())
}

/// An I/O error as a located failure: ENOSPC is [`FailureKind::Full`], the rest
/// [`FailureKind::Unavailable`].
pub(crate) fn io_failure(location: &str, what: &str, e: &std::io::Error) -> BackendFailure {
    let kind = if is_full(e) {
        FailureKind::Full
    } else {
        FailureKind::Unavailable
    };
    BackendFailure::new(kind, location, format!("{what}: {e}"))
}

pub(crate) fn is_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull || e.kind() == std::io::ErrorKind::QuotaExceeded
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_open_of_a_locked_directory_fails_with_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spool");
        let first = DataDir::open(&dir).unwrap();
        assert!(dir.is_dir(), "created");
        let err = DataDir::open(&dir).unwrap_err();
        assert_eq!(err.kind, FailureKind::Locked);
        let msg = err.to_string();
        assert!(msg.contains("is locked by another Sendium process"), "{msg}");
        assert!(msg.contains(&format!("pid {}", std::process::id())), "{msg}");
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        let pid = fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string(), "holder's pid kept intact");
        drop(first);
        let again = DataDir::open(&dir).unwrap();
        assert_eq!(again.path(), dir.as_path());
        assert_eq!(again.pending_path(), dir.join("pending.redb"));
    }

    #[test]
    fn a_directory_this_process_releases_moments_later_opens() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spool");
        let held = DataDir::open(&dir).unwrap();
        // As a child process between fork and exec would: hold the lock a little longer.
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(100));
            drop(held);
        });
        let again = DataDir::open(&dir).unwrap();
        release.join().unwrap();
        assert_eq!(again.path(), dir.as_path());
    }

    #[test]
    fn an_unusable_path_is_an_error_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain-file");
        fs::write(&file, b"x").unwrap();
        let err = DataDir::open(file.join("sub")).unwrap_err();
        assert_eq!(err.kind, FailureKind::Unavailable);
        assert!(err.location.contains("plain-file"), "{err}");
    }
}
