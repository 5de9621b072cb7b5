//! One redb file of a file-backed stage: opening, error mapping, transactions, recovery
//! from a failed disk, and the hop off the async runtime.
//!
//! # Why `spawn_blocking`
//!
//! redb is blocking and a durable commit waits for an `fdatasync` (0.1–1 ms here, far
//! more on a busy disk). Every store call therefore runs in
//! [`tokio::task::spawn_blocking`], never on a tokio worker thread. Not
//! `block_in_place`: it panics on a current-thread runtime (which `#[tokio::test]` and
//! small tools use) and still stalls every other task queued on that worker until the
//! fsync returns. The price of `spawn_blocking` is one thread hand-off per call, which
//! is why the stage contracts take batches. The one exception is the pending writer's
//! commit (`BlockingPendingWriter`): the Ingress calls it on a thread of its
//! own, where blocking is the point.
//!
//! A caller that stops waiting (its future dropped) does not cancel the blocking call:
//! an admission may then be stored without being acknowledged, which at-least-once
//! processing already allows (the client retries; an idempotency key deduplicates).
//!
//! # Failed I/O
//!
//! After a write or fsync error redb latches the file: every later operation answers
//! `PreviousIo` until the database is closed. The store remembers what the failure was
//! (a full disk stays [`FailureKind::Full`]), and the next call closes and reopens the
//! file, which recovers it to its last durable commit (fast: every commit records the
//! allocator state, see quick-repair below). While the disk stays full the reopen or the
//! next commit fails again, so admission keeps failing closed; once space is freed the
//! store works again without a process restart.
//!
//! # Quick repair
//!
//! Write transactions set `set_quick_repair(options.quick_repair)` (on for pending and
//! the DLR store): a durable commit saves redb's allocator state and uses two-phase
//! commit, so reopening after SIGKILL does not walk the whole file to rebuild it. A
//! restart with a million-message backlog is then ready in milliseconds, not in the
//! minutes a full repair of a multi-GiB file takes.

use std::fs::OpenOptions;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};
use redb::{
    Builder, Database, Durability, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use super::backend::{FaultBackend, FaultSwitch};
use super::dir::{DataDir, is_full};
use super::observe::Watched;
use crate::envelope::EnvelopeError;
use crate::error::{BackendFailure, FailureKind};

/// Tuning of one store file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOptions {
    /// redb's page cache, in bytes. Bounded on purpose: the backlog lives on disk, and
    /// the cache must not turn a million pending messages into resident memory (the
    /// gateway stays under 256 MiB RSS with such a backlog). Pages not cached are read
    /// with `pread` and sit in the OS page cache, which is not the process's RSS.
    pub cache_size: usize,
    /// Verify every page checksum and rebuild the allocator when opening (redb's
    /// `check_integrity`). It reads the whole file, so it is off by default; an operator
    /// who suspects the file was damaged outside Sendium turns it on. A file that fails
    /// the check does not open.
    pub verify_on_open: bool,
    /// redb quick-repair: every commit saves the allocator state and commits in two
    /// phases (two fdatasyncs), so reopening after a crash is instant however large the
    /// file. Worth it for the pending stage, whose backlog can be millions of records;
    /// router-queue and routed-work hold only in-flight work (bounded by
    /// `max-in-flight`), so their full repair after a crash is fast, and their
    /// checkpoints (their only durable commits: everything else is journaled) stay at
    /// one fdatasync each.
    pub quick_repair: bool,
}

impl FileOptions {
    /// 32 MiB of cache: the pending stage is read by selection and completion (64 MiB
    /// puts a 1,000,000-message backlog at the 256 MiB RSS limit, with router-queue and
    /// routed-work keeping non-durable pages too).
    pub const PENDING_CACHE: usize = 32 << 20;
    /// 2 MiB of cache for router-queue and routed-work: their state lives in memory, and
    /// their files are only written by checkpoints and read when opened.
    pub const STAGE_CACHE: usize = 2 << 20;

