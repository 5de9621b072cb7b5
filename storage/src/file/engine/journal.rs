//! The data directory's journal (`<dir>/journal.0`, `<dir>/journal.1`): one log that
//! makes the pending, router-queue, routed-work and DLR commits durable.
//!
//! # Why one journal in front of redb
//!
//! An acknowledgement waits for the commit that stores it, and a client arriving during
//! a commit waits for that one and then its own, so the commit's duration is paid about
//! one and a half times by every client. A durable redb commit is one or two
//! `fdatasync`s plus the page writes (1–1.5 ms here, several times that on a busy
//! machine). Appending frames to a preallocated file and calling `fdatasync` is about
//! 0.1 ms here: overwriting blocks that already exist changes no file metadata, so the
//! sync writes only the data.
//!
//! The background stages' commits (router-queue `stage`, routed-work `record` and
//! `complete`) and the DLR store's are not durable redb commits of their own files: on a machine with one
//! disk queue those flushes would sit between the admissions' flushes and lengthen the
//! acknowledgement's tail (about 1.8 ms of the median p99 at half rate, see
//! `docs/benchmarks.md`). Every stage writes the same journal, and concurrent frames
//! share one `fdatasync` ([group commit](Journal::sync)): a router-queue frame appended
//! while an admission's frame is being synced rides along with the next one.
//!
//! So a stage's commit is made durable by a journal frame holding exactly what it
//! changed, synced before the commit returns. The pending stage and the DLR store apply
//! the commit to their redb files with `Durability::None` (visible at once, durable only
//! at the file's next durable commit); the background stages keep their state in memory and their files
//! hold only what checkpoints write (see [`super::journaled`]). Every so often a stage
//! commits with `Durability::Immediate` — a *checkpoint*, which makes everything before
//! it durable in its file.
//!
//! # Segments and checkpoints
//!
//! Frames go to the *active* one of two segment files. When it holds
//! [`SWITCH_BYTES`] or is [`SWITCH_AFTER`] old, and the other segment is *reclaimable*
//! (every stage has checkpointed past its frames there), the next flush starts a new
//! cycle in the other segment: a segment header naming the cycle's first LSN, then
//! frames. The stages with frames in the segment just left then checkpoint (the
//! [checkpointer](Journal::tick) thread does it in the background, every
//! [`CHECKPOINTER_TICK`]), which makes it reclaimable for the next switch. No stage has
//! to checkpoint at the same moment as another, and a stage that goes quiet is
//! checkpointed all the same.
//!
//! # Recovery
//!
//! Every frame carries a log sequence number (LSN) and its stage (in its magic); every
//! redb commit of a stage stores the LSN it corresponds to (`meta.journal_lsn`). After a
//! crash a stage's file is back at its last durable commit, whose LSN says which of its
//! frames it already contains; its frames after it are applied again in LSN order, with
//! exactly the decisions the live process made, so the replayed state is the state that
//! was acknowledged. The same recovery runs when a store file is reopened after an I/O
//! failure, before any reader sees the file.
//!
//! # Formats
//!
//! Segment header: `magic "SJS1" u32 | first lsn u64 | crc32(previous 12 bytes) u32`.
//! Frame: `stage magic u32 | lsn u64 | len u32 | crc32(previous 16 bytes) u32 | payload`,
//! big-endian; the payload is a sealed envelope (its own CRC-32 trailer). A segment's
//! scan starts after its header with the cycle's first LSN and follows frames whose
//! LSNs are consecutive. It ends at a frame that is not one: zeros of the preallocation,
//! a frame of an earlier cycle (its LSN is lower: LSNs never repeat), or a frame torn by
//! the crash (never synced, so never acknowledged). A damaged frame *followed by* its
//! valid successor is not a torn tail — the successor was written after it was synced —
//! and stops its stage's open as corrupt unless the stage's file already holds it (a
//! covered frame of an old cycle whose segment header a crash kept from being
//! rewritten). A group of frames whose write or sync failed was refused to its
//! clients: the first frame's header is cleared (best effort), this process's scans stop
//! before it, and the next frames start a new cycle in the other segment.
//!
//! Not detected: a damaged *header* in the middle of a segment ends its scan there (a
//! frame's length is only known from its header). Frames live until their stage's next
//! checkpoint, a second or so, which is the window such damage would have to hit.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::backend::{FaultSwitch, check_io, check_space, timed_sync};
use super::dir::{DataDir, JOURNAL_FILES, io_failure};
use super::observe::Watched;
use crate::envelope::{crc32, unseal};
use crate::error::{BackendFailure, FailureKind};

const SEGMENT_MAGIC: u32 = 0x534A_5331; // "SJS1"
const SEGMENT_HEADER: usize = 16;
const FRAME_HEADER: usize = 20;
/// Zeros written when a segment is created: appends then overwrite existing blocks.
/// Well above [`SWITCH_BYTES`], so a segment only grows when its stages' checkpoints lag.
pub(crate) const PREALLOCATE: u64 = 16 << 20;
/// A switch to the other segment is due when the active one holds this much (replay
/// after a crash stays short: about 25,000 typical records) ...
pub(crate) const SWITCH_BYTES: u64 = 8 << 20;
/// ... or when its cycle is this old (bounds the pages redb keeps unsynced, and replay
/// time at low rates).
pub(crate) const SWITCH_AFTER: Duration = Duration::from_secs(1);
/// How often the checkpointer looks for a switch to ask for and stages to checkpoint.
pub(crate) const CHECKPOINTER_TICK: Duration = Duration::from_millis(100);
/// Past this size of the active segment a stage that holds up the switch checkpoints
/// on its own next write instead of appending (the checkpointer fell behind).
const INLINE_CHECKPOINT_BYTES: u64 = 2 * PREALLOCATE;
/// How long a background stage's frame waits to ride along with another flush before
/// it leads one ([`Journal::sync_riding`]).
const RIDE_PATIENCE: Duration = Duration::from_millis(2);
/// A stage that has appended this much since its last checkpoint checkpoints on its
/// next write instead of appending: redb keeps a non-durable commit's pages in memory
/// until the next durable one (and a background stage's checkpoint writes what changed
/// since its last), so this bounds the process's memory and the checkpoint's size at
/// rates where the checkpointer's rounds come too late (a backlog filled at 250,000
/// messages/s).
const STAGE_CHECKPOINT_BYTES: u64 = 8 << 20;
/// Failed frame ranges remembered for their waiters.
const FAILED_KEPT: usize = 256;

