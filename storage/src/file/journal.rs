//! The pending stage's admission journal (`<dir>/pending.journal`).
//!
//! # Why a journal in front of redb
//!
//! An acknowledgement waits for the commit that stores it, and a client arriving during
//! a commit waits for that one and then its own, so the commit's duration is paid about
//! one and a half times by every client. A durable redb commit with quick-repair is two
//! `fdatasync`s plus the page writes (1–1.5 ms here, several times that on a busy
//! machine), and redb has one writer, so commits cannot overlap. Appending one frame to
//! a preallocated file and calling `fdatasync` is about 0.1 ms here: overwriting blocks
//! that already exist changes no file metadata, so the sync writes only the data.
//!
//! So a pending commit is applied to redb with `Durability::None` (visible to readers
//! at once, durable only at the next durable commit) and made durable by a journal frame
//! holding exactly what it changed, written and synced before the commit returns. Every
//! so often a commit runs with `Durability::Immediate` instead — a *checkpoint*, which
//! makes everything before it durable in redb — and the journal starts over at offset 0.
//!
//! # Recovery
//!
//! Every frame carries a log sequence number (LSN); every redb commit of the pending
//! stage stores the LSN it corresponds to (`meta.journal_lsn`). After a crash redb is
//! back at its last durable commit, whose LSN says which frames it already contains;
//! the frames after it are applied again in order, with exactly the decisions the live
//! process made (which records were admitted, not the limits that decided it), so the
//! replayed state is the state that was acknowledged. The same recovery runs when the
//! store file is reopened after an I/O failure, before any reader sees the file.
//!
//! # Frame format
//!
//! `magic u32 | lsn u64 | len u32 | crc32(previous 16 bytes) u32 | payload (len bytes)`,
//! big-endian; the payload is a sealed envelope (its own CRC-32 trailer). A scan starts
//! at offset 0 and follows frames whose LSNs are consecutive. It ends at a frame that is
//! not one: zeros of the preallocation, a frame of an earlier cycle (its LSN is lower:
//! LSNs never repeat), or a frame torn by the crash (never synced, so never
//! acknowledged). A damaged frame *followed by* its valid successor is not a torn tail —
//! the successor was written after it was synced — and stops the open as corrupt, unless
//! that successor is already in the store file (an old cycle's frame under a torn first
//! frame of the new one). A frame whose write or sync failed was refused to its clients:
//! its header is cleared (best effort) and this process's scans stop before it, so it is
//! not applied later either. A synced frame whose redb commit then fails is
//! acknowledged; no write proceeds on redb's state until a reopen has applied it.
//!
//! Not detected: a damaged *header* in the middle of the journal ends the scan there (a
//! frame's length is only known from its header). Frames live until the next checkpoint,
//! a second or so, which is the window such damage would have to hit.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::{FaultSwitch, check_io, check_space, timed_sync};
use super::dir::{DataDir, PENDING_JOURNAL_FILE, io_failure};
use crate::envelope::{crc32, unseal};
use crate::error::{BackendFailure, FailureKind};

const MAGIC: u32 = 0x534A_4E31; // "SJN1"
const HEADER: usize = 20;
/// Zeros written when the journal is created: appends then overwrite existing blocks.
/// Well above [`CHECKPOINT_BYTES`], so the file only grows for a single huge commit.
pub(crate) const PREALLOCATE: u64 = 32 << 20;
/// A checkpoint is due when the journal holds this much (replay after a crash stays
/// short: about 25,000 typical records).
pub(crate) const CHECKPOINT_BYTES: u64 = 8 << 20;
/// ... or when the oldest frame not checkpointed is this old (bounds the pages redb
/// keeps unsynced, and replay time at low rates).
pub(crate) const CHECKPOINT_AFTER: Duration = Duration::from_secs(1);
/// A quiet writer checkpoints only a journal holding at least this much (about 800
/// typical records).
pub(crate) const IDLE_CHECKPOINT_BYTES: u64 = 256 << 10;

