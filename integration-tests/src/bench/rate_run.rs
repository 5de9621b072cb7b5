//! The row of the phases that report a rate and the gateway's CPU per message.

/// One profile's run of a phase that reports messages per second and the gateway's CPU
/// per message (the inbound and HTTP-destination phases).
#[derive(Debug, Clone, Default)]
pub struct RateRun {
    pub round: Option<usize>,
    pub profile: String,
    pub messages: u64,
    pub per_s: Option<f64>,
    pub cpu_us_per_msg: Option<f64>,
    pub note: String,
    pub failed: bool,
}

pub const HEADERS: [&str; 5] = ["round", "profile", "messages", "msgs/s", "gateway CPU µs/msg"];

impl RateRun {
    pub fn new(profile: &str, messages: u64) -> RateRun {
        RateRun {
            profile: profile.to_owned(),
            messages,
            ..RateRun::default()
        }
    }

    /// The run failed: why, also printed.
    pub fn fail(&mut self, note: impl Into<String>) {
        self.note = note.into();
        eprintln!("  {}", self.note);
        self.failed = true;
    }

    /// Its figures: `messages` done in `secs`, for `cpu_secs` of the gateway's CPU.
    pub fn measured(&mut self, secs: f64, cpu_secs: f64) {
        let n = self.messages as f64;
        self.per_s = Some(n / secs);
        self.cpu_us_per_msg = Some(cpu_secs * 1e6 / n);
    }

    pub fn cells(&self) -> Vec<String> {
        let f = |v: Option<f64>, digits: usize| v.map_or("-".into(), |x| format!("{x:.digits$}"));
        vec![
            self.round.map_or("-".into(), |r| r.to_string()),
            self.profile.clone(),
            self.messages.to_string(),
            f(self.per_s, 0),
            f(self.cpu_us_per_msg, 1),
        ]
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "round": self.round,
            "profile": self.profile,
            "messages": self.messages,
            "per_s": self.per_s,
            "cpu_us_per_msg": self.cpu_us_per_msg,
            "note": self.note,
            "failed": self.failed,
        })
    }
}
