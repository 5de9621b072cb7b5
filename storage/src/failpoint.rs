//! Named failpoints for crash and fault tests.
//!
//! `SENDIUM_FAILPOINT` lists failpoints as `name[=action][@n]`, comma-separated:
//!
//! * `after-admit` — SIGKILL the process the first time the point is reached;
//! * `after-admit@500` — SIGKILL it on the 500th hit;
//! * `ingress-handle=panic@2000` — panic (inside the actor that reached it) on the 2000th
//!   hit; the supervisor restarts that actor.
//! * `disk-full=error@300` — from the 300th hit on, [`error`] returns true at that point
//!   (the code there then fails the way the fault would, e.g. a write answering ENOSPC);
//!   the fault stays on, as a full disk does.
//!
//! SIGKILL (not an orderly exit) is the point: nothing is flushed, no destructor runs,
//! exactly like a crashed host process. With the variable unset, [`hit`] is one relaxed
//! atomic load.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// What a failpoint does when it fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Kill,
    Panic,
    /// Make [`error`] return true from the n-th hit on.
    Error,
}

#[derive(Debug)]
struct Point {
    action: Action,
    fire_at: u64,
    hits: AtomicU64,
}

static ANY: AtomicBool = AtomicBool::new(false);
static POINTS: OnceLock<HashMap<String, Point>> = OnceLock::new();

/// Parse a failpoint specification (the value of `SENDIUM_FAILPOINT`).
fn parse(spec: &str) -> Result<HashMap<String, Point>, String> {
    let mut points = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (rest, fire_at) = match item.split_once('@') {
            Some((r, n)) => (
                r,
                n.parse::<u64>()
                    .map_err(|_| format!("failpoint {item:?}: the count after @ must be a positive number"))?,
            ),
            None => (item, 1),
        };
        let (name, action) = match rest.split_once('=') {
            Some((n, "kill")) => (n, Action::Kill),
            Some((n, "panic")) => (n, Action::Panic),
            Some((n, "error")) => (n, Action::Error),
            Some((_, other)) => {
                return Err(format!(
                    "failpoint {item:?}: unknown action {other:?}, expected kill, panic or error"
                ));
            }
            None => (rest, Action::Kill),
        };
        if fire_at == 0 {
            return Err(format!("failpoint {item:?}: the count after @ must be at least 1"));
        }
        points.insert(
            name.to_string(),
            Point {
                action,
                fire_at,
                hits: AtomicU64::new(0),
            },
        );
    }
    Ok(points)
}

/// Read `SENDIUM_FAILPOINT` once, at startup. An invalid specification is an error so a
/// crash test never silently runs without its failpoint.
pub fn init_from_env() -> Result<(), String> {
    let spec = std::env::var("SENDIUM_FAILPOINT").unwrap_or_default();
    init(&spec)
}

/// Install failpoints from a specification string (idempotent: the first call wins).
pub fn init(spec: &str) -> Result<(), String> {
    let points = parse(spec)?;
    let any = !points.is_empty();
    let _ = POINTS.set(points);
    if any {
        ANY.store(true, Ordering::Release);
    }
    Ok(())
}

/// Names of the active failpoints (for the startup log).
pub fn active() -> Vec<String> {
    POINTS.get().map(|p| p.keys().cloned().collect()).unwrap_or_default()
}

/// Reach the failpoint `name`. Returns normally unless it fires.
pub fn hit(name: &str) {
    if !ANY.load(Ordering::Relaxed) {
        return;
    }
    let Some(point) = POINTS.get().and_then(|p| p.get(name)) else {
        return;
    };
    let n = point.hits.fetch_add(1, Ordering::AcqRel) + 1;
    if n != point.fire_at {
        return;
    }
    match point.action {
        Action::Kill => {
            eprintln!("FAILPOINT {name} fired: SIGKILL");
            let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
            // SIGKILL cannot be caught; should delivery lag, never continue past the point.
            std::process::abort();
        }
        Action::Panic => {
            panic!("FAILPOINT {name} fired: panic");
        }
        // Reported through `error`, not here.
        Action::Error => {}
    }
}

/// Reach an error-injecting failpoint: true when the fault is on (from its n-th hit).
/// Kill and panic actions behave as in [`hit`].
pub fn error(name: &str) -> bool {
    if !ANY.load(Ordering::Relaxed) {
        return false;
    }
    let Some(point) = POINTS.get().and_then(|p| p.get(name)) else {
        return false;
    };
    if point.action != Action::Error {
        hit(name);
        return false;
    }
    let n = point.hits.fetch_add(1, Ordering::AcqRel) + 1;
    if n == point.fire_at {
        eprintln!("FAILPOINT {name} fired: injecting errors from now on");
    }
    n >= point.fire_at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_specifications() {
        let p = parse("after-admit, router=panic@3 ,x=kill@2").unwrap();
        assert_eq!(p["after-admit"].action, Action::Kill);
        assert_eq!(p["after-admit"].fire_at, 1);
        assert_eq!(p["router"].action, Action::Panic);
        assert_eq!(p["router"].fire_at, 3);
        assert_eq!(p["x"].fire_at, 2);
        assert_eq!(parse("d=error@4").unwrap()["d"].action, Action::Error);
        assert!(parse("a=explode").is_err());
        assert!(parse("a@0").is_err());
        assert!(parse("a@x").is_err());
        assert!(parse("").unwrap().is_empty());
    }
}
