//! Crash recovery, profile by profile: the real binary is SIGKILLed at every named
//! failpoint and at random moments under load (with copied routes and multipart
//! messages), restarted on the same data directory, and what survived is counted
//! against each profile's restart guarantee:
//!
//! | profile | after a restart |
//! |---|---|
//! | memory/memory/memory | nothing survives |
//! | file/memory/memory | accepted work recovered; selection and routing rerun |
//! | file/file/memory | selected batch restored without reselection; rerouted |
//! | file/memory/file | not-yet-routed messages reselected; recorded destinations restored, completed branches not redone |
//! | file/file/file | selected batch and recorded destinations restored |
//! | postgresql/postgresql/postgresql | selected batch and recorded destinations restored, in one PostgreSQL database |
//!
//! SIGKILL tests prove crash recovery of the process, not power-loss safety (that rests
//! on the fsync of every acknowledging commit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{HashMap, HashSet};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sendium_integration_tests::{
    Alphabet, BindKind, Concat, DlrParts, GatewayProcess, SmscConfig, SubmitSpec, TestEsme, TestSmsc,
};
use support::{ADMIN, HTTP, SMPP, UPSTREAM, metric};

#[derive(Clone, Copy, Debug)]
struct Profile {
    name: &'static str,
    pending: &'static str,
    router_queue: &'static str,
    routed_work: &'static str,
}

impl Profile {
    fn durable(&self) -> bool {
        self.pending != "memory"
    }
}

const MEMORY: Profile = Profile {
    name: "memory/memory/memory",
    pending: "memory",
    router_queue: "memory",
    routed_work: "memory",
};
const FMM: Profile = Profile {
    name: "file/memory/memory",
    pending: "file",
    router_queue: "memory",
    routed_work: "memory",
};
const FFM: Profile = Profile {
    name: "file/file/memory",
    pending: "file",
    router_queue: "file",
    routed_work: "memory",
};
const FMF: Profile = Profile {
    name: "file/memory/file",
    pending: "file",
    router_queue: "memory",
    routed_work: "file",
};
const FFF: Profile = Profile {
    name: "file/file/file",
    pending: "file",
    router_queue: "file",
    routed_work: "file",
};
const PPP: Profile = Profile {
    name: "postgresql/postgresql/postgresql",
    pending: "postgresql",
    router_queue: "postgresql",
    routed_work: "postgresql",
};

fn config(p: Profile) -> String {
    let storage = format!(
        "[sms]\nmultipart-expiry = \"3s\"\n[sms.pending]\nbackend = \"{}\"\n[sms.router-queue]\nbackend = \"{}\"\n\
         [sms.routed-work]\nbackend = \"{}\"\n[storage.file]\ndir = \"{{data_dir}}\"\n{}",
        p.pending,
        p.router_queue,
        p.routed_work,
        if p.pending == "postgresql" {
            "[storage.postgresql]\nurl = \"{pg_url}\"\n"
        } else {
            ""
        }
    );
    // A small provider window keeps the provider-submit window (where duplicates are
    // allowed) small.
    let upstream = UPSTREAM.replace("window = 200", "window = 20");
    let archive = upstream
        .replace("\"upstream\"", "\"archive\"")
        .replace("{smsc_port}", "{copy_port}");
    let route = "[[routes]]\nname = \"default\"\nto = [\"upstream\"]\ncopy-to = [\"archive\"]\n";
    [storage.as_str(), SMPP, HTTP, ADMIN, &upstream, &archive, route].concat()
}

/// The receipt delay is long enough that a receipt seen by the ESME proves its branch
/// completion was recorded (the Router records it right after the DLR handoff).
fn smsc_config() -> SmscConfig {
    SmscConfig {
        receipt_delay: Duration::from_millis(300),
        ..SmscConfig::default()
    }
}

struct Rig {
    profile: Profile,
    primary: TestSmsc,
    copy: TestSmsc,
    gw: GatewayProcess,
    pg_url: String,
}

