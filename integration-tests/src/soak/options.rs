//! The soak's command line.

use std::path::PathBuf;
use std::time::Duration;

pub const USAGE: &str = "usage: sendium-soak [--minutes N] [--kill-every DUR|off] [--kill-phase FRACTION]
                    [--smpp-rate MSG_PER_S] [--http-rate MSG_PER_S] [--no-faults] [--fault-every DUR]
                    [--drain DUR] [--warmup DUR] [--rss-growth PCT] [--fd-tolerance N] [--fd-settle DUR]
                    [--sample-every DUR] [--multipart-expiry DUR] [--max-stall DUR] [--seed N] [--out DIR]

Runs the release `sendium` binary ($SENDIUM_BIN, else next to this executable) on the
file/file/file profile with the file DLR store for --minutes under mixed SMPP and HTTP
traffic, provider faults and SIGKILLs, then drains and checks that every acknowledged
message reached the test SMSC, every receipt reached its client, and RSS and open file
descriptors stayed flat. Exit status 0: every check passed; 1: a check failed; 2: usage.

  --minutes N           run time under load (default 10; fractions allowed)
  --kill-every DUR      SIGKILL + restart period during the kill phase (default 3m; off: never)
  --kill-phase F        the fraction of the run in which kills happen (default 0.5): the rest
                        is one incarnation, whose RSS must stay flat
  --smpp-rate R         SMPP messages per second over all sessions (default 90)
  --http-rate R         HTTP messages per second (default 20)
  --no-faults           no provider faults
  --fault-every DUR     how long each fault phase lasts (default 20s)
  --drain DUR           longest wait, after the load, for messages and receipts (default 3m)
  --warmup DUR          RSS warm-up of the last incarnation (default: a quarter of it, at most 2m)
  --rss-growth PCT      allowed RSS growth of the last incarnation after warm-up (default 20)
  --fd-tolerance N      descriptors allowed above the baseline after the drain (default 4)
  --fd-settle DUR       longest wait for the descriptors to come back after the drain (default 240s;
                        idle pooled HTTP connections close after 90s)
  --sample-every DUR    RSS / descriptor sampling period (default 10s)
  --multipart-expiry D  the gateway's [sms] multipart-expiry (default 60s)
  --max-stall DUR       longest time the gateway may acknowledge nothing while the clients send,
                        restarts aside (default 60s)
  --seed N              fault order and traffic mix (default 1)
  --out DIR             where the summary, samples and gateway logs go
                        (default /tmp/sendium-soak-<unix time>)

Durations: 500ms, 30s, 3m, 1h.";

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    pub duration: Duration,
    pub kill_every: Option<Duration>,
    pub kill_phase: f64,
    pub smpp_rate: f64,
    pub http_rate: f64,
    pub faults: bool,
    pub fault_every: Duration,
    pub drain: Duration,
    pub warmup: Option<Duration>,
    pub rss_growth_pct: f64,
    pub fd_tolerance: u64,
    pub fd_settle: Duration,
    pub sample_every: Duration,
    pub multipart_expiry: Duration,
    pub max_stall: Duration,
    pub seed: u64,
    pub out_dir: Option<PathBuf>,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            duration: Duration::from_secs(600),
            kill_every: Some(Duration::from_secs(180)),
            kill_phase: 0.5,
            smpp_rate: 90.0,
            http_rate: 20.0,
            faults: true,
            fault_every: Duration::from_secs(20),
            drain: Duration::from_secs(180),
            warmup: None,
            rss_growth_pct: 20.0,
            fd_tolerance: 4,
            fd_settle: Duration::from_secs(240),
            sample_every: Duration::from_secs(10),
            multipart_expiry: Duration::from_secs(60),
            max_stall: Duration::from_secs(60),
            seed: 1,
            out_dir: None,
        }
    }
}

/// `500ms`, `30s`, `3m`, `1h`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| format!("{s:?} is not a duration"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (ms, s, m, h)")),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(format!("{s:?} is not a duration"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way [`parse_duration`] reads it (for the TOML and the summary).
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(60_000) && ms > 0 {
        format!("{}m", ms / 60_000)
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name}: {value:?} is not a valid number"))
}