/// One frame read back by [`Journal::scan`].
#[derive(Debug)]
pub(crate) struct Frame {
    pub lsn: u64,
    pub payload: Vec<u8>,
}

/// The open journal. Owned by the pending store behind a mutex; frames are appended
/// only inside a pending write transaction, so frame order is redb's commit order.
pub(crate) struct Journal {
    file: File,
    location: String,
    faults: Arc<FaultSwitch>,
    /// Where the next frame goes.
    pos: u64,
    /// The LSN the next frame (or checkpoint) takes. LSNs are never reused, not even
    /// one whose frame failed to write.
    next_lsn: u64,
    /// The LSN of a frame whose write or sync failed. What the file holds from `pos` on
    /// is unknown, so nothing is appended until a checkpoint has restarted the journal;
    /// the frame was refused to its clients, so a scan in this process stops before it
    /// even if its bytes reached the file.
    failed_lsn: Option<u64>,
    /// A synced frame whose redb commit has not succeeded (yet): until a recovery has
    /// applied it, no other write may build on redb's state without it.
    unapplied: Option<u64>,
    /// When the first frame after the last checkpoint was written.
    since: Option<Instant>,
    /// When a checkpoint is due ([`CHECKPOINT_BYTES`], [`CHECKPOINT_AFTER`]; tests
    /// lower them).
    checkpoint_bytes: u64,
    checkpoint_after: Duration,
}

