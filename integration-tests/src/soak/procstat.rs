//! The gateway's resident memory and open file descriptors, from `/proc`, per incarnation
//! (one incarnation = one process between two restarts).

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::Path;

use sendium_storage::file::dir::{DLR_FILE, PENDING_FILE, ROUTED_WORK_FILE, ROUTER_QUEUE_FILE};
use sendium_storage::file::{FileDlrStore, FileOptions};

/// One reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// Seconds since the load started (negative: before it).
    pub t: f64,
    /// `VmRSS` in KiB.
    pub rss_kb: u64,
    /// Entries in `/proc/<pid>/fd`.
    pub fds: u64,
    /// What the stores' redb page caches may hold at this reading (KiB): see
    /// [`store_caches_kb`].
    pub caches_kb: u64,
}

/// The store files of the data directory and the page cache each one's store keeps.
const STORE_CACHES: [(&str, usize); 4] = [
    (PENDING_FILE, FileOptions::PENDING_CACHE),
    (ROUTER_QUEUE_FILE, FileOptions::STAGE_CACHE),
    (ROUTED_WORK_FILE, FileOptions::STAGE_CACHE),
    (DLR_FILE, FileDlrStore::CACHE),
];

/// What the stores' page caches may hold (KiB): each store file's size, up to its
/// cache's bound. A cache fills as its file grows (the DLR store keeps every track for
/// its retention, so `dlr.redb` grows through a whole soak), which RSS shows without
/// anything leaking.
pub fn store_caches_kb(data_dir: &Path) -> u64 {
    STORE_CACHES
        .iter()
        .map(|(name, bound)| {
            let len = fs::metadata(data_dir.join(name)).map_or(0, |m| m.len());
            len.min(*bound as u64) / 1024
        })
        .sum()
}

/// `VmRSS` (KiB) and the number of open descriptors of `pid`.
pub fn read(pid: u32) -> io::Result<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no VmRSS in /proc/{pid}/status")))?;
    let fds = fs::read_dir(format!("/proc/{pid}/fd"))?.count() as u64;
    Ok((rss_kb, fds))
}

/// One gateway process.
#[derive(Debug, Clone)]
pub struct Incarnation {
    /// 1 for the first start.
    pub number: u32,
    pub pid: u32,
    /// Seconds since the load started when it became ready.
    pub started: f64,
    /// Quiet reading after the restart, once the ESMEs were bound again and before the
    /// traffic resumed.
    pub start: Option<ProcSample>,
    /// Every periodic reading.
    pub samples: Vec<ProcSample>,
    /// The last reading: just before the SIGKILL, or after the drain for the last one.
    pub end: Option<ProcSample>,
    pub killed: bool,
}

impl Incarnation {
    pub fn new(number: u32, pid: u32, started: f64) -> Incarnation {
        Incarnation {
            number,
            pid,
            started,
            start: None,
            samples: Vec::new(),
            end: None,
            killed: false,
        }
    }

    fn all(&self) -> impl Iterator<Item = &ProcSample> {
        self.start.iter().chain(self.samples.iter()).chain(self.end.iter())
    }

    pub fn max_rss_kb(&self) -> u64 {
        self.all().map(|s| s.rss_kb).max().unwrap_or(0)
    }

    pub fn max_fds(&self) -> u64 {
        self.all().map(|s| s.fds).max().unwrap_or(0)
    }
}

/// RSS of the last incarnation: after its warm-up vs at the end of the load.
#[derive(Debug, Clone)]
pub struct RssVerdict {
    /// The window judged, in seconds since the load started.
    pub from: f64,
    pub to: f64,
    pub samples: usize,
    /// Median of the first three readings of the window (KiB).
    pub after_warmup_kb: u64,
    /// Median of the last three (KiB).
    pub at_end_kb: u64,
    pub max_kb: u64,
    pub growth_pct: f64,
    pub bound_pct: f64,
    /// What the stores' caches may hold at the end (median of the last three readings,
    /// KiB): allowed on top of `bound_pct`.
    pub caches_kb: u64,
}

impl RssVerdict {
    /// The most RSS may reach at the end: the warm-up's plus `bound_pct`, plus what the
    /// stores' caches may hold by then. The caches' share at warm-up is not known (a
    /// restarted process starts them empty), so all of it is allowed: a leak must
    /// outgrow the caches' bounds to be seen.
    pub fn allowed_kb(&self) -> u64 {
        (self.after_warmup_kb as f64 * (1.0 + self.bound_pct / 100.0)) as u64 + self.caches_kb
    }

    pub fn flat(&self) -> bool {
        self.at_end_kb <= self.allowed_kb()
    }
}