/// The stages that write frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Pending,
    RouterQueue,
    RoutedWork,
    Dlr,
}

const STAGES: usize = 4;

impl Stage {
    const ALL: [Stage; STAGES] = [Stage::Pending, Stage::RouterQueue, Stage::RoutedWork, Stage::Dlr];

    fn index(self) -> usize {
        self as usize
    }

    /// The frame magic, one per stage: a frame names its stage with it. The values are
    /// part of the journal format and never change.
    fn magic(self) -> u32 {
        match self {
            Stage::Pending => 0x534A_4E31,     // "SJN1"
            Stage::RouterQueue => 0x534A_5131, // "SJQ1"
            Stage::RoutedWork => 0x534A_5731,  // "SJW1"
            Stage::Dlr => 0x534A_4431,         // "SJD1"
        }
    }

    fn from_magic(magic: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.magic() == magic)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Pending => "pending",
            Stage::RouterQueue => "router-queue",
            Stage::RoutedWork => "routed-work",
            Stage::Dlr => "dlr",
        }
    }
}

/// One frame read back by a scan.
#[derive(Debug)]
pub(crate) struct Frame {
    pub stage: Stage,
    pub lsn: u64,
    pub payload: Vec<u8>,
}

/// A damaged frame with a valid successor (see the module docs).
#[derive(Debug)]
struct Damage {
    stage: Stage,
    lsn: u64,
    location: String,
}

/// What a scan of one file found.
struct Scan {
    frames: Vec<Frame>,
    damaged: Vec<Damage>,
    /// Where the last frame read ends.
    end: u64,
}

/// A store that can make its journaled commits durable in its own file (the
/// checkpointer calls it, off every store's hot path).
pub(crate) trait Checkpoint: Send + Sync {
    fn checkpoint(&self) -> Result<(), BackendFailure>;
}

struct SegmentFile {
    file: File,
    location: String,
    /// Under a crash-image test: where its writes and syncs are reported.
    watched: Option<Watched>,
}

/// One segment as the journal tracks it.
#[derive(Clone, Debug, Default)]
struct SegmentState {
    /// The LSN its cycle starts with (0: no cycle).
    cycle_start: u64,
    /// Where its synced frames end (a scan of it stops here).
    end: u64,
    started: Option<Instant>,
    /// Each stage's last frame in it.
    last_in: [u64; STAGES],
}

#[derive(Default)]
struct StageState {
    /// Opened in this process, or holding frames found at open: its frames count.
    known: bool,
    /// Opened (its store registered) in this process.
    registered: bool,
    /// Every frame of it up to this LSN is in its file's durable state.
    durable: u64,
    /// Its last frame (appended, maybe not yet synced).
    last_frame: u64,
    /// When its first frame after its last checkpoint was appended.
    uncovered_since: Option<Instant>,
    /// Bytes of its frames appended since its last checkpoint.
    uncovered_bytes: u64,
    /// A synced frame whose redb commit has not succeeded (yet).
    unapplied: Option<u64>,
    hook: Option<Weak<dyn Checkpoint>>,
}

struct FailedRange {
    first: u64,
    last: u64,
    failure: BackendFailure,
}

struct State {
    seg: [SegmentState; 2],
    active: usize,
    /// The LSN the next frame takes. LSNs are never reused, not even one whose frame
    /// failed to write.
    next_lsn: u64,
    /// Frames appended and not yet handed to a flush, in LSN order.
    buf: Vec<u8>,
    buf_first: u64,
    buf_last: u64,
    buf_last_of: [u64; STAGES],
    /// Every frame up to this LSN is synced, except those in `failed`.
    synced: u64,
    flushing: bool,
    failed: Vec<FailedRange>,
    /// The next flush must start a new cycle (after opening, or after a failed flush:
    /// what the active segment holds past its end is unknown).
    needs_new_cycle: bool,
    /// The checkpointer asked for a switch.
    switch_wanted: bool,
    stages: [StageState; STAGES],
    switch_bytes: u64,
    switch_after: Duration,
    /// Flushes so far (each one `fdatasync`).
    flushes: u64,
    #[cfg(test)]
    refuse_frames: bool,
    #[cfg(test)]
    ticks_paused: bool,
}

impl State {
    fn inactive(&self) -> usize {
        1 - self.active
    }

    /// Every known stage has checkpointed past its frames in segment `i`.
    fn reclaimable(&self, i: usize) -> bool {
        self.stages
            .iter()
            .zip(self.seg[i].last_in)
            .all(|(s, last)| !s.known || last <= s.durable)
    }

    fn holds_up_switch(&self, s: Stage) -> bool {
        let st = &self.stages[s.index()];
        st.known && self.seg[self.inactive()].last_in[s.index()] > st.durable
    }

    fn can_append(&self, s: Stage) -> bool {
        #[cfg(test)]
        if self.refuse_frames {
            return false;
        }
        if self.needs_new_cycle && !self.reclaimable(self.inactive()) {
            return false;
        }
        if self.stages[s.index()].uncovered_bytes >= STAGE_CHECKPOINT_BYTES {
            return false;
        }
        !(self.seg[self.active].end >= INLINE_CHECKPOINT_BYTES && self.holds_up_switch(s))
    }

    fn failed(&self, lsn: u64) -> Option<&FailedRange> {
        self.failed.iter().find(|f| (f.first..=f.last).contains(&lsn))
    }

    fn switch_due(&self) -> bool {
        let active = &self.seg[self.active];
        let has_frames = active.end > SEGMENT_HEADER as u64;
        has_frames
            && (active.end >= self.switch_bytes || active.started.is_some_and(|t| t.elapsed() >= self.switch_after))
    }
}