impl Journal {
    /// Open (creating and preallocating if needed) the journal of `dir`. The position
    /// and next LSN are set by [`restart`](Self::restart) once recovery has run.
    pub(crate) fn open(dir: &DataDir, faults: Arc<FaultSwitch>) -> Result<Journal, BackendFailure> {
        let path = dir.pending_journal_path();
        let location = path.display().to_string();
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| io_failure(&location, "cannot open", &e))?;
        let journal = Journal {
            file,
            location,
            faults,
            pos: 0,
            next_lsn: 1,
            failed_lsn: None,
            unapplied: None,
            since: None,
            checkpoint_bytes: CHECKPOINT_BYTES,
            checkpoint_after: CHECKPOINT_AFTER,
        };
        journal.preallocate(&path)?;
        if !existed {
            dir.sync()?;
        }
        Ok(journal)
    }

    fn preallocate(&self, path: &Path) -> Result<(), BackendFailure> {
        let fail = |what: &str, e: std::io::Error| io_failure(&self.location, what, &e);
        let len = std::fs::metadata(path).map_err(|e| fail("cannot stat", e))?.len();
        if len >= PREALLOCATE {
            return Ok(());
        }
        check_space(&self.faults).map_err(|e| fail("cannot preallocate", e))?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = len;
        while at < PREALLOCATE {
            let n = zeros
                .len()
                .min(usize::try_from(PREALLOCATE - at).unwrap_or(zeros.len()));
            self.file
                .write_all_at(&zeros[..n], at)
                .map_err(|e| fail("cannot preallocate", e))?;
            at += n as u64;
        }
        check_io(&self.faults).map_err(|e| fail("cannot sync", e))?;
        timed_sync(PENDING_JOURNAL_FILE, || self.file.sync_all()).map_err(|e| fail("cannot sync", e))
    }

    pub(crate) fn location(&self) -> &str {
        &self.location
    }

    /// The frames from offset 0 with consecutive LSNs (see the module docs for where a
    /// scan ends and what stops it as corrupt). `applied` is the LSN the store file
    /// holds: a damaged frame whose successor is at or below it is an old cycle's,
    /// overwritten by a torn write, not a loss.
    pub(crate) fn scan(&self, applied: u64) -> Result<Vec<Frame>, BackendFailure> {
        let len = self
            .file
            .metadata()
            .map_err(|e| io_failure(&self.location, "cannot stat", &e))?
            .len();
        let mut frames: Vec<Frame> = Vec::new();
        let mut at = 0u64;
        while let Some(header) = self.header_at(at, len)? {
            if frames.last().is_some_and(|f| header.lsn != f.lsn + 1)
                || self.failed_lsn.is_some_and(|failed| header.lsn >= failed)
            {
                break;
            }
            let mut payload = vec![0u8; header.len];
            self.read_at(&mut payload, at + HEADER as u64)?;
            let next = at + (HEADER + header.len) as u64;
            if unseal(&payload).is_err() {
                // Torn (the crash hit its write) unless its successor exists.
                if self
                    .header_at(next, len)?
                    .is_some_and(|h| h.lsn == header.lsn + 1 && h.lsn > applied)
                {
                    return Err(BackendFailure::new(
                        FailureKind::Corrupt,
                        format!("{} offset {at}", self.location),
                        format!(
                            "journal frame {} is damaged but later frames follow it: acknowledged \
                             admissions would be lost, so the store does not open",
                            header.lsn
                        ),
                    ));
                }
                break;
            }
            frames.push(Frame {
                lsn: header.lsn,
                payload,
            });
            at = next;
        }
        Ok(frames)
    }

    /// A valid frame header at `at` (magic, CRC, length inside the file), if any.
    fn header_at(&self, at: u64, len: u64) -> Result<Option<Header>, BackendFailure> {
        if at + HEADER as u64 > len {
            return Ok(None);
        }
        let mut h = [0u8; HEADER];
        self.read_at(&mut h, at)?;
        let word = |r: std::ops::Range<usize>| h.get(r).unwrap_or_default();
        let magic = u32::from_be_bytes(word(0..4).try_into().unwrap_or_default());
        let lsn = u64::from_be_bytes(word(4..12).try_into().unwrap_or_default());
        let size = u32::from_be_bytes(word(12..16).try_into().unwrap_or_default());
        let crc = u32::from_be_bytes(word(16..20).try_into().unwrap_or_default());
        if magic != MAGIC || crc != crc32(word(0..16)) {
            return Ok(None);
        }
        let size = size as usize;
        if at + (HEADER + size) as u64 > len {
            return Ok(None);
        }
        Ok(Some(Header { lsn, len: size }))
    }

    fn read_at(&self, buf: &mut [u8], at: u64) -> Result<(), BackendFailure> {
        check_io(&self.faults)
            .and_then(|()| self.file.read_exact_at(buf, at))
            .map_err(|e| io_failure(&self.location, "cannot read", &e))
    }

    /// Whether appends are allowed (no failure since the last checkpoint) and no
    /// checkpoint is due yet.
    pub(crate) fn can_append(&self) -> bool {
        self.failed_lsn.is_none()
            && self.pos < self.checkpoint_bytes
            && self.since.is_none_or(|t| t.elapsed() < self.checkpoint_after)
    }

    #[cfg(test)]
    pub(crate) fn set_checkpoints(&mut self, bytes: u64, after: Duration) {
        self.checkpoint_bytes = bytes;
        self.checkpoint_after = after;
    }

    #[cfg(test)]
    pub(crate) fn position(&self) -> u64 {
        self.pos
    }

    /// Take the next LSN for a frame.
    pub(crate) fn take_lsn(&mut self) -> u64 {
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        lsn
    }

    /// The LSN a checkpoint records: the last one taken. A checkpoint has no frame of
    /// its own (a frame appended after it follows the last one with no gap), and a
    /// frame that failed to write is at or below it, so replay never applies it.
    pub(crate) fn checkpoint_lsn(&self) -> u64 {
        self.next_lsn - 1
    }

    /// Write frame `lsn` at the current position and `fdatasync` it. On error the
    /// journal refuses appends until the next checkpoint.
    pub(crate) fn append(&mut self, lsn: u64, payload: &[u8]) -> Result<(), BackendFailure> {
        if self.failed_lsn.is_some() {
            return Err(BackendFailure::new(
                FailureKind::Unavailable,
                self.location.clone(),
                "the journal failed a write and is waiting for a checkpoint",
            ));
        }
        let size = u32::try_from(payload.len()).map_err(|_| {
            BackendFailure::new(
                FailureKind::Unavailable,
                self.location.clone(),
                "one commit is larger than 4 GiB",
            )
        })?;
        let mut frame = Vec::with_capacity(HEADER + payload.len());
        frame.extend_from_slice(&MAGIC.to_be_bytes());
        frame.extend_from_slice(&lsn.to_be_bytes());
        frame.extend_from_slice(&size.to_be_bytes());
        let crc = crc32(&frame);
        frame.extend_from_slice(&crc.to_be_bytes());
        frame.extend_from_slice(payload);
        let written = check_space(&self.faults)
            .and_then(|()| self.file.write_all_at(&frame, self.pos))
            .map_err(|e| io_failure(&self.location, "cannot write", &e))
            .and_then(|()| {
                check_io(&self.faults)
                    .and_then(|()| {
                        if self.faults.sync.load(std::sync::atomic::Ordering::Relaxed) {
                            return Err(std::io::Error::other("injected fdatasync failure"));
                        }
                        timed_sync(PENDING_JOURNAL_FILE, || self.file.sync_data())
                    })
                    .map_err(|e| io_failure(&self.location, "cannot sync", &e))
            });
        match written {
            Ok(()) => {
                self.pos += frame.len() as u64;
                self.since.get_or_insert_with(Instant::now);
                Ok(())
            }
            Err(e) => {
                self.failed_lsn = Some(lsn);
                // Best effort, unsynced: a frame that did reach the page cache must not
                // be replayed after a crash either, and the page cache is what survives
                // one of the process.
                let _ = self.file.write_all_at(&[0u8; HEADER], self.pos);
                Err(e)
            }
        }
    }

    /// A durable redb commit recorded `lsn` ([`checkpoint_lsn`](Self::checkpoint_lsn)):
    /// every frame up to it is in redb, so the journal starts over — unless a frame was
    /// appended after that commit (a concurrent commit), in which case the frames stay,
    /// consecutive as they are, until the next checkpoint.
    pub(crate) fn checkpointed(&mut self, lsn: u64) {
        if self.next_lsn == lsn + 1 {
            self.restart(lsn + 1);
        }
    }

    /// Start over at offset 0 with `next_lsn` (after recovery or a checkpoint).
    pub(crate) fn restart(&mut self, next_lsn: u64) {
        self.pos = 0;
        self.next_lsn = next_lsn;
        self.failed_lsn = None;
        self.unapplied = None;
        self.since = None;
    }

    /// Frame `lsn` is synced; its redb commit follows.
    pub(crate) fn applying(&mut self, lsn: u64) {
        self.unapplied = Some(lsn);
    }

    /// Before any write: `recorded` is the LSN the store file holds in this
    /// transaction. Refuses while the last synced frame is not in it (its redb commit
    /// failed and no reopen has applied it yet): a write on that state would diverge
    /// from the journal.
    pub(crate) fn check_applied(&mut self, recorded: u64) -> Result<(), BackendFailure> {
        match self.unapplied {
            Some(lsn) if recorded < lsn => Err(BackendFailure::new(
                FailureKind::Unavailable,
                self.location.clone(),
                format!("journal frame {lsn} is waiting to be applied by a reopen of the store"),
            )),
            _ => {
                self.unapplied = None;
                Ok(())
            }
        }
    }

    /// Whether a checkpoint while idle is worth its two fdatasyncs: enough frames that
    /// the checkpoint a later commit would do inline is a big one, or a failed write to
    /// clear. At a trickle of traffic the inline time checkpoint stays small anyway.
    pub(crate) fn wants_idle_checkpoint(&self) -> bool {
        self.pos >= IDLE_CHECKPOINT_BYTES || self.failed_lsn.is_some()
    }

    pub(crate) fn next_lsn(&self) -> u64 {
        self.next_lsn
    }
}