impl Rig {
    async fn start(profile: Profile, failpoint: Option<&str>) -> Rig {
        let primary = TestSmsc::start(smsc_config()).await;
        let copy = TestSmsc::start(smsc_config()).await;
        // Every rig has a database of its own; only the postgresql profile uses it.
        let pg_url = if profile.pending == "postgresql" {
            sendium_storage::postgresql::test_cluster::TestCluster::shared().fresh_database()
        } else {
            String::new()
        };
        let mut b = GatewayProcess::builder(&config(profile))
            .smsc_port(primary.port())
            .var("copy_port", &copy.port().to_string())
            .var("pg_url", &pg_url);
        if let Some(fp) = failpoint {
            b = b.env("SENDIUM_FAILPOINT", fp);
        }
        let gw = b.start().await;
        Rig {
            profile,
            primary,
            copy,
            gw,
            pg_url,
        }
    }

    async fn metric(&self, name: &str, labels: &str) -> f64 {
        let (_, text) = self.gw.admin_get("/metrics").await;
        metric(&text, name, labels)
    }
}

/// A unit the client sent: its destination (unique) and the ids it was given.
#[derive(Clone, Debug)]
struct Sent {
    destination: String,
    ids: Vec<String>,
    acked: bool,
}

/// Submit `n` units (every 10th a 3-part multipart) as one pipelined stream. Returns
/// what was sent and the ids whose receipts arrived while the connection lived.
async fn load(gw: &GatewayProcess, tag: &str, n: usize) -> (Vec<Sent>, HashSet<String>) {
    let Ok(esme) = TestEsme::bind(gw.smpp_addr(), "esme1", "secret", BindKind::Transceiver).await else {
        return (Vec::new(), HashSet::new());
    };
    let mut specs = Vec::new();
    let mut units: Vec<(String, usize)> = Vec::new();
    for i in 0..n {
        let dest = format!("44{tag}{i:05}");
        if i % 10 == 9 {
            let parts = SubmitSpec::multipart(
                "1",
                &dest,
                Alphabet::Gsm7,
                &format!("multipart {tag} {i} ").repeat(20),
                Concat::Udh8((i % 256) as u8),
                DlrParts::Every,
            );
            units.push((dest, parts.len()));
            specs.extend(parts);
        } else {
            specs.push(SubmitSpec::gsm("1", &dest, &format!("crash test {tag} {i}")).dlr());
            units.push((dest, 1));
        }
    }
    let outcomes = esme.submit_pipelined(&specs, 20).await;
    let mut sent = Vec::new();
    let mut at = 0;
    for (dest, parts) in units {
        let os = &outcomes[at..at + parts];
        at += parts;
        sent.push(Sent {
            destination: dest,
            ids: os.iter().map(|o| o.message_id.clone()).collect(),
            acked: os.iter().all(|o| o.is_ok()),
        });
    }
    let receipts = esme
        .receipts()
        .iter()
        .filter_map(|r| r.message_id().map(str::to_string))
        .collect();
    (sent, receipts)
}

fn counts(smsc: &TestSmsc) -> HashMap<String, usize> {
    let mut c = HashMap::new();
    for m in smsc.messages() {
        *c.entry(m.destination).or_insert(0) += 1;
    }
    c
}

async fn wait_delivered(smsc: &TestSmsc, want: &HashSet<String>, timeout: Duration) -> Result<(), usize> {
    let ok = smsc
        .wait_for(timeout, |s| {
            let got: HashSet<String> = s.messages().into_iter().map(|m| m.destination).collect();
            want.is_subset(&got)
        })
        .await;
    if ok {
        Ok(())
    } else {
        let got: HashSet<String> = smsc.messages().into_iter().map(|m| m.destination).collect();
        Err(want.difference(&got).count())
    }
}

