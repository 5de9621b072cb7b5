//! The engine of the background stages (router-queue, routed-work): the stage's whole
//! state in memory, every change made durable by a frame of the stages' journal, and
//! the stage's redb file a checkpoint image of that state.
//!
//! # Why the state lives in memory
//!
//! These stages hold in-flight work only (bounded by `max-in-flight`), and while
//! destinations keep up a record lives from routing to its source's completion, tens of
//! milliseconds, against a checkpoint every second or so: most records never need to be
//! in the file at all. So a write changes the in-memory [`StageState`] and appends the
//! frame that records the change; a checkpoint writes to redb only the records changed
//! since the last one, as they are at that moment (a record created and removed in
//! between never reaches the file).
//!
//! # Durability
//!
//! A write that must survive a crash returns once its frame is synced (sharing the
//! `fdatasync` of whatever else is being flushed, see [`super::journal`]). A change whose
//! loss is harmless (cleanup: releases, removals) does not wait: its frame goes with the
//! next flush, and since frames are flushed in LSN order, a frame that survives a crash
//! has every earlier frame of its stage with it. A checkpoint is one durable redb
//! commit (`Durability::Immediate`) of the changed records and the journal LSN they
//! correspond to. After a crash the file is at its last checkpoint; its frames after
//! that LSN are applied again to the state loaded from it, with the decisions the live
//! process made, and the result is saved before anyone reads the stage.
//!
//! # Failures
//!
//! A change is applied to memory before its frame is synced (the frame is built from
//! what it changed). If the sync fails, the write fails and memory holds a change the
//! journal does not: the state is marked stale, the file invalidated, and the next call
//! reopens the file, which replays the synced frames, and takes the state it recovered.
//! A failed checkpoint keeps its changed records for the next one; after the file was
//! reopened the next checkpoint rewrites the file's tables whole from memory.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::path::Path;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use redb::{Database, Durability, WriteTransaction};

use super::backend::FaultSwitch;
use super::db::{Fail, FileOptions, InitFn, META, RecoverFn, StoreFile, blocking, get_counter, on_this_thread};
use super::dir::DataDir;
use super::journal::{Checkpoint, Journal, Stage};
use crate::error::{BackendFailure, FailureKind};
use crate::ids::IdSet;

/// Meta key of the journal LSN a stage file's state corresponds to.
pub(crate) const JOURNAL_LSN: &str = "journal_lsn";

/// When a journaled write returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Once its frame is synced: the change survives a crash.
    Synced,
    /// At once: the frame goes with the next flush (a change whose loss is harmless).
    Buffered,
}

/// A background stage's state in memory: how it is read from its file, how a journal
/// frame is applied to it, and how its changes are written back at a checkpoint.
pub(crate) trait StageState: Default + Send + Sync + 'static {
    /// The stage's whole state as its file holds it (the file's tables are checked).
    fn load(txn: &WriteTransaction) -> Result<Self, Fail>;
    /// Apply one of the stage's journal frames (`lsn` names it in errors).
    fn replay(&mut self, payload: &[u8], lsn: u64) -> Result<(), Fail>;
    /// Write the records changed since the last [`saved`](Self::saved) to the file, or
    /// with `whole` replace the file's tables with the whole state.
    fn save(&self, txn: &WriteTransaction, whole: bool) -> Result<(), Fail>;
    /// The last [`save`](Self::save) committed: the file holds the state as it is.
    fn saved(&mut self);
}

/// What a background stage's store file is: its name in the data directory, its stage
/// in the journal, and how its tables are created and checked.
pub(crate) struct StageFile {
    pub(crate) name: &'static str,
    pub(crate) stage: Stage,
    pub(crate) init: InitFn,
}

/// The store of a background stage: its [`JournaledFile`], shared with the journal's
/// checkpointer, and the hop of every call onto the blocking pool.
pub(crate) struct JournaledStore<S: StageState> {
    file: Arc<JournaledFile<S>>,
}

impl<S: StageState> Clone for JournaledStore<S> {
    fn clone(&self) -> Self {
        Self {
            file: self.file.clone(),
        }
    }
}

impl<S: StageState> JournaledStore<S> {
    /// Open (or create) the stage's file in `dir`, recover its state (applying its
    /// journal frames), and have the journal's checkpointer checkpoint it. Blocking.
    pub(crate) fn open(dir: &Arc<DataDir>, of: &StageFile, options: FileOptions) -> Result<Self, BackendFailure> {
        let file = Arc::new(JournaledFile::open(dir, of, options)?);
        let hook: Weak<dyn Checkpoint> = Arc::downgrade(&file) as Weak<dyn Checkpoint>;
        file.journal.set_hook(file.stage, hook);
        Ok(Self { file })
    }

    /// The store file (for logs and `sendium inspect`).
    pub(crate) fn path(&self) -> &Path {
        self.file.file.path()
    }