fn median3(values: &[u64]) -> u64 {
    let mut v = values.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Judges the readings of `inc` taken between `from` and `to` (seconds since the load
/// started). `None`: fewer than four readings in the window (too short to judge).
pub fn rss_verdict(inc: &Incarnation, from: f64, to: f64, bound_pct: f64) -> Option<RssVerdict> {
    let readings: Vec<&ProcSample> = inc.samples.iter().filter(|s| s.t >= from && s.t <= to).collect();
    if readings.len() < 4 {
        return None;
    }
    let window: Vec<u64> = readings.iter().map(|s| s.rss_kb).collect();
    let caches: Vec<u64> = readings[readings.len() - 3..].iter().map(|s| s.caches_kb).collect();
    let head = &window[..3];
    let tail = &window[window.len() - 3..];
    let after_warmup_kb = median3(head);
    let at_end_kb = median3(tail);
    let growth_pct = if after_warmup_kb == 0 {
        0.0
    } else {
        (at_end_kb as f64 - after_warmup_kb as f64) * 100.0 / after_warmup_kb as f64
    };
    Some(RssVerdict {
        from,
        to,
        samples: window.len(),
        after_warmup_kb,
        at_end_kb,
        max_kb: window.iter().copied().max().unwrap_or(0),
        growth_pct,
        bound_pct,
        caches_kb: median3(&caches),
    })
}

pub fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn cell(sample: Option<&ProcSample>) -> String {
    match sample {
        Some(s) => format!("{:>10} {:>5}", mib(s.rss_kb), s.fds),
        None => format!("{:>10} {:>5}", "-", "-"),
    }
}

/// One line per incarnation: start, end and maximum of RSS and descriptors.
pub fn table(incarnations: &[Incarnation]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  inc  pid      ready@s  {:>10} {:>5}  {:>10} {:>5}  {:>10} {:>5}  samples  ended",
        "start RSS", "fds", "end RSS", "fds", "max RSS", "fds"
    );
    for inc in incarnations {
        let _ = writeln!(
            out,
            "  {:>3}  {:<7}  {:>7.0}  {}  {}  {:>10} {:>5}  {:>7}  {}",
            inc.number,
            inc.pid,
            inc.started,
            cell(inc.start.as_ref()),
            cell(inc.end.as_ref()),
            mib(inc.max_rss_kb()),
            inc.max_fds(),
            inc.samples.len(),
            if inc.killed { "SIGKILL" } else { "end of run" }
        );
    }
    out
}

/// Every reading as CSV: incarnation, pid, kind, t, rss_kb, fds.
pub fn csv(incarnations: &[Incarnation]) -> String {
    let mut out = String::from("incarnation,pid,kind,t_s,rss_kb,fds\n");
    for inc in incarnations {
        let rows = inc
            .start
            .iter()
            .map(|s| ("start", s))
            .chain(inc.samples.iter().map(|s| ("sample", s)))
            .chain(inc.end.iter().map(|s| ("end", s)));
        for (kind, s) in rows {
            let _ = writeln!(
                out,
                "{},{},{kind},{:.1},{},{}",
                inc.number, inc.pid, s.t, s.rss_kb, s.fds
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inc(rss: &[u64]) -> Incarnation {
        with_caches(&rss.iter().map(|r| (*r, 0)).collect::<Vec<_>>())
    }

    /// Readings of (RSS, what the caches may hold), 10 s apart.
    fn with_caches(readings: &[(u64, u64)]) -> Incarnation {
        let mut inc = Incarnation::new(1, 1, 0.0);
        inc.samples = readings
            .iter()
            .enumerate()
            .map(|(i, (rss_kb, caches_kb))| ProcSample {
                t: i as f64 * 10.0,
                rss_kb: *rss_kb,
                fds: 10,
                caches_kb: *caches_kb,
            })
            .collect();
        inc
    }

    #[test]
    fn flat_and_growing() {
        let flat = rss_verdict(&inc(&[100, 100, 100, 110, 105, 100, 102]), 0.0, 100.0, 20.0).unwrap();
        assert!(flat.flat(), "{flat:?}");
        let growing = rss_verdict(&inc(&[100, 100, 100, 130, 140, 150, 160]), 0.0, 100.0, 20.0).unwrap();
        assert!(!growing.flat(), "{growing:?}");
        assert_eq!(growing.at_end_kb, 150);
        assert!(rss_verdict(&inc(&[1, 2, 3]), 0.0, 100.0, 20.0).is_none());
        // The window leaves out the warm-up.
        let windowed = rss_verdict(&inc(&[10, 50, 100, 100, 100, 100]), 15.0, 100.0, 20.0).unwrap();
        assert_eq!(windowed.after_warmup_kb, 100);
    }

    #[test]
    fn the_stores_caches_may_fill_on_top_of_the_bound() {
        // 100 -> 150 KiB is 50%, past 20%; the caches may hold 40 KiB by the end.
        let readings = [
            (100, 0),
            (100, 10),
            (100, 20),
            (130, 30),
            (140, 40),
            (150, 40),
            (150, 40),
        ];
        let v = rss_verdict(&with_caches(&readings), 0.0, 100.0, 20.0).unwrap();
        assert_eq!((v.caches_kb, v.allowed_kb()), (40, 160));
        assert!(v.flat(), "{v:?}");
        // Growth past the caches' bound as well is a leak.
        let readings = [
            (100, 0),
            (100, 10),
            (100, 20),
            (150, 30),
            (170, 40),
            (180, 40),
            (180, 40),
        ];
        let v = rss_verdict(&with_caches(&readings), 0.0, 100.0, 20.0).unwrap();
        assert!(!v.flat(), "{v:?}");
    }

    #[test]
    fn the_caches_are_each_store_file_up_to_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(store_caches_kb(dir.path()), 0, "no files yet");
        std::fs::File::create(dir.path().join("routed-work.redb"))
            .unwrap()
            .set_len(5 << 20)
            .unwrap();
        std::fs::File::create(dir.path().join("dlr.redb"))
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        std::fs::File::create(dir.path().join("journal.0"))
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        // routed-work up to its 2 MiB cache, dlr as large as it is, the journal not at all.
        assert_eq!(
            store_caches_kb(dir.path()),
            (FileOptions::STAGE_CACHE as u64 >> 10) + 1024
        );
    }

    #[test]
    fn reads_this_process() {
        let (rss, fds) = read(std::process::id()).unwrap();
        assert!(rss > 0 && fds > 0);
    }
}