/// Wait (up to 5 s) until the SMSC has no bound session left: a killed gateway's
/// connections are closed once the SMSC has read everything the gateway had sent.
async fn settled(smsc: &TestSmsc) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !smsc.bound_sessions().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Kill at a named failpoint, restart, and check the profile's guarantee.
async fn named_failpoint(profile: Profile, failpoint: &str) {
    let mut rig = Rig::start(profile, Some(failpoint)).await;
    // How many batches a load makes depends on how fast the commits are, so a load may
    // end before a per-batch point is reached: another load follows, up to four.
    let mut sent = Vec::new();
    let mut receipts_before = HashSet::new();
    let mut status = None;
    for round in 0..4 {
        let (s, r) = load(&rig.gw, &(10 + round).to_string(), 800).await;
        sent.extend(s);
        receipts_before.extend(r);
        let wait = if round == 3 { 30 } else { 5 };
        status = rig.gw.wait_exit(Duration::from_secs(wait)).await;
        if status.is_some() {
            break;
        }
    }
    let log = rig.gw.log();
    assert!(
        status.and_then(|s| s.signal()) == Some(9),
        "{}: the gateway did not die at {failpoint} (status {status:?})\n{log}",
        profile.name
    );
    assert!(log.contains("FAILPOINT"), "{}: {failpoint} never fired", profile.name);
    // What the dead process had written to its provider connections is still read by the
    // SMSCs: count once they saw the connections close.
    settled(&rig.primary).await;
    settled(&rig.copy).await;
    let before_primary = counts(&rig.primary);
    let before_copy = counts(&rig.copy);
    let acked: Vec<&Sent> = sent.iter().filter(|s| s.acked).collect();
    let recorded = if profile.durable() {
        Some(recorded_state(&rig, profile).await)
    } else {
        None
    };
    let acked_dest: HashSet<String> = acked.iter().map(|s| s.destination.clone()).collect();

    rig.gw.restart().await;
    eprintln!(
        "{} killed at {failpoint}: {} of {} units acknowledged, {} delivered before the crash, {} receipts seen",
        profile.name,
        acked.len(),
        sent.len(),
        before_primary.len(),
        receipts_before.len()
    );

    if !profile.durable() {
        // Nothing survives: after the restart no message from before it is sent, and the
        // stages start empty.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(
            counts(&rig.primary),
            before_primary,
            "memory profile: nothing is recovered"
        );
        assert_eq!(rig.metric("sendium_stage_records", "stage=\"pending\"").await, 0.0);
        return;
    }

    // Every acknowledged message reaches both destinations at least once.
    if let Err(missing) = wait_delivered(&rig.primary, &acked_dest, Duration::from_secs(60)).await {
        panic!(
            "{} at {failpoint}: {missing} of {} acknowledged messages never reached the SMSC\n{}",
            profile.name,
            acked_dest.len(),
            rig.gw.log()
        );
    }
    if let Err(missing) = wait_delivered(&rig.copy, &acked_dest, Duration::from_secs(60)).await {
        panic!(
            "{} at {failpoint}: {missing} acknowledged messages never reached the copy route",
            profile.name
        );
    }

    let after = counts(&rig.primary);
    let after_copy = counts(&rig.copy);
    let _ = &receipts_before;
    if let Some(rec) = &recorded {
        for s in &acked {
            let unit = s.ids[0].as_str();
            let b = before_primary.get(&s.destination).copied().unwrap_or(0);
            let a = after.get(&s.destination).copied().unwrap_or(0);
            let bc = before_copy.get(&s.destination).copied().unwrap_or(0);
            let ac = after_copy.get(&s.destination).copied().unwrap_or(0);
            // A source completed before the crash is never sent again, in any durable
            // profile.
            if !rec.pending.contains(unit) {
                assert_eq!(
                    (a, ac),
                    (b, bc),
                    "{}: completed message to {} was sent again",
                    profile.name,
                    s.destination
                );
            }
            // With a durable routed-work stage, a completed branch is not redone.
            if rec.completed.contains(&(unit.to_string(), 0)) {
                assert_eq!(
                    a, b,
                    "{}: completed primary branch to {} was redone",
                    profile.name, s.destination
                );
            }
            if rec.completed.contains(&(unit.to_string(), 1)) {
                assert_eq!(
                    ac, bc,
                    "{}: completed copy branch to {} was redone",
                    profile.name, s.destination
                );
            }
        }
    }
    // Duplicates only where a provider submission was in flight: bounded by the
    // destination's window and the worker's capacity, never a whole batch.
    let dups = acked
        .iter()
        .filter(|s| after.get(&s.destination).copied().unwrap_or(0) > 1)
        .count();
    assert!(dups <= 256 + 20, "{}: {dups} duplicates", profile.name);

    // Restored stages, not repeated work.
    let restored_staged = rig.metric("sendium_staged_restored_total", "").await;
    let restored_routed = rig.metric("sendium_routed_restored_total", "").await;
    if profile.router_queue == "memory" {
        assert_eq!(
            restored_staged, 0.0,
            "{}: a memory router-queue restores nothing",
            profile.name
        );
    }
    if profile.routed_work == "memory" {
        assert_eq!(
            restored_routed, 0.0,
            "{}: a memory routed-work restores nothing",
            profile.name
        );
    }
    match failpoint.split('@').next() {
        Some("mid-select-and-stage") if profile.router_queue != "memory" => {
            assert!(
                restored_staged > 0.0,
                "{}: the staged batch was not restored",
                profile.name
            );
        }
        Some("after-routing") | Some("after-provider-submit") | Some("before-branch-completion")
            if profile.routed_work != "memory" =>
        {
            assert!(
                restored_routed > 0.0,
                "{}: recorded destinations were not restored",
                profile.name
            );
        }
        _ => {}
    }
    let _ = before_copy;
    eprintln!(
        "{}: after restart: staged restored {restored_staged}, routed restored {restored_routed}, duplicates {dups}",
        profile.name
    );

    // Nothing is left behind once everything is delivered.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut left = Vec::new();
        for stage in ["pending", "router-queue", "routed-work"] {
            let n = rig.metric("sendium_stage_records", &format!("stage=\"{stage}\"")).await;
            if n > 0.0 {
                left.push(format!("{stage}: {n}"));
            }
        }
        // Parts of multipart groups cut off by the crash wait for their deadline (3 s).
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} at {failpoint}: records never completed ({})\n{}",
            profile.name,
            left.join(", "),
            rig.gw
                .admin_get("/metrics")
                .await
                .1
                .lines()
                .filter(|l| !l.starts_with('#')
                    && (l.contains("routed")
                        || l.contains("router")
                        || l.contains("destination_")
                        || l.contains("handoff")
                        || l.contains("retries")))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Random SIGKILLs under load, `rounds` times, then everything acknowledged must arrive.