struct Header {
    lsn: u64,
    len: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::seal;

    fn open(dir: &DataDir) -> Journal {
        open_with(dir, Arc::new(FaultSwitch::default()))
    }

    fn open_with(dir: &DataDir, faults: Arc<FaultSwitch>) -> Journal {
        let mut j = Journal::open(dir, faults).unwrap();
        j.restart(1);
        j
    }

    /// A fresh journal in a directory of its own (kept alive by the returned guard).
    fn fresh() -> (tempfile::TempDir, DataDir, Journal) {
        let (tmp, dir, j, _) = fresh_with_faults();
        (tmp, dir, j)
    }

    /// [`fresh`], with fault switches the test throws.
    fn fresh_with_faults() -> (tempfile::TempDir, DataDir, Journal, Arc<FaultSwitch>) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::open(tmp.path()).unwrap();
        let faults = Arc::new(FaultSwitch::default());
        let j = open_with(&dir, faults.clone());
        (tmp, dir, j, faults)
    }

    fn payload(n: usize, fill: u8) -> Vec<u8> {
        seal(vec![fill; n])
    }

    /// Append frames of the given payload sizes; returns each frame's offset.
    fn append_all(j: &mut Journal, sizes: &[usize]) -> Vec<u64> {
        sizes
            .iter()
            .map(|&n| {
                let at = j.pos;
                let lsn = j.take_lsn();
                j.append(lsn, &payload(n, lsn as u8)).unwrap();
                at
            })
            .collect()
    }

    fn lsns(j: &Journal) -> Vec<u64> {
        lsns_after(j, 0)
    }

    fn lsns_after(j: &Journal, applied: u64) -> Vec<u64> {
        j.scan(applied).unwrap().iter().map(|f| f.lsn).collect()
    }

    fn damage(dir: &DataDir, at: u64) {
        let f = OpenOptions::new().write(true).open(dir.pending_journal_path()).unwrap();
        f.write_all_at(&[0xA5; 3], at).unwrap();
    }

    #[test]
    fn a_new_journal_is_preallocated_and_empty() {
        let (_tmp, dir, j) = fresh();
        assert_eq!(
            std::fs::metadata(dir.pending_journal_path()).unwrap().len(),
            PREALLOCATE
        );
        assert!(j.scan(0).unwrap().is_empty());
    }

    #[test]
    fn frames_read_back_in_order_with_their_payloads() {
        let (_tmp, dir, mut j) = fresh();
        append_all(&mut j, &[10, 3000, 1]);
        drop(j);
        let j = open(&dir);
        let frames = j.scan(0).unwrap();
        assert_eq!(frames.iter().map(|f| f.lsn).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(frames[1].payload, payload(3000, 2));
    }

    #[test]
    fn a_torn_last_frame_ends_the_journal() {
        let (_tmp, dir, mut j) = fresh();
        let at = append_all(&mut j, &[100, 100, 100]);
        damage(&dir, at[2] + HEADER as u64 + 50);
        assert_eq!(
            lsns(&j),
            [1, 2],
            "the torn frame was never synced, so never acknowledged"
        );
    }

    #[test]
    fn a_damaged_frame_with_a_valid_successor_is_corruption_not_a_torn_tail() {
        let (_tmp, dir, mut j) = fresh();
        let at = append_all(&mut j, &[100, 100, 100]);
        damage(&dir, at[1] + HEADER as u64 + 50);
        let err = j.scan(0).unwrap_err();
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
        assert!(err.location.contains("pending.journal"), "{err}");
        assert!(err.to_string().contains("frame 2"), "{err}");
    }

    #[test]
    fn a_torn_first_frame_over_an_old_cycle_is_not_corruption() {
        let (_tmp, dir, mut j) = fresh();
        let at = append_all(&mut j, &[100, 100, 100]);
        // A crash tore the next cycle's first frame: its header never reached the disk,
        // a later sector did, so frame 1's header is intact over a damaged payload and
        // old frame 2 follows it. Frames up to 3 are in the store file.
        damage(&dir, at[0] + HEADER as u64 + 50);
        assert!(lsns_after(&j, 3).is_empty(), "an old cycle, not a loss");
        let err = j.scan(0).unwrap_err();
        assert_eq!(err.kind, FailureKind::Corrupt, "{err}");
    }

    #[test]
    fn a_frame_whose_sync_failed_is_not_read_back() {
        let (_tmp, dir, mut j, faults) = fresh_with_faults();
        append_all(&mut j, &[100, 100]);
        faults.sync.store(true, std::sync::atomic::Ordering::Relaxed);
        let lsn = j.take_lsn();
        assert!(j.append(lsn, &payload(100, 3)).is_err());
        faults.sync.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(lsns(&j), [1, 2], "this process knows frame 3 failed");
        drop(j);
        // Neither does the next process read it: its header was cleared.
        let j = open(&dir);
        assert_eq!(lsns(&j), [1, 2]);
    }

    #[test]
    fn frames_of_an_earlier_cycle_are_not_read_after_a_restart() {
        let (_tmp, _dir, mut j) = fresh();
        // Same-size frames: the new cycle's end meets an old frame boundary exactly.
        append_all(&mut j, &[200, 200, 200, 200]);
        j.checkpointed(j.checkpoint_lsn());
        assert_eq!(j.pos, 0);
        append_all(&mut j, &[200]);
        assert_eq!(
            lsns(&j),
            [5],
            "old frame 2 follows frame 5 on disk but is not its successor"
        );
        // A shorter frame leaves the old one's middle behind it.
        append_all(&mut j, &[20]);
        assert_eq!(lsns(&j), [5, 6]);
    }

    #[test]
    fn a_checkpoint_keeps_the_frames_a_later_commit_appended() {
        let (_tmp, _dir, mut j) = fresh();
        append_all(&mut j, &[50, 50]);
        let checkpoint = j.checkpoint_lsn();
        append_all(&mut j, &[50]); // a commit that ran before the checkpoint returned
        j.checkpointed(checkpoint);
        append_all(&mut j, &[50]);
        assert_eq!(lsns(&j), [1, 2, 3, 4], "frame 3 is not in redb's durable state yet");
        j.checkpointed(j.checkpoint_lsn());
        assert_eq!(j.pos, 0);
    }

    #[test]
    fn a_failed_append_refuses_appends_until_a_checkpoint_and_never_reuses_its_lsn() {
        let (_tmp, _dir, mut j, faults) = fresh_with_faults();
        append_all(&mut j, &[10]);
        faults.io.store(true, std::sync::atomic::Ordering::Relaxed);
        let lsn = j.take_lsn();
        assert!(j.append(lsn, &payload(10, 0)).is_err());
        faults.io.store(false, std::sync::atomic::Ordering::Relaxed);
        assert!(!j.can_append(), "a failed journal waits for a checkpoint");
        assert!(j.append(j.next_lsn(), &payload(10, 0)).is_err());
        assert_eq!(j.checkpoint_lsn(), 2, "the checkpoint covers the failed frame's LSN");
        j.checkpointed(2);
        assert!(j.can_append());
        assert_eq!(j.take_lsn(), 3);
    }

    #[test]
    fn a_synced_frame_not_in_the_store_file_blocks_writes_until_it_is() {
        let (_tmp, _dir, mut j) = fresh();
        j.applying(5);
        let err = j.check_applied(4).unwrap_err();
        assert!(err.to_string().contains("frame 5"), "{err}");
        assert!(j.check_applied(4).is_err(), "still blocked");
        j.check_applied(5).unwrap();
        j.check_applied(0).unwrap();
    }

    #[test]
    fn a_checkpoint_is_due_by_size() {
        let (_tmp, _dir, mut j) = fresh();
        assert!(j.can_append());
        let big = usize::try_from(CHECKPOINT_BYTES).unwrap();
        append_all(&mut j, &[big]);
        assert!(!j.can_append());
    }
}
