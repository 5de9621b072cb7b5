//! The gateway's resident memory and open file descriptors, from `/proc`, per incarnation
//! (one incarnation = one process between two restarts).

use std::fmt::Write as _;
use std::fs;
use std::io;

/// One reading.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcSample {
    /// Seconds since the load started (negative: before it).
    pub t: f64,
    /// `VmRSS` in KiB.
    pub rss_kb: u64,
    /// Entries in `/proc/<pid>/fd`.
    pub fds: u64,
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
}

impl RssVerdict {
    pub fn flat(&self) -> bool {
        self.growth_pct <= self.bound_pct
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
    let window: Vec<u64> = inc
        .samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .map(|s| s.rss_kb)
        .collect();
    if window.len() < 4 {
        return None;
    }
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
        let mut inc = Incarnation::new(1, 1, 0.0);
        inc.samples = rss
            .iter()
            .enumerate()
            .map(|(i, r)| ProcSample {
                t: i as f64 * 10.0,
                rss_kb: *r,
                fds: 10,
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
    fn reads_this_process() {
        let (rss, fds) = read(std::process::id()).unwrap();
        assert!(rss > 0 && fds > 0);
    }
}