/// The open journal, shared by the file stages of one data directory (see
/// [`DataDir::journal`]). Internally synchronized: frames are appended inside a stage's
/// write transaction, so each stage's frame order is its redb commit order.
pub(crate) struct Journal {
    segments: [SegmentFile; 2],
    faults: Arc<FaultSwitch>,
    state: Mutex<State>,
    /// Signalled when a flush ends.
    flushed: Condvar,
    /// Held through each checkpointer round, so [`Journal::pause_ticks`] can wait out a
    /// round already past its check.
    #[cfg(test)]
    ticking: Mutex<()>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("segments", &[&self.segments[0].location, &self.segments[1].location])
            .finish()
    }
}

impl Journal {
    /// Open (creating and preallocating if needed) the journal of `dir`, scan both
    /// segments, and start its checkpointer thread. Blocking.
    pub(crate) fn open(dir: &DataDir) -> Result<Arc<Journal>, BackendFailure> {
        let faults = Arc::new(FaultSwitch::default());
        let paths = JOURNAL_FILES.map(|name| dir.path().join(name));
        let created = paths.iter().any(|p| !p.exists());
        let segments = [
            open_segment(dir, JOURNAL_FILES[0], &faults)?,
            open_segment(dir, JOURNAL_FILES[1], &faults)?,
        ];
        if created {
            dir.sync()?;
        }
        let mut seg: [SegmentState; 2] = Default::default();
        let mut stages: [StageState; STAGES] = Default::default();
        let mut max_lsn = 0u64;
        for (i, s) in segments.iter().enumerate() {
            // A damaged header hides no frames: they are read without it (a run of
            // consecutive LSNs after it), and any of an old cycle among them is already
            // in its stage's file, so replay skips it.
            let header = read_segment_header(s, &faults)?;
            let scan = scan_file(&s.file, &s.location, &faults, SEGMENT_HEADER as u64, None, header)?;
            let first_read = scan.frames.first().map(|f| f.lsn);
            let first_damaged = scan.damaged.first().map(|d| d.lsn);
            let Some(cycle_start) = header.or(first_read.into_iter().chain(first_damaged).min()) else {
                continue;
            };
            seg[i].cycle_start = cycle_start;
            seg[i].end = scan.end;
            max_lsn = max_lsn.max(cycle_start);
            for f in scan
                .frames
                .iter()
                .map(|f| (f.stage, f.lsn))
                .chain(scan.damaged.iter().map(|d| (d.stage, d.lsn)))
            {
                let (stage, lsn) = f;
                seg[i].last_in[stage.index()] = seg[i].last_in[stage.index()].max(lsn);
                let st = &mut stages[stage.index()];
                st.known = true;
                st.last_frame = st.last_frame.max(lsn);
                max_lsn = max_lsn.max(lsn);
            }
        }
        let active = usize::from(seg[1].cycle_start > seg[0].cycle_start);
        let journal = Arc::new(Journal {
            segments,
            faults,
            state: Mutex::new(State {
                seg,
                active,
                // One more than any LSN seen: a frame torn by the crash may carry it.
                next_lsn: max_lsn + 2,
                buf: Vec::new(),
                buf_first: 0,
                buf_last: 0,
                buf_last_of: [0; STAGES],
                synced: max_lsn,
                flushing: false,
                failed: Vec::new(),
                needs_new_cycle: true,
                switch_wanted: false,
                stages,
                switch_bytes: SWITCH_BYTES,
                switch_after: SWITCH_AFTER,
                flushes: 0,
                #[cfg(test)]
                refuse_frames: false,
                #[cfg(test)]
                ticks_paused: false,
            }),
            flushed: Condvar::new(),
            #[cfg(test)]
            ticking: Mutex::new(()),
        });
        let weak = Arc::downgrade(&journal);
        let spawned = std::thread::Builder::new()
            .name("journal-checkpointer".into())
            .spawn(move || run_checkpointer(&weak));
        if let Err(e) = spawned {
            // The stages still checkpoint on their own once the active segment is large.
            tracing::error!(error = %e, "cannot start the journal checkpointer thread");
        }
        Ok(journal)
    }

    /// The fault switches of the journal's files (shared with the pending store file:
    /// one disk).
    pub(crate) fn faults(&self) -> &Arc<FaultSwitch> {
        &self.faults
    }

    /// The location named in errors about the journal as a whole.
    pub(crate) fn location(&self) -> &str {
        &self.segments[0].location
    }

    /// `stage` opens its store file, whose durable state holds its frames up to
    /// `stored`: its frames after that, in LSN order, to apply before anyone reads the
    /// file. Its frames count from now on (a switch waits for its checkpoints). Fails
    /// as corrupt if one of its frames that the file does not hold is damaged.
    pub(crate) fn register(&self, stage: Stage, stored: u64) -> Result<Vec<Frame>, BackendFailure> {
        let mut st = self.state.lock();
        while st.flushing {
            self.flushed.wait(&mut st);
        }
        {
            let s = &mut st.stages[stage.index()];
            s.known = true;
            s.registered = true;
            s.durable = s.durable.max(stored);
        }
        if stored >= st.next_lsn {
            // A file ahead of the journal (its frames lost with a segment, or the
            // journal files replaced): LSNs go on after it, one more for a frame a crash
            // may have torn. The active cycle's LSNs must stay consecutive, so the next
            // frames start a new one.
            st.next_lsn = stored + 2;
            st.needs_new_cycle = true;
        }
        let mut order = [0usize, 1];
        order.sort_by_key(|&i| st.seg[i].cycle_start);
        let mut frames = Vec::new();
        for i in order {
            let seg = &st.seg[i];
            if seg.cycle_start == 0 || seg.last_in[stage.index()] <= stored {
                continue;
            }
            let file = &self.segments[i];
            let scan = scan_file(
                &file.file,
                &file.location,
                &self.faults,
                SEGMENT_HEADER as u64,
                Some(seg.end),
                Some(seg.cycle_start),
            )?;
            if let Some(d) = scan.damaged.iter().find(|d| d.stage == stage && d.lsn > stored) {
                return Err(BackendFailure::new(
                    FailureKind::Corrupt,
                    d.location.clone(),
                    format!(
                        "journal frame {} of the {} stage is damaged but later frames follow it: \
                         acknowledged work would be lost, so the store does not open",
                        d.lsn,
                        stage.name()
                    ),
                ));
            }
            frames.extend(scan.frames.into_iter().filter(|f| f.stage == stage && f.lsn > stored));
        }
        Ok(frames)
    }

