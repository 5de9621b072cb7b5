//! A stage's store file whose commits are made durable by frames of the stages' journal
//! instead of fdatasyncs of its own, and [`JournaledStore`], the store handle of the
//! background stages (router-queue, routed-work) built on it.
//!
//! A write applies its change in one redb transaction and returns the frame that
//! records it; the frame is appended to the journal and, for a change that must survive
//! a crash, synced (sharing the `fdatasync` of whatever else is being flushed) before
//! the transaction commits with `Durability::None`. A change whose loss is harmless
//! (cleanup: releases, removals) does not wait: its frame goes with the next flush, and
//! since frames are flushed in LSN order, a frame that survives a crash has every
//! earlier frame of its stage with it. Checkpoints (`Durability::Immediate`, recording
//! the journal LSN) come from the journal's checkpointer, or inline when the journal
//! cannot take frames. See [`super::journal`].

use std::path::Path;
use std::sync::{Arc, Weak};

use redb::{Database, Durability, ReadTransaction, WriteTransaction};

use super::backend::FaultSwitch;
use super::db::{Fail, FileOptions, InitFn, META, RecoverFn, StoreFile, blocking, get_counter, on_this_thread};
use super::dir::DataDir;
use super::journal::{Checkpoint, Journal, Stage};
use crate::error::BackendFailure;

/// Meta key of the journal LSN a stage file's state corresponds to.
pub(crate) const JOURNAL_LSN: &str = "journal_lsn";

/// Applies one frame's payload (LSN given for error locations) during recovery.
pub(crate) type ReplayFn = fn(&WriteTransaction, &[u8], u64) -> Result<(), Fail>;

/// When a journaled write returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Once its frame is synced: the change survives a crash.
    Synced,
    /// At once: the frame goes with the next flush (a change whose loss is harmless).
    Buffered,
}

/// What a journaled stage's store file is: its name in the data directory, its stage in
/// the journal, how its tables are created and checked, and how one of its frames is
/// applied again.
pub(crate) struct StageFile {
    pub(crate) name: &'static str,
    pub(crate) stage: Stage,
    pub(crate) init: InitFn,
    pub(crate) replay: ReplayFn,
}

/// The store of a background stage: its [`JournaledFile`], shared with the journal's
/// checkpointer, and the hop of every call onto the blocking pool. The stage keeps only
/// its tables, its frames and what its calls do with them.
#[derive(Clone)]
pub(crate) struct JournaledStore {
    file: Arc<JournaledFile>,
}

impl JournaledStore {
    /// Open (or create) the stage's file in `dir`, applying its journal frames first,
    /// and have the journal's checkpointer checkpoint it. Blocking.
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
        f: impl FnOnce(&JournaledFile) -> Result<R, BackendFailure> + Send + 'static,
    ) -> Result<R, E>
    where
        R: Send + 'static,
        E: From<BackendFailure>,
    {
        Ok(blocking(&self.file, |j| &j.file, f).await?)
    }
}

/// One stage's redb file, made durable through the journal (see the module docs).
pub(crate) struct JournaledFile {
    file: StoreFile,
    journal: Arc<Journal>,
    stage: Stage,
}

impl JournaledFile {
    /// Open `<dir>/<name>`, applying the stage's journal frames its durable state does
    /// not hold (`replay`) before anyone reads it. Blocking.
    fn open(dir: &Arc<DataDir>, of: &StageFile, options: FileOptions) -> Result<Self, BackendFailure> {
        let (stage, replay) = (of.stage, of.replay);
        let journal = dir.journal()?;
        let j = journal.clone();
        let recover: RecoverFn = Box::new(move |db| recover(db, &j, stage, replay, options.quick_repair));
        let file = StoreFile::open_with(
            dir,
            of.name,
            options,
            of.init,
            Arc::new(FaultSwitch::default()),
            Some(recover),
        )?;
        Ok(Self { file, journal, stage })
    }

    /// Run `f` in one read transaction (a consistent snapshot; never blocks a writer).
    pub(crate) fn read<R>(&self, f: impl FnOnce(&ReadTransaction) -> Result<R, Fail>) -> Result<R, BackendFailure> {
        self.file.read(f)
    }