impl SoakOptions {
    /// Reads the arguments (without the program name). `Ok(None)`: help was asked for.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<SoakOptions>, String> {
        let mut o = SoakOptions::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                return Ok(None);
            }
            if arg == "--no-faults" {
                o.faults = false;
                continue;
            }
            let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
            match arg.as_str() {
                "--minutes" => {
                    let minutes: f64 = number(&arg, &value)?;
                    if !(minutes > 0.0 && minutes.is_finite()) {
                        return Err("--minutes must be positive".to_owned());
                    }
                    o.duration = Duration::from_secs_f64(minutes * 60.0);
                }
                "--kill-every" => {
                    o.kill_every = match value.as_str() {
                        "off" | "0" | "never" => None,
                        v => Some(parse_duration(v)?).filter(|d| !d.is_zero()),
                    }
                }
                "--kill-phase" => {
                    o.kill_phase = number(&arg, &value)?;
                    if !(0.0..=1.0).contains(&o.kill_phase) {
                        return Err("--kill-phase must be between 0 and 1".to_owned());
                    }
                }
                "--smpp-rate" => o.smpp_rate = number(&arg, &value)?,
                "--http-rate" => o.http_rate = number(&arg, &value)?,
                "--fault-every" => o.fault_every = parse_duration(&value)?,
                "--drain" => o.drain = parse_duration(&value)?,
                "--warmup" => o.warmup = Some(parse_duration(&value)?),
                "--rss-growth" => o.rss_growth_pct = number(&arg, &value)?,
                "--fd-tolerance" => o.fd_tolerance = number(&arg, &value)?,
                "--fd-settle" => o.fd_settle = parse_duration(&value)?,
                "--sample-every" => o.sample_every = parse_duration(&value)?,
                "--multipart-expiry" => o.multipart_expiry = parse_duration(&value)?,
                "--max-stall" => o.max_stall = parse_duration(&value)?,
                "--seed" => o.seed = number(&arg, &value)?,
                "--out" => o.out_dir = Some(PathBuf::from(value)),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        let rates_ok = o.smpp_rate >= 0.0 && o.http_rate >= 0.0 && o.smpp_rate + o.http_rate > 0.0;
        if !rates_ok || !o.smpp_rate.is_finite() || !o.http_rate.is_finite() {
            return Err("--smpp-rate and --http-rate must not be negative, and not both 0".to_owned());
        }
        if o.sample_every < Duration::from_secs(1) {
            return Err("--sample-every must be at least 1s".to_owned());
        }
        if o.fault_every < Duration::from_secs(1) {
            return Err("--fault-every must be at least 1s".to_owned());
        }
        if o.multipart_expiry < Duration::from_secs(5) {
            return Err("--multipart-expiry must be at least 5s".to_owned());
        }
        Ok(Some(o))
    }

    /// When the kills stop (from the start of the load).
    pub fn kill_phase_end(&self) -> Duration {
        self.duration.mul_f64(self.kill_phase)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("3m").unwrap(), Duration::from_secs(180));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("12").unwrap(), Duration::from_secs(12));
        assert!(parse_duration("3x").is_err());
        assert_eq!(format_duration(Duration::from_secs(180)), "3m");
        assert_eq!(format_duration(Duration::from_secs(45)), "45s");
    }

    #[test]
    fn arguments() {
        let args = ["--minutes", "2", "--kill-every", "30s", "--no-faults"].map(String::from);
        let o = SoakOptions::parse(args).unwrap().unwrap();
        assert_eq!(o.duration, Duration::from_secs(120));
        assert_eq!(o.kill_every, Some(Duration::from_secs(30)));
        assert!(!o.faults);
        assert_eq!(o.kill_phase_end(), Duration::from_secs(60));
        assert!(SoakOptions::parse(["--bogus".to_owned(), "1".to_owned()]).is_err());
        assert!(SoakOptions::parse(["--help".to_owned()]).unwrap().is_none());
        let off = SoakOptions::parse(["--kill-every".to_owned(), "off".to_owned()])
            .unwrap()
            .unwrap();
        assert_eq!(off.kill_every, None);
    }
}
