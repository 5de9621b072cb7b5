//! Storage profiles: which backend each stage uses, which combinations Sendium
//! accepts, and what each one promises across a restart.
//!
//! An unsupported choice fails startup instead of silently degrading, and every
//! supported choice has a documented guarantee. So the guarantee sentences live next
//! to the acceptance lists, and the refusal message is generated from the same lists:
//! enabling a profile is adding one row to [`IMPLEMENTED_OUTBOUND`] (or one entry to
//! [`IMPLEMENTED_DLR`]), and the error text and the `check-config` table follow (the
//! README's table is checked against them by `ops/tests/docs.rs`).

use std::fmt;

use crate::error::ConfigError;
use crate::model::{Config, DlrBackend, StageBackend};

use StageBackend::{File, Memory, Postgresql};

/// The four storage selectors of one configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StorageProfile {
    /// `sms.pending.backend`
    pub pending: StageBackend,
    /// `sms.router-queue.backend`
    pub router_queue: StageBackend,
    /// `sms.routed-work.backend`
    pub routed_work: StageBackend,
    /// `dlr.backend`
    pub dlr: DlrBackend,
}

impl StorageProfile {
    /// The default profile: everything in memory, explicitly non-durable.
    pub const DEFAULT: StorageProfile = StorageProfile {
        pending: Memory,
        router_queue: Memory,
        routed_work: Memory,
        dlr: DlrBackend::Memory,
    };

    /// The outbound part as `pending/router-queue/routed-work`.
    pub fn outbound(&self) -> String {
        format!("{}/{}/{}", self.pending, self.router_queue, self.routed_work)
    }
}

impl Default for StorageProfile {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for StorageProfile {
    /// `memory/memory/memory + dlr memory`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{} + dlr {}",
            self.pending, self.router_queue, self.routed_work, self.dlr
        )
    }
}

impl Config {
    /// The storage profile this configuration selects.
    pub fn storage_profile(&self) -> StorageProfile {
        StorageProfile {
            pending: self.sms.pending.backend,
            router_queue: self.sms.router_queue.backend,
            routed_work: self.sms.routed_work.backend,
            dlr: self.dlr.backend,
        }
    }
}

/// The restart guarantee (SIGKILL included) of every outbound profile that has one.
/// Only the rows in [`IMPLEMENTED_OUTBOUND`] are accepted at startup; the others are
/// refused like any unknown combination.
pub const OUTBOUND_GUARANTEES: &[(StageBackend, StageBackend, StageBackend, &str)] = &[
    (Memory, Memory, Memory, "nothing survives (compatibility mode)"),
    (
        File,
        Memory,
        Memory,
        "accepted work recovered; selection and routing rerun",
    ),
    (
        File,
        File,
        Memory,
        "selected batch restored without reselection; rerouted",
    ),
    (
        File,
        Memory,
        File,
        "not-yet-routed messages reselected; recorded destinations restored, completed branches not redone",
    ),
    (File, File, File, "selected batch and recorded destinations restored"),
    (
        Postgresql,
        Postgresql,
        Postgresql,
        "selected batch and recorded destinations restored, in one PostgreSQL database",
    ),
];

/// What each DLR backend keeps across a restart.
pub const DLR_GUARANTEES: &[(DlrBackend, &str)] = &[
    (
        DlrBackend::Memory,
        "receipts (and inbound messages) are correlated and delivered while running; \
         correlations, retries and undelivered receipts and inbound messages are lost on \
         restart; receipt-requesting admissions beyond dlr.capacity are refused, inbound \
         messages beyond it are answered with a temporary error",
    ),
    (
        DlrBackend::File,
        "provider correlations and pending downstream deliveries (receipts and inbound \
         messages) survive restart (persistent local volume, single process)",
    ),
    (
        DlrBackend::Postgresql,
        "provider correlations and pending downstream deliveries (receipts and inbound \
         messages) survive restart and are shared by every process using the database",
    ),
    (
        DlrBackend::Disabled,
        "no Sendium-owned receipt correlation or delivery; receipt requests are \
         answered as dlr.on-receipt-request says",
    ),
];

/// The outbound profiles Sendium accepts (each with a row in [`OUTBOUND_GUARANTEES`]);
/// a row is added when every stage of it has a backend.
pub const IMPLEMENTED_OUTBOUND: &[(StageBackend, StageBackend, StageBackend)] = &[
    (Memory, Memory, Memory),
    (File, Memory, Memory),
    (File, File, Memory),
    (File, Memory, File),
    (File, File, File),
    (Postgresql, Postgresql, Postgresql),
];

