//! `<dir>/manifest.json`: which backend each stage used when the directory was last
//! started, and the layout version of the directory.
//!
//! Storage records *facts*; the policy lives with the caller (the actors' startup):
//! compare the manifest with the configured profile and, when a stage changes backend
//! while its store still holds records (see each store's `stats()`), refuse to start
//! unless the operator drained or migrated it. JSON, because an operator reads it.

use std::fs::{self, File, OpenOptions};
use std::io::Write;

use serde::{Deserialize, Serialize};

use super::dir::{DataDir, io_failure};
use super::observe::{DiskEvent, Watched};
use crate::error::{BackendFailure, FailureKind};

pub const MANIFEST_FILE: &str = "manifest.json";

/// The data directory's record of the profile that last used it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Manifest {
    /// Layout version of the directory ([`Manifest::FORMAT`] when written by this build).
    pub format: u32,
    /// Backend of each stage: `memory`, `file`, `postgresql` (DLR also `disabled`).
    pub pending: String,
    pub router_queue: String,
    pub routed_work: String,
    pub dlr: String,
    /// The Sendium version that wrote it (informational).
    #[serde(default)]
    pub written_by: String,
}

impl Manifest {
    /// The directory layout this build writes and understands.
    pub const FORMAT: u32 = 1;

    pub fn new(pending: &str, router_queue: &str, routed_work: &str, dlr: &str) -> Self {
        Self {
            format: Self::FORMAT,
            pending: pending.to_string(),
            router_queue: router_queue.to_string(),
            routed_work: routed_work.to_string(),
            dlr: dlr.to_string(),
            written_by: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

impl DataDir {
    /// The manifest, or `None` in a directory no Sendium has started in yet. A manifest
    /// that does not parse is [`FailureKind::Corrupt`]; one of a newer layout is
    /// [`FailureKind::UnsupportedVersion`].
    pub fn manifest(&self) -> Result<Option<Manifest>, BackendFailure> {
        let path = self.path().join(MANIFEST_FILE);
        let loc = path.display().to_string();
        let text = match fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_failure(&loc, "cannot read the manifest", &e)),
        };
        let m: Manifest = serde_json::from_slice(&text)
            .map_err(|e| BackendFailure::new(FailureKind::Corrupt, loc.clone(), format!("unreadable manifest: {e}")))?;
        if m.format > Manifest::FORMAT {
            return Err(BackendFailure::new(
                FailureKind::UnsupportedVersion,
                loc,
                format!(
                    "data directory layout {} was written by a newer Sendium ({}); this build reads layout {}",
                    m.format,
                    m.written_by,
                    Manifest::FORMAT
                ),
            ));
        }
        Ok(Some(m))
    }

    /// Replace the manifest atomically: write a temporary file, fsync it, rename it over
    /// the old one, fsync the directory. A crash leaves the old or the new manifest,
    /// never a torn one.
    pub fn write_manifest(&self, manifest: &Manifest) -> Result<(), BackendFailure> {
        let path = self.path().join(MANIFEST_FILE);
        let tmp = self.path().join(format!("{MANIFEST_FILE}.tmp"));
        let loc = path.display().to_string();
        let mut text = serde_json::to_vec_pretty(manifest)
            .map_err(|e| BackendFailure::new(FailureKind::Unavailable, loc.clone(), e))?;
        text.push(b'\n');
        let tmp_name = format!("{MANIFEST_FILE}.tmp");
        let watched = Watched::file(self.path(), &tmp_name);
        let write = || -> std::io::Result<()> {
            let mut f: File = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
            if let Some(w) = &watched {
                w.created(true);
            }
            f.write_all(&text)?;
            if let Some(w) = &watched {
                w.wrote(0, &text);
            }
            f.sync_all()?;
            if let Some(w) = &watched {
                w.synced();
            }
            fs::rename(&tmp, &path)?;
            if let Some(w) = super::observe::watcher(self.path()) {
                w.event(DiskEvent::Renamed {
                    from: &tmp_name,
                    to: MANIFEST_FILE,
                });
            }
            Ok(())
        };
        write().map_err(|e| io_failure(&loc, "cannot write the manifest", &e))?;
        self.sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips_atomically_and_refuses_newer_layouts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DataDir::open(tmp.path()).unwrap();
        assert_eq!(dir.manifest().unwrap(), None);
        let m = Manifest::new("file", "file", "memory", "postgresql");
        dir.write_manifest(&m).unwrap();
        assert_eq!(dir.manifest().unwrap(), Some(m.clone()));
        assert!(!tmp.path().join("manifest.json.tmp").exists());
        let text = fs::read_to_string(tmp.path().join(MANIFEST_FILE)).unwrap();
        assert!(text.contains("\"router-queue\": \"file\""), "{text}");

        let mut newer = m.clone();
        newer.format = 9;
        fs::write(tmp.path().join(MANIFEST_FILE), serde_json::to_vec(&newer).unwrap()).unwrap();
        assert_eq!(dir.manifest().unwrap_err().kind, FailureKind::UnsupportedVersion);

        fs::write(tmp.path().join(MANIFEST_FILE), b"{\"format\": 1, \"pend").unwrap();
        let err = dir.manifest().unwrap_err();
        assert_eq!(err.kind, FailureKind::Corrupt);
        assert!(err.location.ends_with("manifest.json"), "{err}");
    }
}