    /// Run `f` on the blocking pool (see [`super::db`]), its failure as the stage's error.
    pub(crate) async fn run<R, E>(
        &self,
        f: impl FnOnce(&JournaledFile<S>) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<BackendFailure>,
    {
        Ok(blocking(&self.file, |j| &j.file, f).await?)
    }
}

#[cfg(test)]
impl<S: StageState> JournaledStore<S> {
    pub(crate) fn journal(&self) -> &Arc<Journal> {
        &self.file.journal
    }

    /// The store file's fault switches.
    pub(crate) fn file_faults(&self) -> &FaultSwitch {
        &self.file.file.faults
    }

    pub(crate) fn checkpoint_now(&self) -> Result<(), BackendFailure> {
        self.file.checkpoint()
    }

    /// Read the store file as it is (not the state in memory).
    pub(crate) fn read_file<R>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction) -> Result<R, Fail>,
    ) -> Result<R, BackendFailure> {
        self.file.file.read(f)
    }
}

/// One background stage: its state, its journal frames and its checkpoint file (see
/// the module docs).
pub(crate) struct JournaledFile<S: StageState> {
    file: StoreFile,
    journal: Arc<Journal>,
    stage: Stage,
    /// Held by a write from its change to its frame's sync, by a checkpoint and by a
    /// read: the stage's frames are in the order of its changes, a checkpoint sees every
    /// change whose frame it covers, and a read sees only writes that have returned.
    current: Mutex<Current<S>>,
    /// The state the last (re)open of the file recovered, until taken.
    recovered: Arc<Mutex<Option<S>>>,
}

struct Current<S> {
    state: S,
    /// Holds a change the journal may not: replaced by the file's recovery before use.
    stale: bool,
    /// The file was reopened behind the state: the next checkpoint rewrites it whole.
    rewrite: bool,
}

impl<S: StageState> JournaledFile<S> {
    /// Open `<dir>/<name>`, recovering the state (its journal frames the file does not
    /// hold applied, and saved) before anyone reads it. Blocking.
    fn open(dir: &Arc<DataDir>, of: &StageFile, options: FileOptions) -> Result<Self, BackendFailure> {
        let stage = of.stage;
        let journal = dir.journal()?;
        let recovered: Arc<Mutex<Option<S>>> = Arc::default();
        let (j, slot) = (journal.clone(), recovered.clone());
        let recover: RecoverFn = Box::new(move |db| {
            let state = recover::<S>(db, &j, stage, options.quick_repair)?;
            *slot.lock() = Some(state);
            Ok(())
        });
        let file = StoreFile::open_with(
            dir,
            of.name,
            options,
            of.init,
            Arc::new(FaultSwitch::default()),
            Some(recover),
            None,
        )?;
        let state = recovered.lock().take().unwrap_or_default();
        Ok(Self {
            file,
            journal,
            stage,
            current: Mutex::new(Current {
                state,
                stale: false,
                rewrite: false,
            }),
            recovered,
        })
    }

    /// Read the state.
    pub(crate) fn read<R>(&self, f: impl FnOnce(&S) -> R) -> Result<R, BackendFailure> {
        let mut current = self.current.lock();
        self.refresh(&mut current)?;
        Ok(f(&current.state))
    }

    /// One write: `change` applies it to the state and returns the payload of the frame
    /// that records it, or `None` if it changed nothing. Durable as `wait` says before
    /// it returns (see the module docs).
    pub(crate) fn write(
        &self,
        wait: Wait,
        change: impl FnOnce(&mut S) -> Result<Option<Vec<u8>>, Fail>,
    ) -> Result<(), BackendFailure> {
        let mut current = self.current.lock();
        self.refresh(&mut current)?;
        let appended = match change(&mut current.state) {
            Ok(None) => return Ok(()),
            Ok(Some(payload)) => self.journal.try_append(self.stage, &payload).and_then(|lsn| match lsn {
                Some(lsn) if wait == Wait::Synced => self.journal.sync_riding(lsn),
                Some(_) => Ok(()),
                // The journal cannot take the frame: the change becomes durable by a
                // checkpoint instead.
                None => self.save(&mut current),
            }),
            Err(e) => {
                // A change that failed half way (a record that does not encode) left
                // memory ahead of the journal.
                current.stale = true;
                self.file.invalidate(FailureKind::Unavailable);
                return Err(self.file.failure(e));
            }
        };
        if let Err(e) = appended {
            // Memory may hold a change the journal does not.
            current.stale = true;
            self.file.invalidate(e.kind);
            return Err(e);
        }
        Ok(())
    }

    /// Replace a stale state by the one the file's recovery produces (reopening the
    /// file, which was invalidated when the state went stale).
    fn refresh(&self, current: &mut Current<S>) -> Result<(), BackendFailure> {
        if current.stale {
            self.file.read(|_| Ok(()))?;
        }
        self.adopt_recovered(current);
        Ok(())
    }