    /// The store of `stage` checkpoints through `hook` when the checkpointer asks.
    pub(crate) fn set_hook(&self, stage: Stage, hook: Weak<dyn Checkpoint>) {
        self.state.lock().stages[stage.index()].hook = Some(hook);
    }

    /// Stages found in the journal at open that this process did not open: their
    /// frames belong to a stage the running profile keeps elsewhere (a profile change is
    /// refused while such a stage holds records), so they stop holding up switches.
    pub(crate) fn forget_unopened(&self) {
        let mut st = self.state.lock();
        for s in Stage::ALL {
            let state = &mut st.stages[s.index()];
            if state.known && !state.registered {
                tracing::warn!(
                    stage = s.name(),
                    "journal frames of a stage this profile does not keep in files are ignored"
                );
                state.known = false;
            }
        }
    }

    /// Append a frame of `stage` to the next flush, or `None` if the stage must
    /// checkpoint instead (the journal cannot take frames until a new cycle can start,
    /// or this stage holds up a switch the journal needs). Wait for it with
    /// [`sync`](Self::sync).
    pub(crate) fn try_append(&self, stage: Stage, payload: &[u8]) -> Result<Option<u64>, BackendFailure> {
        let size = u32::try_from(payload.len()).map_err(|_| {
            BackendFailure::new(
                FailureKind::Unavailable,
                self.location().to_string(),
                "one commit is larger than 4 GiB",
            )
        })?;
        let mut st = self.state.lock();
        if !st.can_append(stage) {
            return Ok(None);
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        let at = st.buf.len();
        st.buf.extend_from_slice(&stage.magic().to_be_bytes());
        st.buf.extend_from_slice(&lsn.to_be_bytes());
        st.buf.extend_from_slice(&size.to_be_bytes());
        let crc = crc32(st.buf.get(at..).unwrap_or_default());
        st.buf.extend_from_slice(&crc.to_be_bytes());
        st.buf.extend_from_slice(payload);
        if st.buf_first == 0 {
            st.buf_first = lsn;
        }
        st.buf_last = lsn;
        st.buf_last_of[stage.index()] = lsn;
        let s = &mut st.stages[stage.index()];
        s.last_frame = lsn;
        s.uncovered_since.get_or_insert_with(Instant::now);
        s.uncovered_bytes += (FRAME_HEADER + payload.len()) as u64;
        Ok(Some(lsn))
    }

    /// Wait until frame `lsn` is synced, flushing everything appended so far if no
    /// flush is running (group commit: one `fdatasync` for every frame appended since
    /// the last flush began, whichever stage appended it). Err if its flush failed.
    pub(crate) fn sync(&self, lsn: u64) -> Result<(), BackendFailure> {
        self.sync_within(lsn, Duration::ZERO)
    }

    /// [`sync`](Self::sync) for a frame nobody is waiting on to be acknowledged: it rides
    /// along with another stage's flush if one covers it within `patience`, and leads a
    /// flush of its own only after that. Under load the pending writer flushes every
    /// millisecond or so, and a background stage's frames go with those instead of
    /// adding flushes of their own between them (each one a disk cache flush the next
    /// acknowledgement would queue behind).
    pub(crate) fn sync_riding(&self, lsn: u64) -> Result<(), BackendFailure> {
        self.sync_within(lsn, RIDE_PATIENCE)
    }

    fn sync_within(&self, lsn: u64, patience: Duration) -> Result<(), BackendFailure> {
        let lead_at = Instant::now() + patience;
        let mut st = self.state.lock();
        loop {
            if let Some(f) = st.failed(lsn) {
                return Err(f.failure.clone());
            }
            if st.synced >= lsn {
                return Ok(());
            }
            if st.flushing {
                self.flushed.wait(&mut st);
                continue;
            }
            if st.buf_first == 0 || st.buf_first > lsn {
                // Flushed and failed, so long ago that the failure is forgotten.
                return Err(BackendFailure::new(
                    FailureKind::Unavailable,
                    self.location().to_string(),
                    format!("journal frame {lsn} was not written"),
                ));
            }
            if Instant::now() < lead_at {
                self.flushed.wait_until(&mut st, lead_at);
                continue;
            }
            self.flush(&mut st);
        }
    }

    /// Write and sync the buffered frames (the lock is released for the I/O).
    fn flush(&self, st: &mut MutexGuard<'_, State>) {
        if st.buf_first == 0 {
            return;
        }
        let buf = std::mem::take(&mut st.buf);
        let (first, last) = (st.buf_first, st.buf_last);
        let of = std::mem::take(&mut st.buf_last_of);
        st.buf_first = 0;
        st.buf_last = 0;
        let other = st.inactive();
        let size_due = st.seg[st.active].end >= st.switch_bytes;
        let new_cycle = st.needs_new_cycle || ((st.switch_wanted || size_due) && st.reclaimable(other));
        if new_cycle && !st.reclaimable(other) {
            let failure = BackendFailure::new(
                FailureKind::Unavailable,
                self.location().to_string(),
                "the journal failed a write and is waiting for the stages' checkpoints",
            );
            st.failed.push(FailedRange { first, last, failure });
            self.flushed.notify_all();
            return;
        }
        let (seg, at) = if new_cycle {
            (other, 0)
        } else {
            (st.active, st.seg[st.active].end)
        };
        st.flushing = true;
        st.flushes += 1;
        let written = MutexGuard::unlocked(st, || self.write_and_sync(seg, at, new_cycle.then_some(first), buf));
        st.flushing = false;
        match written {
            Ok(end) => {
                if new_cycle {
                    st.active = seg;
                    st.seg[seg] = SegmentState {
                        cycle_start: first,
                        end,
                        started: Some(Instant::now()),
                        last_in: of,
                    };
                    st.needs_new_cycle = false;
                    st.switch_wanted = false;
                } else {
                    let s = &mut st.seg[seg];
                    s.end = end;
                    for (l, o) in s.last_in.iter_mut().zip(of) {
                        *l = (*l).max(o);
                    }
                }
                st.synced = last;
            }
            Err(e) => {
                let frame_at = if new_cycle { SEGMENT_HEADER as u64 } else { at };
                // Best effort, unsynced: a frame that did reach the page cache must not
                // be replayed after a crash either, and the page cache is what survives
                // one of the process.
                let segment = &self.segments[seg];
                if segment.file.write_all_at(&[0u8; FRAME_HEADER], frame_at).is_ok()
                    && let Some(w) = &segment.watched
                {
                    w.wrote(frame_at, &[0u8; FRAME_HEADER]);
                }
                if new_cycle {
                    // Its old cycle was reclaimable; what it holds now is unknown.
                    st.seg[seg] = SegmentState::default();
                }
                st.needs_new_cycle = true;
                if st.failed.len() >= FAILED_KEPT {
                    st.failed.remove(0);
                }
                st.failed.push(FailedRange {
                    first,
                    last,
                    failure: e,
                });
            }
        }
        self.flushed.notify_all();
    }

    /// Write `frames` at `at` of segment `seg` (after a new segment header naming
    /// `cycle` if given, at offset 0) and `fdatasync`. Returns where they end.
    fn write_and_sync(&self, seg: usize, at: u64, cycle: Option<u64>, frames: Vec<u8>) -> Result<u64, BackendFailure> {
        let file = &self.segments[seg];
        let bytes = match cycle {
            Some(first) => {
                let mut b = Vec::with_capacity(SEGMENT_HEADER + frames.len());
                b.extend_from_slice(&SEGMENT_MAGIC.to_be_bytes());
                b.extend_from_slice(&first.to_be_bytes());
                let crc = crc32(&b);
                b.extend_from_slice(&crc.to_be_bytes());
                b.extend_from_slice(&frames);
                b
            }
            None => frames,
        };
        check_space(&self.faults)
            .and_then(|()| file.file.write_all_at(&bytes, at))
            .map_err(|e| io_failure(&file.location, "cannot write", &e))?;
        if let Some(w) = &file.watched {
            w.wrote(at, &bytes);
        }
        check_io(&self.faults)
            .and_then(|()| {
                if self.faults.sync.load(Ordering::Relaxed) {
                    return Err(std::io::Error::other("injected fdatasync failure"));
                }
                timed_sync(JOURNAL_METRIC, || file.file.sync_data())
            })
            .map_err(|e| io_failure(&file.location, "cannot sync", &e))?;
        if let Some(w) = &file.watched {
            w.synced();
        }
        Ok(at + bytes.len() as u64)
    }

    /// The LSN a checkpoint records: the last one taken. A frame of the stage that
    /// failed to write is at or below it, so replay never applies it.
    pub(crate) fn checkpoint_lsn(&self) -> u64 {
        self.state.lock().next_lsn - 1
    }

    /// A durable commit of `stage`'s file recorded `lsn`
    /// ([`checkpoint_lsn`](Self::checkpoint_lsn), taken inside that commit).
    pub(crate) fn checkpointed(&self, stage: Stage, lsn: u64) {
        let mut st = self.state.lock();
        let s = &mut st.stages[stage.index()];
        s.durable = s.durable.max(lsn);
        // Its frames up to `lsn` are all of them: a stage appends only inside its own
        // write transactions, and the checkpoint was one.
        s.uncovered_bytes = 0;
        if s.last_frame <= s.durable {
            s.uncovered_since = None;
        }
        if s.unapplied.is_some_and(|u| u <= lsn) {
            s.unapplied = None;
        }
    }

    /// Whether `stage` has frames its file's durable state does not hold.
    pub(crate) fn uncovered(&self, stage: Stage) -> bool {
        let st = self.state.lock();
        let s = &st.stages[stage.index()];
        s.last_frame > s.durable
    }

    /// Frame `lsn` of `stage` is synced; its redb commit follows.
    pub(crate) fn applying(&self, stage: Stage, lsn: u64) {
        self.state.lock().stages[stage.index()].unapplied = Some(lsn);
    }

    /// Before any write of `stage`: `recorded` is the LSN its file holds in this
    /// transaction. Refuses while its last synced frame is not in it (its redb commit
    /// failed and no reopen has applied it yet): a write on that state would diverge
    /// from the journal.
    pub(crate) fn check_applied(&self, stage: Stage, recorded: u64) -> Result<(), BackendFailure> {
        let mut st = self.state.lock();
        let s = &mut st.stages[stage.index()];
        match s.unapplied {
            Some(lsn) if recorded < lsn => Err(BackendFailure::new(
                FailureKind::Unavailable,
                self.segments[0].location.clone(),
                format!(
                    "journal frame {lsn} of the {} stage is waiting to be applied by a reopen of its store",
                    stage.name()
                ),
            )),
            _ => {
                s.unapplied = None;
                Ok(())
            }
        }
    }

    /// One checkpointer round: ask for a switch when the active segment is due and the
    /// other reclaimable, and checkpoint the stages that hold up the next switch or have
    /// had frames uncovered for long.
    fn tick(&self) {
        #[cfg(test)]
        let _round = self.ticking.lock();
        let hooks: Vec<(Stage, Arc<dyn Checkpoint>)> = {
            let mut st = self.state.lock();
            #[cfg(test)]
            if st.ticks_paused {
                return;
            }
            if !st.needs_new_cycle && st.switch_due() && st.reclaimable(st.inactive()) {
                st.switch_wanted = true;
            }
            // Frames nobody waits for (cleanup) are not left in memory for long.
            if st.buf_first != 0 && !st.flushing {
                self.flush(&mut st);
            }
            let long = st.switch_after * 2;
            Stage::ALL
                .into_iter()
                .filter(|&s| {
                    let state = &st.stages[s.index()];
                    st.holds_up_switch(s)
                        || (state.known
                            && state.last_frame > state.durable
                            && state.uncovered_since.is_some_and(|t| t.elapsed() >= long))
                })
                .filter_map(|s| Some((s, st.stages[s.index()].hook.as_ref()?.upgrade()?)))
                .collect()
        };
        for (stage, hook) in hooks {
            if let Err(e) = hook.checkpoint() {
                // Its next write meets the same failure and refuses: nothing more here.
                tracing::warn!(stage = stage.name(), error = %e, "journal checkpoint failed");
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn set_switch(&self, bytes: u64, after: Duration) {
        let mut st = self.state.lock();
        st.switch_bytes = bytes;
        st.switch_after = after;
        st.switch_wanted = false;
    }

    /// Make every stage checkpoint instead of appending (as a journal that cannot start a
    /// new cycle does).
    #[cfg(test)]
    pub(crate) fn refuse_frames(&self, refuse: bool) {
        self.state.lock().refuse_frames = refuse;
    }

    /// Stop the checkpointer's rounds (a test that needs frames left unflushed). A round
    /// already running (its checkpoints run outside the state lock) is waited for, so no
    /// checkpoint covers what is written after this returns.
    #[cfg(test)]
    pub(crate) fn pause_ticks(&self) {
        self.state.lock().ticks_paused = true;
        drop(self.ticking.lock());
    }

    #[cfg(test)]
    pub(crate) fn flushes(&self) -> u64 {
        self.state.lock().flushes
    }

    /// Run one checkpointer round now.
    #[cfg(test)]
    pub(crate) fn tick_now(&self) {
        self.tick();
    }

    /// Where the active segment's frames end, and its cycle's first LSN.
    #[cfg(test)]
    pub(crate) fn active_segment(&self) -> (usize, u64, u64) {
        let st = self.state.lock();
        (st.active, st.seg[st.active].cycle_start, st.seg[st.active].end)
    }
}

/// The name of the journal's fsync timings (both segments).
pub(crate) const JOURNAL_METRIC: &str = "journal";

fn run_checkpointer(journal: &Weak<Journal>) {
    loop {
        std::thread::sleep(CHECKPOINTER_TICK);
        let Some(j) = journal.upgrade() else { return };
        j.tick();
    }
}

fn open_segment(dir: &DataDir, name: &str, faults: &FaultSwitch) -> Result<SegmentFile, BackendFailure> {
    let path = dir.path().join(name);
    let location = path.display().to_string();
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io_failure(&location, "cannot open", &e))?;
    let watched = Watched::file(dir.path(), name);
    if let Some(w) = watched.as_ref().filter(|_| !existed) {
        w.created(false);
    }
    let fail = |what: &str, e: std::io::Error| io_failure(&location, what, &e);
    let len = file.metadata().map_err(|e| fail("cannot stat", e))?.len();
    if len < PREALLOCATE {
        check_space(faults).map_err(|e| fail("cannot preallocate", e))?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = len;
        while at < PREALLOCATE {
            let n = zeros
                .len()
                .min(usize::try_from(PREALLOCATE - at).unwrap_or(zeros.len()));
            file.write_all_at(&zeros[..n], at)
                .map_err(|e| fail("cannot preallocate", e))?;
            if let Some(w) = &watched {
                w.wrote(at, &zeros[..n]);
            }
            at += n as u64;
        }
        check_io(faults).map_err(|e| fail("cannot sync", e))?;
        timed_sync(JOURNAL_METRIC, || file.sync_all()).map_err(|e| fail("cannot sync", e))?;
        if let Some(w) = &watched {
            w.synced();
        }
    }
    Ok(SegmentFile {
        file,
        location,
        watched,
    })
}

/// The first LSN of the segment's cycle, if its header is valid.
fn read_segment_header(s: &SegmentFile, faults: &FaultSwitch) -> Result<Option<u64>, BackendFailure> {
    let mut h = [0u8; SEGMENT_HEADER];
    check_io(faults)
        .and_then(|()| s.file.read_exact_at(&mut h, 0))
        .map_err(|e| io_failure(&s.location, "cannot read", &e))?;
    let magic = be_u32(&h, 0);
    let first = be_u64(&h, 4);
    let crc = be_u32(&h, 12);
    Ok((magic == SEGMENT_MAGIC && crc == crc32(h.get(..12).unwrap_or_default()) && first > 0).then_some(first))
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b.get(at..at + 4).and_then(|s| s.try_into().ok()).unwrap_or_default())
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b.get(at..at + 8).and_then(|s| s.try_into().ok()).unwrap_or_default())
}

struct Header {
    stage: Stage,
    lsn: u64,
    len: usize,
}

/// A valid frame header at `at` (known magic, CRC, length inside `limit`), if any.
fn header_at(
    file: &File,
    location: &str,
    faults: &FaultSwitch,
    at: u64,
    limit: u64,
) -> Result<Option<Header>, BackendFailure> {
    if at + FRAME_HEADER as u64 > limit {
        return Ok(None);
    }
    let mut h = [0u8; FRAME_HEADER];
    read_at(file, location, faults, &mut h, at)?;
    let Some(stage) = Stage::from_magic(be_u32(&h, 0)) else {
        return Ok(None);
    };
    if be_u32(&h, 16) != crc32(h.get(..16).unwrap_or_default()) {
        return Ok(None);
    }
    let len = be_u32(&h, 12) as usize;
    if at + (FRAME_HEADER + len) as u64 > limit {
        return Ok(None);
    }
    Ok(Some(Header {
        stage,
        lsn: be_u64(&h, 4),
        len,
    }))
}

fn read_at(file: &File, location: &str, faults: &FaultSwitch, buf: &mut [u8], at: u64) -> Result<(), BackendFailure> {
    check_io(faults)
        .and_then(|()| file.read_exact_at(buf, at))
        .map_err(|e| io_failure(location, "cannot read", &e))
}

/// The frames of `file` from `start` (up to `limit`, or its length) whose LSNs are
/// consecutive, starting with `first` if given; see the module docs for where it ends.
fn scan_file(
    file: &File,
    location: &str,
    faults: &FaultSwitch,
    start: u64,
    limit: Option<u64>,
    first: Option<u64>,
) -> Result<Scan, BackendFailure> {
    let limit = match limit {
        Some(l) => l,
        None => file
            .metadata()
            .map_err(|e| io_failure(location, "cannot stat", &e))?
            .len(),
    };
    let mut scan = Scan {
        frames: Vec::new(),
        damaged: Vec::new(),
        end: start,
    };
    let mut at = start;
    let mut prev: Option<u64> = None;
    while let Some(h) = header_at(file, location, faults, at, limit)? {
        let expected = match prev {
            Some(p) => Some(p + 1),
            None => first,
        };
        if expected.is_some_and(|e| h.lsn != e) {
            break;
        }
        let mut payload = vec![0u8; h.len];
        read_at(file, location, faults, &mut payload, at + FRAME_HEADER as u64)?;
        let next = at + (FRAME_HEADER + h.len) as u64;
        if unseal(&payload).is_err() {
            // Torn (the crash hit its write) unless its successor exists.
            match header_at(file, location, faults, next, limit)? {
                Some(n) if n.lsn == h.lsn + 1 => scan.damaged.push(Damage {
                    stage: h.stage,
                    lsn: h.lsn,
                    location: format!("{location} offset {at}"),
                }),
                _ => break,
            }
        } else {
            scan.frames.push(Frame {
                stage: h.stage,
                lsn: h.lsn,
                payload,
            });
        }
        prev = Some(h.lsn);
        at = next;
        scan.end = at;
    }
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::seal;

    fn fresh() -> (tempfile::TempDir, DataDir, Arc<Journal>) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::open(tmp.path()).unwrap();
        let j = Journal::open(&dir).unwrap();
        (tmp, dir, j)
    }