async fn random_kills(profile: Profile, rounds: usize) {
    let seed = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64;
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut rig = Rig::start(profile, None).await;
    let mut acked_dest = HashSet::new();
    for round in 0..rounds {
        let tag = format!("{:02}", 20 + round);
        let delay = Duration::from_millis(30 + next() % 300);
        let load_task = {
            let gw_addr = rig.gw.smpp_addr();
            let tag = tag.clone();
            tokio::spawn(async move { load_at(gw_addr, &tag, 150).await })
        };
        tokio::time::sleep(delay).await;
        rig.gw.kill();
        let sent = load_task.await.unwrap();
        acked_dest.extend(sent.into_iter().filter(|s| s.acked).map(|s| s.destination));
        rig.gw.restart().await;
        if !profile.durable() {
            assert_eq!(
                rig.metric("sendium_stage_records", "stage=\"pending\"").await,
                0.0,
                "{}: a restarted memory profile starts empty",
                profile.name
            );
        }
    }
    if !profile.durable() {
        return;
    }
    if let Err(missing) = wait_delivered(&rig.primary, &acked_dest, Duration::from_secs(90)).await {
        panic!(
            "{} (seed {seed}): {missing} of {} acknowledged messages lost over {rounds} random kills\n{}",
            profile.name,
            acked_dest.len(),
            rig.gw.log()
        );
    }
    if let Err(missing) = wait_delivered(&rig.copy, &acked_dest, Duration::from_secs(60)).await {
        panic!(
            "{} (seed {seed}): {missing} acknowledged messages never reached the copy route",
            profile.name
        );
    }
    let _ = &rig.profile;
}

/// What a killed gateway had durably recorded: the pending source ids, and the
/// (unit, branch) pairs routed-work records as completed.
struct Recorded {
    pending: HashSet<String>,
    completed: HashSet<(String, u16)>,
}