    pub fn pending() -> Self {
        Self {
            cache_size: Self::PENDING_CACHE,
            verify_on_open: false,
            quick_repair: true,
        }
    }

    pub fn stage() -> Self {
        Self {
            cache_size: Self::STAGE_CACHE,
            verify_on_open: false,
            quick_repair: false,
        }
    }
}

/// The shared key-value table of every file: layout version and counters.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// Meta key of the file's table layout version (index tables hold raw, fixed-layout
/// values; records hold envelopes with their own versions).
pub(crate) const LAYOUT_KEY: &str = "layout";

/// An error inside a store transaction, mapped to a [`BackendFailure`] with the file's
/// location by [`StoreFile`].
#[derive(Debug)]
pub(crate) enum Fail {
    Db(redb::Error),
    /// A stored value that does not decode: names the table, and the key when it does
    /// not identify a message (see [`Fail::message_record`]).
    Record {
        table: &'static str,
        key: Option<String>,
        err: EnvelopeError,
    },
    /// A structural check failed.
    Invalid {
        table: &'static str,
        detail: String,
    },
    /// The file was written by a newer, incompatible Sendium.
    Newer {
        table: &'static str,
        detail: String,
    },
    /// A failure already located elsewhere (the journal's files).
    Located(BackendFailure),
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Fail {
            fn from(e: $t) -> Self {
                Fail::Db(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::StorageError,
    redb::TableError,
    redb::TransactionError,
    redb::CommitError,
    redb::DatabaseError,
    redb::SetDurabilityError
);

impl Fail {
    /// A record whose key names no message (a journal frame, an account), named in the error.
    pub(crate) fn record(table: &'static str, key: impl std::fmt::Display, err: EnvelopeError) -> Self {
        Fail::Record {
            table,
            key: Some(key.to_string()),
            err,
        }
    }

    /// A record of one message (its unit, branch, delivery, sequence number or multipart
    /// reference): the error names only the table. Store errors are logged and shown on
    /// `/readyz`, and per-message identifiers stay out of logs.
    pub(crate) fn message_record(table: &'static str, err: EnvelopeError) -> Self {
        Fail::Record { table, key: None, err }
    }
}

/// Encode one message's record of `table` as an envelope of `kind` (an error names the
/// table only, see [`Fail::message_record`]).
pub(crate) fn encode<T: serde::Serialize>(
    kind: crate::envelope::RecordKind,
    table: &'static str,
    v: &T,
) -> Result<Vec<u8>, Fail> {
    crate::envelope::encode(kind, v).map_err(|e| Fail::message_record(table, e))
}

/// What kind of failure a redb error is.
fn classify(err: &redb::Error) -> FailureKind {
    use redb::Error as E;
    match err {
        E::Io(e) if is_full(e) => FailureKind::Full,
        // redb reports a file that is not a redb database this way, and a read past
        // the end of a truncated one this way.
        E::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            FailureKind::Corrupt
        }
        E::Backend(b) => match b.downcast_ref::<std::io::Error>() {
            Some(e) if is_full(e) => FailureKind::Full,
            _ => FailureKind::Unavailable,
        },
        E::Corrupted(_)
        | E::RepairAborted
        | E::TableTypeMismatch { .. }
        | E::TableIsMultimap(_)
        | E::TableIsNotMultimap(_)
        | E::TypeDefinitionChanged { .. } => FailureKind::Corrupt,
        E::UpgradeRequired(_) => FailureKind::UnsupportedVersion,
        E::DatabaseAlreadyOpen | E::LockProtocolMismatch => FailureKind::Locked,
        _ => FailureKind::Unavailable,
    }
}

/// Errors after which redb's handle is unusable until reopened.
fn latches(err: &redb::Error) -> bool {
    matches!(
        err,
        redb::Error::Io(_) | redb::Error::Backend(_) | redb::Error::PreviousIo | redb::Error::LockPoisoned(_)
    )
}

/// Creates the file's tables, checks its layout, spot-checks its records.
pub(crate) type InitFn = fn(&WriteTransaction) -> Result<(), Fail>;

/// How long a reopen waits for calls still using the failed handle.
const REOPEN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs after `init` on every (re)open, before the database is handed to any caller:
/// the journaled stages apply their journal frames here.
pub(crate) type RecoverFn = Box<dyn Fn(&Database) -> Result<(), Fail> + Send + Sync>;

/// Runs before a handle is closed (when the store is dropped, or reopened after a
/// failure): redb makes the handle's non-durable commits durable when it closes, so a
/// store that keeps part of its committed state in memory writes it here first.
pub(crate) type CloseFn = Box<dyn Fn(&Database) -> Result<(), Fail> + Send + Sync>;

/// One open redb file.
pub(crate) struct StoreFile {
    dir: Arc<DataDir>,
    /// The file's name in the directory (`pending.redb`, ...): its fsync metrics label.
    name: &'static str,
    path: PathBuf,
    location: String,
    options: FileOptions,
    init: InitFn,
    recover: Option<RecoverFn>,
    before_close: Option<CloseFn>,
    pub(crate) faults: Arc<FaultSwitch>,
    /// `None` only between closing a failed handle and reopening it.
    db: RwLock<Option<Arc<Database>>>,
    /// Set after an error that latched redb's handle: the kind to report until a reopen
    /// succeeds (a full disk stays "full", not a generic `PreviousIo`).
    broken: Mutex<Option<FailureKind>>,
    /// The open handle's backend refuses every write while this is set (see
    /// [`StoreFile::close`]); each open gets a new one.
    discard: Mutex<Arc<AtomicBool>>,
}

impl StoreFile {
    /// Open (creating if needed) `<dir>/<name>` with the fault switches to use, run `init`
    /// in a durable transaction, then `recover`; `before_close` runs before each close.
    pub(crate) fn open_with(
        dir: &Arc<DataDir>,
        name: &'static str,
        options: FileOptions,
        init: InitFn,
        faults: Arc<FaultSwitch>,
        recover: Option<RecoverFn>,
        before_close: Option<CloseFn>,
    ) -> Result<StoreFile, BackendFailure> {
        let path = dir.path().join(name);
        let file = StoreFile {
            dir: dir.clone(),
            name,
            location: path.display().to_string(),
            path,
            options,
            init,
            recover,
            before_close,
            faults,
            db: RwLock::new(None),
            broken: Mutex::new(None),
            discard: Mutex::new(Arc::new(AtomicBool::new(false))),
        };
        let db = file.open_database()?;
        *file.db.write() = Some(Arc::new(db));
        Ok(file)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    fn open_database(&self) -> Result<Database, BackendFailure> {
        let existed = self.path.exists();
        let loc = self.location.clone();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&self.path)
            .map_err(|e| super::dir::io_failure(&loc, "cannot open", &e))?;
        let watched = Watched::file(self.dir.path(), self.name);
        if let Some(w) = watched.as_ref().filter(|_| !existed) {
            w.created(false);
        }
        let discard = Arc::new(AtomicBool::new(false));
        *self.discard.lock() = discard.clone();
        let backend = FaultBackend::new(file, self.name, self.faults.clone(), watched, discard)
            .map_err(|e| self.failure(Fail::from(e)))?;
        let mut builder = Builder::new();
        builder.set_cache_size(self.options.cache_size);
        let logged = AtomicBool::new(false);
        let repair_loc = loc.clone();
        builder.set_repair_callback(move |session| {
            if !logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(file = %repair_loc, progress = session.progress(), "repairing store file after an unclean shutdown");
            }
        });
        // redb documents that opening a file altered behind its back may panic instead of
        // failing; a panic here means the file cannot be trusted.
        let opened = catch_unwind(AssertUnwindSafe(|| -> Result<Database, Fail> {
            let mut db = builder.create_with_backend(backend)?;
            if self.options.verify_on_open && !db.check_integrity()? {
                tracing::warn!(file = %loc, "integrity check repaired the store file");
            }
            let mut txn = db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.set_quick_repair(self.options.quick_repair);
            (self.init)(&txn)?;
            txn.commit()?;
            if let Some(recover) = &self.recover {
                recover(&db)?;
            }
            Ok(db)
        }));
        let db = match opened {
            Ok(r) => r.map_err(|e| self.failure(e))?,
            Err(_) => {
                return Err(BackendFailure::new(
                    FailureKind::Corrupt,
                    loc,
                    "the storage engine panicked while opening the file: its contents cannot be trusted",
                ));
            }
        };
        if !existed {
            // The new file's directory entry must survive a crash too.
            self.dir.sync()?;
        }
        Ok(db)
    }

    /// Map a transaction error to a located failure; remember errors that latch redb.
    pub(crate) fn failure(&self, fail: Fail) -> BackendFailure {
        match fail {
            Fail::Db(err) => {
                let mut kind = classify(&err);
                if latches(&err) {
                    let mut broken = self.broken.lock();
                    match *broken {
                        // PreviousIo repeats the original failure.
                        Some(first) if matches!(err, redb::Error::PreviousIo) => kind = first,
                        Some(_) => {}
                        None => *broken = Some(kind),
                    }
                }
                BackendFailure::new(kind, self.location.clone(), err)
            }
            Fail::Record {
                table,
                key: Some(key),
                err,
            } => err.at(format!("{} table {table} key {key}", self.location)),
            Fail::Record { table, key: None, err } => err.at(format!("{} table {table}", self.location)),
            Fail::Invalid { table, detail } => {
                BackendFailure::new(FailureKind::Corrupt, format!("{} table {table}", self.location), detail)
            }
            Fail::Newer { table, detail } => BackendFailure::new(
                FailureKind::UnsupportedVersion,
                format!("{} table {table}", self.location),
                detail,
            ),
            Fail::Located(failure) => failure,
        }
    }

    /// The open database, reopening it first if an earlier error latched it.
    fn database(&self) -> Result<Arc<Database>, BackendFailure> {
        let broken = *self.broken.lock();
        if let Some(kind) = broken {
            self.reopen(kind)?;
        }
        match self.db.read().as_ref() {
            Some(db) => Ok(db.clone()),
            None => Err(BackendFailure::new(
                broken.unwrap_or(FailureKind::Unavailable),
                self.location.clone(),
                "the store file is closed after an I/O failure and could not be reopened yet",
            )),
        }
    }

    fn reopen(&self, kind: FailureKind) -> Result<(), BackendFailure> {
        // Calls still using the failed handle (a read, the other writer) end within
        // milliseconds: wait for them rather than fail this caller.
        let deadline = std::time::Instant::now() + REOPEN_WAIT;
        let mut slot = loop {
            let mut slot = self.db.write();
            if self.broken.lock().is_none() && slot.is_some() {
                // Another call reopened it while this one waited for the lock.
                return Ok(());
            }
            let Some(db) = slot.take() else { break slot };
            match Arc::try_unwrap(db) {
                // Closing a latched handle writes nothing; the reopen recovers the file.
                Ok(db) => {
                    self.close(db);
                    break slot;
                }
                Err(db) => {
                    *slot = Some(db);
                    if std::time::Instant::now() >= deadline {
                        return Err(BackendFailure::new(
                            kind,
                            self.location.clone(),
                            "the store failed an I/O operation and is waiting for in-flight calls to end before reopening",
                        ));
                    }
                }
            }
            drop(slot);
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        match self.open_database() {
            Ok(db) => {
                *slot = Some(Arc::new(db));
                *self.broken.lock() = None;
                tracing::info!(file = %self.location, "store file reopened after an I/O failure");
                Ok(())
            }
            Err(mut e) => {
                if e.kind == FailureKind::Unavailable {
                    e.kind = kind;
                }
                Err(e)
            }
        }
    }

    /// Run `f` in one write transaction and commit it with `durability`. `f` returns
    /// `(result, changed)`: a transaction that changed nothing is aborted instead of
    /// committed, which spares an fsync.
    pub(crate) fn write<R>(
        &self,
        durability: Durability,
        f: impl FnOnce(&WriteTransaction) -> Result<(R, bool), Fail>,
    ) -> Result<R, BackendFailure> {
        self.write_txn(|txn| {
            txn.set_durability(durability)?;
            f(txn)
        })
    }

    /// [`write`](Self::write) where `f` sets the durability itself (before opening any
    /// table), for a store that decides it per transaction.
    pub(crate) fn write_txn<R>(
        &self,
        f: impl FnOnce(&mut WriteTransaction) -> Result<(R, bool), Fail>,
    ) -> Result<R, BackendFailure> {
        let db = self.database()?;
        let quick_repair = self.options.quick_repair;
        let run = || -> Result<R, Fail> {
            let mut txn = db.begin_write()?;
            txn.set_quick_repair(quick_repair);
            let (out, changed) = f(&mut txn)?;
            if changed {
                txn.commit()?;
            } else {
                txn.abort()?;
            }
            Ok(out)
        };
        run().map_err(|e| self.failure(e))
    }

    /// Run `f` in one read transaction (a consistent snapshot; never blocks a writer).
    pub(crate) fn read<R>(&self, f: impl FnOnce(&ReadTransaction) -> Result<R, Fail>) -> Result<R, BackendFailure> {
        let db = self.database()?;
        let run = || -> Result<R, Fail> {
            let txn = db.begin_read()?;
            f(&txn)
        };
        run().map_err(|e| self.failure(e))
    }

    /// [`read`](Self::read), with the snapshot begun while the guard `lock` returns is
    /// held; `f` gets the guard. For a store that keeps part of its state in memory under
    /// that lock: `f` sees both at one point in time. The handle is taken (and reopened if
    /// need be) before `lock` is called, so a reopen's steps never wait for that lock.
    pub(crate) fn read_locked<G, R>(
        &self,
        lock: impl FnOnce() -> G,
        f: impl FnOnce(&ReadTransaction, G) -> Result<R, Fail>,
    ) -> Result<R, BackendFailure> {
        let db = self.database()?;
        let guard = lock();
        let run = || -> Result<R, Fail> {
            let txn = db.begin_read()?;
            f(&txn, guard)
        };
        run().map_err(|e| self.failure(e))
    }

    /// Have the next call close and reopen the file (and so run its recovery step):
    /// what redb holds in memory is no longer what the store promised.
    pub(crate) fn invalidate(&self, kind: FailureKind) {
        self.broken.lock().get_or_insert(kind);
    }

    /// A panic inside the storage engine: redb may panic on data altered behind its
    /// back, so the file is treated as untrusted and the handle reopened on next use.
    pub(crate) fn panicked(&self) -> BackendFailure {
        *self.broken.lock() = Some(FailureKind::Corrupt);
        BackendFailure::new(
            FailureKind::Corrupt,
            self.location.clone(),
            "the storage engine panicked (a damaged file or a bug): failing closed",
        )
    }
}

impl StoreFile {
    /// Close a handle, after the store's step before closing.
    ///
    /// redb's close makes the handle's non-durable commits durable. When the step before
    /// it failed, those commits may claim more than the file holds (a journal LSN whose
    /// held units were not written), so the handle closes without writing anything: its
    /// backend refuses every write, redb leaves the file as of its last durable commit,
    /// and the next open recovers it and replays the journal from there.
    fn close<D: std::borrow::Borrow<Database>>(&self, db: D) {
        if let Some(before_close) = &self.before_close {
            let failed = match catch_unwind(AssertUnwindSafe(|| before_close(db.borrow()))) {
                Ok(Ok(())) => false,
                Ok(Err(e)) => {
                    tracing::warn!(file = %self.location, error = %self.failure(e), "store file not brought up to date before closing; closing it without writing, its next open replays the journal");
                    true
                }
                Err(_) => {
                    tracing::warn!(file = %self.location, "the storage engine panicked before closing a store file; closing it without writing, its next open replays the journal");
                    true
                }
            };
            if failed {
                self.discard.lock().store(true, Ordering::Release);
            }
        }
        close(&self.location, db);
    }
}

impl Drop for StoreFile {
    fn drop(&mut self) {
        if let Some(db) = self.db.get_mut().take() {
            self.close(db);
        }
    }
}

/// Drop a redb handle, containing a panic of redb's `Drop`.
///
/// After redb panicked inside a call (caught, see [`StoreFile::panicked`]) its internal
/// mutexes are poisoned, and redb's `Drop` unwraps one of them: closing such a handle
/// panics, which would take down whatever thread drops the store (at shutdown, or the
/// reopen that replaces the handle). The handle is untrusted already and its file is
/// reopened (and recovered) on next use, so the panic is contained here and logged.
fn close<D>(location: &str, db: D) {
    if catch_unwind(AssertUnwindSafe(move || drop(db))).is_err() {
        tracing::warn!(file = %location, "the storage engine panicked while closing a damaged store file");
    }
}

/// Run a store operation on the blocking pool (see the module docs for why).
pub(crate) async fn blocking<T, R>(
    owner: &Arc<T>,
    file: fn(&T) -> &StoreFile,
    f: impl FnOnce(&T) -> Result<R, BackendFailure> + Send + 'static,
) -> Result<R, BackendFailure>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    let inner = owner.clone();
    match tokio::task::spawn_blocking(move || f(&inner)).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => Err(file(owner).panicked()),
        Err(_) => Err(BackendFailure::new(
            FailureKind::Unavailable,
            file(owner).location().to_string(),
            "the runtime is shutting down",
        )),
    }
}