    /// One write transaction: `change` applies the change and returns the payload of
    /// the frame that records it, or `None` if it changed nothing (the transaction is
    /// aborted). Durable as `wait` says before it returns (see the module docs).
    pub(crate) fn write(
        &self,
        wait: Wait,
        change: impl FnOnce(&WriteTransaction) -> Result<Option<Vec<u8>>, Fail>,
    ) -> Result<(), BackendFailure> {
        // Set once the frame is synced: from then on the journal, not redb's memory, is
        // the truth.
        let mut journaled = false;
        let mut checkpoint = None;
        let result = self.file.write_txn(|txn| {
            let recorded = get_counter(&txn.open_table(META)?, JOURNAL_LSN)?;
            self.journal
                .check_applied(self.stage, recorded)
                .map_err(Fail::Located)?;
            let Some(payload) = change(txn)? else {
                return Ok(((), false));
            };
            let lsn = match self.journal.try_append(self.stage, &payload).map_err(Fail::Located)? {
                Some(lsn) => {
                    if wait == Wait::Synced {
                        self.journal.sync_riding(lsn).map_err(Fail::Located)?;
                        self.journal.applying(self.stage, lsn);
                        journaled = true;
                    }
                    txn.set_durability(Durability::None)?;
                    lsn
                }
                None => {
                    let lsn = self.journal.checkpoint_lsn();
                    txn.set_durability(Durability::Immediate)?;
                    checkpoint = Some(lsn);
                    lsn
                }
            };
            txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
            Ok(((), true))
        });
        match (result, journaled) {
            (Ok(()), _) => {
                if let Some(lsn) = checkpoint {
                    self.journal.checkpointed(self.stage, lsn);
                }
                Ok(())
            }
            (Err(e), true) => {
                // Durable in the journal, not applied to redb: the write happened. No
                // write proceeds on redb's state without it (`check_applied`), and the
                // reopen this asks for applies it before anything reads the file again.
                tracing::warn!(stage = self.stage.name(), error = %e, "commit journaled but not applied; reopening the store file");
                self.file.invalidate(e.kind);
                Ok(())
            }
            (Err(e), false) => Err(e),
        }
    }
}

impl Checkpoint for JournaledFile {
    /// A durable commit recording the journal's LSN, if the stage has frames its file's
    /// durable state does not hold.
    fn checkpoint(&self) -> Result<(), BackendFailure> {
        if !self.journal.uncovered(self.stage) {
            return Ok(());
        }
        on_this_thread(&self.file, || {
            let mut lsn = 0;
            self.file.write(Durability::Immediate, |txn| {
                let mut meta = txn.open_table(META)?;
                let recorded = get_counter(&meta, JOURNAL_LSN)?;
                self.journal
                    .check_applied(self.stage, recorded)
                    .map_err(Fail::Located)?;
                lsn = self.journal.checkpoint_lsn();
                meta.insert(JOURNAL_LSN, lsn)?;
                Ok(((), true))
            })?;
            self.journal.checkpointed(self.stage, lsn);
            Ok(())
        })
    }
}

/// Apply the stage's frames the file does not hold, durably. Runs on every (re)open,
/// before any caller sees the file.
fn recover(db: &Database, journal: &Journal, stage: Stage, replay: ReplayFn, quick_repair: bool) -> Result<(), Fail> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.set_quick_repair(quick_repair);
    let stored = get_counter(&txn.open_table(META)?, JOURNAL_LSN)?;
    let frames = journal.register(stage, stored).map_err(Fail::Located)?;
    let replayed = frames.len();
    for frame in frames {
        replay(&txn, &frame.payload, frame.lsn)?;
    }
    let lsn = journal.checkpoint_lsn();
    txn.open_table(META)?.insert(JOURNAL_LSN, lsn)?;
    txn.commit()?;
    journal.checkpointed(stage, lsn);
    if replayed > 0 {
        tracing::info!(
            stage = stage.name(),
            frames = replayed,
            "applied journal frames after an unclean stop"
        );
    }
    Ok(())
}