/// The DLR backends Sendium accepts. Each accepted outbound profile combines with each
/// of them.
pub const IMPLEMENTED_DLR: &[DlrBackend] = &[
    DlrBackend::Memory,
    DlrBackend::File,
    DlrBackend::Postgresql,
    DlrBackend::Disabled,
];

/// What a selected profile promises across a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Guarantee {
    /// The profile this is about.
    pub profile: StorageProfile,
    /// What happens to outbound SMS work on restart.
    pub outbound: &'static str,
    /// What happens to receipt handling on restart.
    pub dlr: &'static str,
    /// Whether an acknowledged message survives a restart (the pending stage
    /// is durable). `false` is the non-durable compatibility mode that the
    /// startup log must announce.
    pub durable: bool,
}

fn outbound_sentence(p: &StorageProfile) -> Option<&'static str> {
    OUTBOUND_GUARANTEES
        .iter()
        .find(|(a, b, c, _)| (*a, *b, *c) == (p.pending, p.router_queue, p.routed_work))
        .map(|row| row.3)
}

fn dlr_sentence(d: DlrBackend) -> Option<&'static str> {
    DLR_GUARANTEES.iter().find(|(b, _)| *b == d).map(|row| row.1)
}

/// Every profile Sendium accepts, in table order.
pub fn implemented_profiles() -> Vec<StorageProfile> {
    IMPLEMENTED_OUTBOUND
        .iter()
        .flat_map(|&(pending, router_queue, routed_work)| {
            IMPLEMENTED_DLR.iter().map(move |&dlr| StorageProfile {
                pending,
                router_queue,
                routed_work,
                dlr,
            })
        })
        .collect()
}

/// The documented guarantee of a profile, whether or not it is accepted yet; `None` for
/// a combination that has none.
pub fn documented_guarantee(p: &StorageProfile) -> Option<Guarantee> {
    let (outbound, dlr) = outbound_sentence(p).zip(dlr_sentence(p.dlr))?;
    Some(Guarantee {
        profile: *p,
        outbound,
        dlr,
        durable: p.pending != Memory,
    })
}

/// Accepts an implemented profile and returns its guarantee;
/// refuses anything else, naming the four keys, the requested combination and
/// every accepted one.
pub fn check_supported(p: &StorageProfile) -> Result<Guarantee, ConfigError> {
    let outbound_ok = IMPLEMENTED_OUTBOUND.contains(&(p.pending, p.router_queue, p.routed_work));
    let dlr_ok = IMPLEMENTED_DLR.contains(&p.dlr);
    match documented_guarantee(p) {
        Some(g) if outbound_ok && dlr_ok => Ok(g),
        // Also reached if an implemented row lacks a sentence, which the
        // tests rule out: better refuse than run without a documented guarantee.
        _ => Err(ConfigError::UnsupportedProfile {
            requested: *p,
            supported: vec![supported_summary()],
        }),
    }
}

/// Every accepted choice in one sentence: each implemented outbound profile combines
/// with each implemented DLR backend.
pub fn supported_summary() -> String {
    fn or_list(words: &[String]) -> String {
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            Some((last, _)) => last.clone(),
            None => String::new(),
        }
    }
    let outbound: Vec<String> = IMPLEMENTED_OUTBOUND
        .iter()
        .map(|&(a, b, c)| format!("{a}/{b}/{c}"))
        .collect();
    let dlr: Vec<String> = IMPLEMENTED_DLR.iter().map(|d| d.to_string()).collect();
    format!(
        "sms profiles {}, each with dlr.backend {}",
        or_list(&outbound),
        or_list(&dlr)
    )
}