    fn payload(n: usize, fill: u8) -> Vec<u8> {
        seal(vec![fill; n])
    }

    fn append(j: &Journal, stage: Stage, n: usize) -> u64 {
        let lsn = j.try_append(stage, &payload(n, stage as u8)).unwrap().unwrap();
        j.sync(lsn).unwrap();
        lsn
    }

    fn lsns(frames: &[Frame]) -> Vec<u64> {
        frames.iter().map(|f| f.lsn).collect()
    }

    /// Reopen the journal of `dir` as a new process would (the old one dropped first).
    fn reopen(dir: &DataDir, j: Arc<Journal>) -> Arc<Journal> {
        drop(j);
        Journal::open(dir).unwrap()
    }

    fn damage(dir: &DataDir, seg: usize, at: u64) {
        let f = OpenOptions::new()
            .write(true)
            .open(dir.path().join(JOURNAL_FILES[seg]))
            .unwrap();
        f.write_all_at(&[0xA5; 3], at).unwrap();
    }

    #[test]
    fn new_segments_are_preallocated_and_empty() {
        let (_tmp, dir, j) = fresh();
        for name in JOURNAL_FILES {
            assert_eq!(std::fs::metadata(dir.path().join(name)).unwrap().len(), PREALLOCATE);
        }
        assert!(j.register(Stage::Pending, 0).unwrap().is_empty());
    }