    /// After a (re)open of the file: a stale state takes the recovered one; a current
    /// one stays the truth, and the next checkpoint rewrites the file whole from it.
    fn adopt_recovered(&self, current: &mut Current<S>) {
        let Some(recovered) = self.recovered.lock().take() else {
            return;
        };
        if current.stale {
            *current = Current {
                state: recovered,
                stale: false,
                rewrite: false,
            };
        } else {
            current.rewrite = true;
        }
    }

    /// A durable commit of the changed records and the journal's LSN, if the stage has
    /// frames its file's durable state does not hold (or the file must be rewritten).
    fn checkpoint_current(&self, current: &mut Current<S>) -> Result<(), BackendFailure> {
        if !self.journal.uncovered(self.stage) && !current.rewrite {
            return Ok(());
        }
        self.save(current)
    }

    /// A durable commit of the changed records and the journal's LSN. The state is not
    /// stale.
    fn save(&self, current: &mut Current<S>) -> Result<(), BackendFailure> {
        on_this_thread(&self.file, || {
            let mut lsn = 0;
            self.file.write(Durability::Immediate, |txn| {
                // The file may have been reopened (and recovered) to begin this
                // transaction, after an earlier failure latched it.
                self.adopt_recovered(current);
                current.state.save(txn, current.rewrite)?;
                lsn = self.journal.checkpoint_lsn();
                txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
                Ok(((), true))
            })?;
            current.state.saved();
            current.rewrite = false;
            self.journal.checkpointed(self.stage, lsn);
            Ok(())
        })
    }
}

impl<S: StageState> Checkpoint for JournaledFile<S> {
    fn checkpoint(&self) -> Result<(), BackendFailure> {
        let mut current = self.current.lock();
        self.refresh(&mut current)?;
        self.checkpoint_current(&mut current)
    }
}

impl<S: StageState> Drop for JournaledFile<S> {
    /// A clean close checkpoints: the file then holds every change, those whose frames
    /// were never flushed (cleanup) too.
    fn drop(&mut self) {
        let mut current = self.current.lock();
        if current.stale {
            return;
        }
        if let Err(e) = self.checkpoint_current(&mut current) {
            tracing::warn!(stage = self.stage.name(), error = %e, "checkpoint at close failed");
        }
    }
}

/// Which keys of a stage's table changed since its last checkpoint (each with what its
/// removal from the file needs), and which the file holds: what a [`StageState`]
/// writes back at a checkpoint.
pub(crate) struct ChangedKeys<K, V> {
    changed: BTreeMap<K, V>,
    in_file: IdSet<K>,
}

impl<K, V> Default for ChangedKeys<K, V> {
    fn default() -> Self {
        Self {
            changed: BTreeMap::new(),
            in_file: IdSet::default(),
        }
    }
}

impl<K: Ord + Hash + Copy, V> ChangedKeys<K, V> {
    /// `key` is in the file as loaded.
    pub(crate) fn loaded(&mut self, key: K) {
        self.in_file.insert(key);
    }

    /// `key` was written or removed in memory.
    pub(crate) fn mark(&mut self, key: K, value: V) {
        self.changed.insert(key, value);
    }

    /// The keys changed since the last checkpoint, in key order, each with whether the
    /// file holds it.
    pub(crate) fn pending(&self) -> impl Iterator<Item = (&K, &V, bool)> + '_ {
        self.changed.iter().map(|(k, v)| (k, v, self.in_file.contains(k)))
    }

    /// The checkpoint committed: the file holds exactly the keys `live` says are in
    /// memory.
    pub(crate) fn saved(&mut self, live: impl Fn(&K) -> bool) {
        for (key, _) in std::mem::take(&mut self.changed) {
            if live(&key) {
                self.in_file.insert(key);
            } else {
                self.in_file.remove(&key);
            }
        }
    }
}

/// Load the stage's state from its file, apply its frames the file does not hold, and
/// save the result durably. Runs on every (re)open, before any caller sees the file.
fn recover<S: StageState>(db: &Database, journal: &Journal, stage: Stage, quick_repair: bool) -> Result<S, Fail> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.set_quick_repair(quick_repair);
    let stored = get_counter(&txn.open_table(META)?, JOURNAL_LSN)?;
    let frames = journal.register(stage, stored).map_err(Fail::Located)?;
    let mut state = S::load(&txn)?;
    let replayed = frames.len();
    for frame in frames {
        state.replay(&frame.payload, frame.lsn)?;
    }
    state.save(&txn, false)?;
    let lsn = journal.checkpoint_lsn();
    txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
    txn.commit()?;
    state.saved();
    journal.checkpointed(stage, lsn);
    if replayed > 0 {
        tracing::info!(
            stage = stage.name(),
            frames = replayed,
            "applied journal frames after an unclean stop"
        );
    }
    Ok(state)
}