/// The accepted profiles and their restart guarantees as Markdown tables,
/// for `sendium check-config` and the README.
pub fn guarantee_table() -> String {
    let mut out =
        String::from("| sms pending/router-queue/routed-work | after a restart (SIGKILL included) |\n|---|---|\n");
    for &(a, b, c) in IMPLEMENTED_OUTBOUND {
        let p = StorageProfile {
            pending: a,
            router_queue: b,
            routed_work: c,
            dlr: DlrBackend::Memory,
        };
        let sentence = outbound_sentence(&p).unwrap_or("undocumented");
        out.push_str(&format!("| {} | {} |\n", p.outbound(), sentence));
    }
    out.push_str("\n| dlr | after a restart |\n|---|---|\n");
    for &d in IMPLEMENTED_DLR {
        let sentence = dlr_sentence(d).unwrap_or("undocumented");
        out.push_str(&format!("| {d} | {sentence} |\n"));
    }
    out.push_str("\nEach sms profile combines with each dlr backend; any other combination fails startup.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(a: StageBackend, b: StageBackend, c: StageBackend, d: DlrBackend) -> StorageProfile {
        StorageProfile {
            pending: a,
            router_queue: b,
            routed_work: c,
            dlr: d,
        }
    }

    #[test]
    fn display_names_every_stage() {
        assert_eq!(StorageProfile::DEFAULT.to_string(), "memory/memory/memory + dlr memory");
        assert_eq!(
            profile(File, File, Memory, DlrBackend::Postgresql).to_string(),
            "file/file/memory + dlr postgresql"
        );
    }

    #[test]
    fn memory_profile_is_accepted_with_memory_or_disabled_dlr() {
        let g = check_supported(&StorageProfile::DEFAULT).unwrap();
        assert_eq!(g.outbound, "nothing survives (compatibility mode)");
        assert!(g.dlr.contains("lost on restart"));
        assert!(!g.durable);
        let g = check_supported(&profile(Memory, Memory, Memory, DlrBackend::Disabled)).unwrap();
        assert!(g.dlr.starts_with("no Sendium-owned"));
    }

    #[test]
    fn every_other_combination_is_refused_with_the_choices() {
        let all_stage = StageBackend::ALL;
        let mut refused = 0;
        for &a in all_stage {
            for &b in all_stage {
                for &c in all_stage {
                    for &d in DlrBackend::ALL {
                        let p = profile(a, b, c, d);
                        let accepted = IMPLEMENTED_OUTBOUND.contains(&(a, b, c)) && IMPLEMENTED_DLR.contains(&d);
                        match check_supported(&p) {
                            Ok(_) => assert!(accepted, "{p} accepted"),
                            Err(e) => {
                                assert!(!accepted, "{p} refused");
                                refused += 1;
                                let m = e.to_string();
                                for key in [
                                    "sms.pending.backend",
                                    "sms.router-queue.backend",
                                    "sms.routed-work.backend",
                                    "dlr.backend",
                                ] {
                                    assert!(m.contains(key), "{m}");
                                }
                                assert!(m.contains(&p.to_string()), "{m}");
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(refused, 27 * 4 - 6 * 4);
    }

    #[test]
    fn refusal_wording() {
        let e = check_supported(&profile(Memory, File, Memory, DlrBackend::Memory)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unsupported storage profile memory/file/memory + dlr memory \
             (sms.pending.backend = \"memory\", sms.router-queue.backend = \"file\", \
             sms.routed-work.backend = \"memory\", dlr.backend = \"memory\"); \
             supported: sms profiles memory/memory/memory, file/memory/memory, \
             file/file/memory, file/memory/file, file/file/file or postgresql/postgresql/postgresql, \
             each with dlr.backend memory, file, postgresql or disabled"
        );
    }

    #[test]
    fn every_implemented_choice_has_a_documented_guarantee() {
        for &(a, b, c) in IMPLEMENTED_OUTBOUND {
            assert!(OUTBOUND_GUARANTEES.iter().any(|r| (r.0, r.1, r.2) == (a, b, c)));
        }
        for d in DlrBackend::ALL {
            assert!(dlr_sentence(*d).is_some(), "{d}");
        }
        for p in implemented_profiles() {
            assert!(check_supported(&p).is_ok(), "{p}");
        }
    }

    #[test]
    fn durable_means_acknowledged_messages_survive() {
        for row in OUTBOUND_GUARANTEES {
            let g = documented_guarantee(&profile(row.0, row.1, row.2, DlrBackend::File)).unwrap();
            assert_eq!(g.durable, row.0 != Memory, "{}", g.profile);
            assert_eq!(g.outbound, row.3);
        }
        assert!(documented_guarantee(&profile(Memory, File, Memory, DlrBackend::Memory)).is_none());
    }

    #[test]
    fn table_lists_only_accepted_profiles() {
        let t = guarantee_table();
        assert!(t.contains("| memory/memory/memory | nothing survives (compatibility mode) |"));
        assert!(t.contains("| memory | receipts (and inbound messages) are correlated"));
        assert!(t.contains("| disabled | no Sendium-owned"));
        assert!(t.contains("| file/file/file | selected batch and recorded destinations restored |"));
        assert!(t.contains("| postgresql/postgresql/postgresql | selected batch and recorded destinations restored, in one PostgreSQL database |"));
        // A mix of file and postgresql stages is not offered.
        assert!(!t.contains("file/postgresql"));
        assert!(t.contains("| postgresql | provider correlations"));
    }
}