    #[test]
    fn each_stage_reads_back_its_own_frames_in_order() {
        let (_tmp, dir, j) = fresh();
        let p1 = append(&j, Stage::Pending, 10);
        let q = append(&j, Stage::RouterQueue, 3000);
        let p2 = append(&j, Stage::Pending, 1);
        let w = append(&j, Stage::RoutedWork, 50);
        let j = reopen(&dir, j);
        let pending = j.register(Stage::Pending, 0).unwrap();
        assert_eq!(lsns(&pending), [p1, p2]);
        assert_eq!(pending[1].payload, payload(1, Stage::Pending as u8));
        assert_eq!(lsns(&j.register(Stage::RouterQueue, 0).unwrap()), [q]);
        assert_eq!(lsns(&j.register(Stage::RoutedWork, 0).unwrap()), [w]);
        // Only the frames the store file does not hold.
        assert_eq!(lsns(&j.register(Stage::Pending, p1).unwrap()), [p2]);
    }

    #[test]
    fn frames_appended_together_share_one_fdatasync() {
        let (_tmp, _dir, j) = fresh();
        let lsns: Vec<u64> = Stage::ALL
            .into_iter()
            .map(|s| j.try_append(s, &payload(100, 1)).unwrap().unwrap())
            .collect();
        j.sync(lsns[0]).unwrap();
        assert_eq!(j.flushes(), 1);
        // The other two were synced by the same flush: waiting for them syncs nothing.
        j.sync(lsns[1]).unwrap();
        j.sync(lsns[2]).unwrap();
        assert_eq!(j.flushes(), 1);
        // And threads appending while one flushes share the next.
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let j = j.clone();
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        append(&j, Stage::ALL[i % 3], 100);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert!(j.flushes() < 1 + 400, "{} flushes for 400 frames", j.flushes());
    }