async fn recorded_state(rig: &Rig, profile: Profile) -> Recorded {
    use sendium_storage::file::{DataDir, FilePendingStore, FileRoutedWorkStore};
    use sendium_storage::memory::PendingLimits;
    use sendium_storage::postgresql::{PgStageOptions, PgStages, StageAccess};
    use sendium_storage::{PendingStore, ReadySeq, RoutedWorkStore};
    let (pending_store, routed_store): (std::sync::Arc<dyn PendingStore>, std::sync::Arc<dyn RoutedWorkStore>) =
        if profile.pending == "postgresql" {
            let url = rig.pg_url.as_str();
            let readonly = PgStageOptions {
                access: StageAccess::ReadOnly,
                ..PgStageOptions::new(2, PendingLimits::default())
            };
            let pg = PgStages::connect(url, readonly).await.unwrap();
            (pg.pending.clone(), pg.routed_work.clone())
        } else {
            let dir =
                std::sync::Arc::new(DataDir::open(rig.gw.data_dir()).expect("the killed gateway released its lock"));
            (
                std::sync::Arc::new(FilePendingStore::open(&dir, PendingLimits::default()).unwrap()),
                std::sync::Arc::new(FileRoutedWorkStore::open(&dir).unwrap()),
            )
        };
    let mut pending = HashSet::new();
    if profile.pending == "postgresql" {
        // Every pending unit, whichever stage holds it now.
        let pool = sqlx::PgPool::connect(rig.pg_url.as_str()).await.unwrap();
        let ids: Vec<String> = sqlx::query_scalar("SELECT id::text FROM sms_units")
            .fetch_all(&pool)
            .await
            .unwrap();
        pool.close().await;
        pending.extend(ids);
    } else {
        let store = &pending_store;
        let mut after = ReadySeq(0);
        loop {
            let page = store.ready_after(after.into(), 1000).await.unwrap();
            let Some(last) = page.last().map(|u| u.seq) else { break };
            after = last;
            for u in page {
                pending.insert(u.unit.id.to_string());
            }
        }
    }
    let mut completed = HashSet::new();
    if profile.routed_work != "memory" {
        let store = &routed_store;
        let mut after = None;
        loop {
            let page = store.load_after(after, 1000).await.unwrap();
            let Some(last) = page.last().map(|u| u.id) else { break };
            after = Some(last);
            for u in page {
                for b in &u.branches {
                    if b.outcome.is_some() {
                        completed.insert((u.id.to_string(), b.no));
                    }
                }
            }
        }
    }
    Recorded { pending, completed }
}

async fn load_at(addr: std::net::SocketAddr, tag: &str, n: usize) -> Vec<Sent> {
    // Same as `load`, for a spawned task that only has the address.
    let Ok(esme) = TestEsme::bind(addr, "esme1", "secret", BindKind::Transceiver).await else {
        return Vec::new();
    };
    let specs: Vec<SubmitSpec> = (0..n)
        .map(|i| SubmitSpec::gsm("1", &format!("44{tag}{i:05}"), &format!("random kill {tag} {i}")).dlr())
        .collect();
    let outcomes = esme.submit_pipelined(&specs, 20).await;
    specs
        .iter()
        .zip(outcomes)
        .map(|(s, o)| Sent {
            destination: s.destination.clone(),
            ids: vec![o.message_id.clone()],
            acked: o.is_ok(),
        })
        .collect()
}

/// Each fires well into the load, after the first receipts came back, so completed and
/// in-flight work both exist at the crash. The per-batch points count batches, which
/// grow as commits get faster: 20 of them is still mid-load with group-committed files.
const FAILPOINTS: [&str; 7] = [
    "after-admit@25",
    "after-ack@25",
    "mid-select-and-stage@20",
    "after-routing@20",
    "after-provider-submit@40",
    "before-branch-completion@20",
    "before-source-completion@20",
];

/// The memory profile commits faster, so its batches are bigger and fewer: reach the
/// same point of the load with a quarter of the hits.
fn scaled(fp: &str, p: Profile) -> String {
    match (p.durable(), fp.split_once('@')) {
        (false, Some((name, n))) => format!("{name}@{}", n.parse::<u64>().unwrap_or(4) / 4),
        _ => fp.to_string(),
    }
}

macro_rules! profile_tests {
    ($module:ident, $profile:expr) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_at_every_named_failpoint() {
                for fp in FAILPOINTS {
                    named_failpoint($profile, &scaled(fp, $profile)).await;
                }
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn killed_at_random_moments() {
                random_kills($profile, if $profile.durable() { 20 } else { 3 }).await;
            }
        }
    };
}

profile_tests!(memory_memory_memory, MEMORY);
profile_tests!(file_memory_memory, FMM);
profile_tests!(file_file_memory, FFM);
profile_tests!(file_memory_file, FMF);
profile_tests!(file_file_file, FFF);
profile_tests!(postgresql_postgresql_postgresql, PPP);