/// [`blocking`] for a caller that is already on a thread where blocking is the point
/// (the pending writer's): `f` runs here, and a panic inside it fails closed the same way.
pub(crate) fn on_this_thread<R>(
    file: &StoreFile,
    f: impl FnOnce() -> Result<R, BackendFailure>,
) -> Result<R, BackendFailure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| Err(file.panicked()))
}

/// Check (or, in a new file, write) the file's layout version. A file of any other
/// layout does not open: a newer one is [`FailureKind::UnsupportedVersion`], an older or
/// unknown one [`FailureKind::Corrupt`], both located at the file's `meta` table.
pub(crate) fn check_layout(txn: &WriteTransaction, layout: u64) -> Result<(), Fail> {
    let mut meta = txn.open_table(META)?;
    let found = meta.get(LAYOUT_KEY)?.map(|v| v.value());
    match found {
        None => {
            meta.insert(LAYOUT_KEY, layout)?;
            Ok(())
        }
        Some(v) if v == layout => Ok(()),
        Some(v) if v > layout => Err(Fail::Newer {
            table: "meta",
            detail: format!("table layout {v} was written by a newer Sendium; this build reads layout {layout}"),
        }),
        Some(v) => Err(Fail::Invalid {
            table: "meta",
            detail: format!("unknown table layout {v}: this build reads only layout {layout} and cannot read the file"),
        }),
    }
}

/// A counter from the meta table (0 when absent).
pub(crate) fn get_counter(meta: &impl redb::ReadableTable<&'static str, u64>, key: &str) -> Result<u64, Fail> {
    Ok(meta.get(key)?.map(|v| v.value()).unwrap_or(0))
}