    #[test]
    fn a_torn_last_frame_ends_the_segment() {
        let (_tmp, dir, j) = fresh();
        append(&j, Stage::Pending, 100);
        append(&j, Stage::Pending, 100);
        let (seg, _, end) = j.active_segment();
        let last = append(&j, Stage::Pending, 100);
        let j = reopen(&dir, j);
        damage(&dir, seg, end + FRAME_HEADER as u64 + 50);
        let j = reopen(&dir, j);
        let frames = j.register(Stage::Pending, 0).unwrap();
        assert_eq!(
            frames.len(),
            2,
            "the torn frame was never synced, so never acknowledged"
        );
        assert!(frames.iter().all(|f| f.lsn < last));
    }

    #[test]
    fn a_damaged_frame_with_a_valid_successor_is_corruption_for_its_stage_only_if_uncovered() {
        let (_tmp, dir, j) = fresh();
        append(&j, Stage::Pending, 100);
        let (seg, _, end) = j.active_segment();
        let damaged = append(&j, Stage::RouterQueue, 100);
        append(&j, Stage::Pending, 100);
        let j = reopen(&dir, j);
        damage(&dir, seg, end + FRAME_HEADER as u64 + 50);
        let j = reopen(&dir, j);
        let err = j.register(Stage::RouterQueue, 0).unwrap_err();
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        assert!(
            err.location.contains("journal.") && err.location.contains("offset"),
            "{err}"
        );
        assert!(err.to_string().contains(&format!("frame {damaged}")), "{err}");
        // The router-queue file already holding it: not a loss, and the frames after
        // it are still read.
        assert!(j.register(Stage::RouterQueue, damaged).unwrap().is_empty());
        assert_eq!(j.register(Stage::Pending, 0).unwrap().len(), 2);
    }

    #[test]
    fn a_frame_whose_sync_failed_is_not_read_back_and_the_next_frames_start_a_new_cycle() {
        let (_tmp, dir, j) = fresh();
        append(&j, Stage::Pending, 100);
        let (seg, _, _) = j.active_segment();
        j.faults().sync.store(true, Ordering::Relaxed);
        let lsn = j.try_append(Stage::Pending, &payload(100, 3)).unwrap().unwrap();
        let err = j.sync(lsn).unwrap_err();
        assert!(err.to_string().contains("fdatasync"), "{err}");
        assert!(j.sync(lsn).is_err(), "its waiters all hear of the failure");
        j.faults().sync.store(false, Ordering::Relaxed);
        // The other segment holds nothing of any stage: the next frame starts a cycle there.
        let next = append(&j, Stage::Pending, 100);
        let (now, first, _) = j.active_segment();
        assert_ne!(now, seg);
        assert_eq!(first, next);
        let j = reopen(&dir, j);
        let read = lsns(&j.register(Stage::Pending, 0).unwrap());
        assert!(!read.contains(&lsn), "{read:?}");
        assert!(read.contains(&next), "{read:?}");
    }

    #[test]
    fn a_failed_journal_takes_no_frames_until_a_new_cycle_can_start() {
        let (_tmp, _dir, j) = fresh();
        j.register(Stage::Pending, 0).unwrap();
        // Fill the first cycle's segment, then fail a flush while the other segment
        // still holds uncovered frames of the stage.
        append(&j, Stage::Pending, 100);
        j.set_switch(1, Duration::from_secs(3600));
        j.tick_now();
        let in_second = append(&j, Stage::Pending, 100);
        j.faults().io.store(true, Ordering::Relaxed);
        let lsn = j.try_append(Stage::Pending, &payload(10, 0)).unwrap().unwrap();
        assert!(j.sync(lsn).is_err());
        j.faults().io.store(false, Ordering::Relaxed);
        assert!(
            j.try_append(Stage::Pending, &payload(10, 0)).unwrap().is_none(),
            "the stage must checkpoint first"
        );
        let checkpoint = j.checkpoint_lsn();
        assert!(checkpoint >= lsn, "the checkpoint covers the failed frame's LSN");
        assert!(checkpoint >= in_second);
        j.checkpointed(Stage::Pending, checkpoint);
        let next = append(&j, Stage::Pending, 10);
        assert!(next > checkpoint, "LSNs are never reused");
    }

    #[test]
    fn a_switch_waits_until_every_stage_checkpointed_past_the_other_segment() {
        let (_tmp, _dir, j) = fresh();
        j.register(Stage::Pending, 0).unwrap();
        j.register(Stage::RoutedWork, 0).unwrap();
        let p = append(&j, Stage::Pending, 10);
        let w = append(&j, Stage::RoutedWork, 10);
        let (first_seg, _, _) = j.active_segment();
        j.set_switch(1, Duration::from_secs(3600));
        // The other segment is empty: a switch is asked for and the next flush makes it.
        j.tick_now();
        append(&j, Stage::Pending, 10);
        let (second_seg, _, _) = j.active_segment();
        assert_ne!(second_seg, first_seg);
        // Back to the first segment only once both stages checkpointed past it.
        j.tick_now();
        append(&j, Stage::Pending, 10);
        assert_eq!(j.active_segment().0, second_seg, "both stages hold frames there");
        j.checkpointed(Stage::Pending, p);
        j.tick_now();
        append(&j, Stage::Pending, 10);
        assert_eq!(j.active_segment().0, second_seg, "routed-work still does");
        j.checkpointed(Stage::RoutedWork, w);
        j.tick_now();
        append(&j, Stage::Pending, 10);
        assert_eq!(j.active_segment().0, first_seg);
    }

    #[test]
    fn a_crash_during_a_switch_that_kept_the_old_header_is_not_corruption() {
        let (_tmp, dir, j) = fresh();
        let a = append(&j, Stage::Pending, 100);
        let (seg, _, _) = j.active_segment();
        let b = append(&j, Stage::Pending, 100);
        let j = reopen(&dir, j);
        // The new cycle's write reached the first frame's payload but not the header
        // before the crash: the old cycle's header and frames stay, the first damaged.
        damage(&dir, seg, (SEGMENT_HEADER + FRAME_HEADER + 50) as u64);
        let j = reopen(&dir, j);
        // The pending file holds both (the segment was reclaimable before its reuse).
        assert!(j.register(Stage::Pending, b).unwrap().is_empty());
        assert!(a < b);
    }

    #[test]
    fn a_damaged_segment_header_hides_no_frames() {
        let (_tmp, dir, j) = fresh();
        let a = append(&j, Stage::RoutedWork, 100);
        let (seg, _, _) = j.active_segment();
        let b = append(&j, Stage::RoutedWork, 100);
        let j = reopen(&dir, j);
        damage(&dir, seg, 4);
        let j = reopen(&dir, j);
        assert_eq!(lsns(&j.register(Stage::RoutedWork, 0).unwrap()), [a, b]);
    }

    #[test]
    fn a_file_ahead_of_the_journal_starts_a_new_cycle_so_lsns_stay_consecutive() {
        let (_tmp, dir, j) = fresh();
        j.register(Stage::Pending, 0).unwrap();
        let a = append(&j, Stage::Pending, 10);
        // A routed-work file recording an LSN the journal has not reached.
        assert!(j.register(Stage::RoutedWork, a + 10).unwrap().is_empty());
        let b = append(&j, Stage::Pending, 10);
        assert!(b > a + 10, "LSNs go on after the file's");
        let j = reopen(&dir, j);
        assert_eq!(lsns(&j.register(Stage::Pending, 0).unwrap()), [a, b]);
    }
}
