//! `sendium inspect` and `sendium drain`: looking into a data directory, and finishing
//! the work a previous profile left in it.

use std::time::Duration;

use sendium_actors::stores::{dlr_retention, outstanding, pending_limits};
use sendium_actors::{Gateway, Mode};
use sendium_profiles::{Config, DlrBackend, StageBackend};
use sendium_storage::file::{DataDir, FilePendingStore, FileRoutedWorkStore, FileRouterQueueStore, Manifest};
use sendium_storage::{PendingStore, RoutedWorkStore, RouterQueueStore, Timestamp};

#[derive(Debug, thiserror::Error)]
pub enum StoresCliError {
    #[error("storage.file.dir is not set: there is no data directory to look at")]
    NoDir,
    #[error("{0}")]
    Storage(String),
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    #[error(transparent)]
    Gateway(#[from] sendium_actors::GatewayError),
}

fn storage(e: impl std::fmt::Display) -> StoresCliError {
    StoresCliError::Storage(e.to_string())
}

fn age(t: Option<Timestamp>) -> String {
    match t {
        Some(t) => format!("{:.1} s", t.age(Timestamp::now()).as_secs_f64()),
        None => "-".into(),
    }
}

/// Per-stage counts and the oldest record's age of the stores in the data directory.
pub async fn inspect(cfg: &Config) -> Result<String, StoresCliError> {
    let path = cfg.storage.file.dir.as_ref().ok_or(StoresCliError::NoDir)?;
    let dir = std::sync::Arc::new(DataDir::open(path).map_err(|e| {
        storage(format!(
            "{e} — while a gateway runs, read its admin endpoint (/metrics, /admin/actors) instead"
        ))
    })?);
    let mut out = format!("data directory {}\n", path.display());
    match dir.manifest().map_err(storage)? {
        Some(m) => out.push_str(&format!(
            "written by storage profile {}/{}/{} + dlr {} (sendium {})\n",
            m.pending, m.router_queue, m.routed_work, m.dlr, m.written_by
        )),
        None => out.push_str("no manifest: no gateway has used this directory yet\n"),
    }
    if dir.pending_path().exists() {
        let s = FilePendingStore::open(&dir, pending_limits(cfg)).map_err(storage)?;
        let st = s.stats().await.map_err(storage)?;
        out.push_str(&format!(
            "pending:      {} records ({} units ready or in processing, {} incomplete multipart groups, {} owing receipts), oldest {}\n",
            st.records,
            st.ready_units,
            st.incomplete_groups,
            st.receipt_requests,
            age(st.oldest_accepted_at)
        ));
        let replayed = s.replayed_frames();
        if replayed > 0 {
            out.push_str(&format!(
                "              {replayed} pending journal frames applied: commits after the last checkpoint of a gateway that did not stop cleanly\n"
            ));
        }
    }
    if dir.router_queue_path().exists() {
        let s = FileRouterQueueStore::open(&dir).map_err(storage)?;
        let st = s.stats().await.map_err(storage)?;
        out.push_str(&format!(
            "router-queue: {} staged units, selection cursor {}\n",
            st.staged,
            st.cursor.furthest()
        ));
    }
    if dir.dlr_path().exists() {
        let s = sendium_storage::file::FileDlrStore::open(&dir, dlr_retention(cfg)).map_err(storage)?;
        let st = sendium_storage::DlrStore::stats(&s).await.map_err(storage)?;
        out.push_str(&format!(
            "dlr:          {} messages awaiting provider receipts ({} correlations), {} receipts to deliver (oldest {}), {} unmatched receipts\n",
            st.awaiting_receipts,
            st.correlations,
            st.pending_deliveries,
            age(st.oldest_pending_delivery),
            st.orphans
        ));
    }
    if dir.routed_work_path().exists() {
        let s = FileRoutedWorkStore::open(&dir).map_err(storage)?;
        let st = s.stats().await.map_err(storage)?;
        let first = s.load_after(None, 1).await.map_err(storage)?;
        out.push_str(&format!(
            "routed-work:  {} units, {} open branches, oldest {}\n",
            st.units,
            st.open_branches,
            age(first.first().map(|u| u.routed_at))
        ));
    }
    Ok(out)
}

fn word_stage(s: &str) -> StageBackend {
    match s {
        "file" => StageBackend::File,
        "postgresql" => StageBackend::Postgresql,
        _ => StageBackend::Memory,
    }
}

fn word_dlr(s: &str) -> DlrBackend {
    match s {
        "file" => DlrBackend::File,
        "postgresql" => DlrBackend::Postgresql,
        "disabled" => DlrBackend::Disabled,
        _ => DlrBackend::Memory,
    }
}

/// The configuration with the stage backends the manifest recorded.
fn recorded_profile(cfg: &Config, m: &Manifest) -> Config {
    let mut c = cfg.clone();
    c.sms.pending.backend = word_stage(&m.pending);
    c.sms.router_queue.backend = word_stage(&m.router_queue);
    c.sms.routed_work.backend = word_stage(&m.routed_work);
    c.dlr.backend = word_dlr(&m.dlr);
    c
}

/// Run the profile recorded in the data directory, refusing new admissions, until
/// every stage is empty; then stop. Destinations, routes and listeners come from the
/// configuration (receipts still reach ESMEs that bind).
pub async fn drain(cfg: &Config, timeout: Option<Duration>) -> Result<(), StoresCliError> {
    // The postgresql stages keep their work in the database, with or without a data
    // directory: this configuration is the profile to finish.
    let in_database = cfg.sms.pending.backend == StageBackend::Postgresql;
    let Some(path) = cfg.storage.file.dir.as_ref().filter(|_| !in_database) else {
        if !in_database {
            return Err(StoresCliError::NoDir);
        }
        println!(
            "drain: running storage profile {} to finish the work in its database (new submissions are refused)",
            cfg.storage_profile()
        );
        return run_drain(cfg, cfg, timeout).await;
    };
    let recorded = {
        let dir = std::sync::Arc::new(DataDir::open(path).map_err(storage)?);
        let Some(m) = dir.manifest().map_err(storage)? else {
            println!("drain: {} has no manifest: nothing to drain", path.display());
            return Ok(());
        };
        let left = outstanding(&dir, &m, cfg).await.map_err(storage)?;
        if left.iter().all(|(_, n)| *n == 0) {
            println!("drain: every stage in {} is empty already", path.display());
            return Ok(());
        }
        recorded_profile(cfg, &m)
    };
    println!(
        "drain: running storage profile {} to finish the work in {} (new submissions are refused)",
        recorded.storage_profile(),
        path.display()
    );
    run_drain(&recorded, cfg, timeout).await
}

/// Run `recorded` without admissions until its stages are empty (see [`drain`]); `cfg`
/// is the profile that starts next.
async fn run_drain(recorded: &Config, cfg: &Config, timeout: Option<Duration>) -> Result<(), StoresCliError> {
    crate::serve::announce_profile(recorded);
    let gateway = Gateway::start_with(recorded, Mode::Drain).await?;
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    // A PostgreSQL DLR store the new profile keeps is not drained: it keeps its rows, and
    // other gateways sharing it may never let it run dry.
    let dlr_stays_in_database =
        recorded.dlr.backend == DlrBackend::Postgresql && cfg.dlr.backend == DlrBackend::Postgresql;
    // A durable DLR store is empty only when no message still waits for its provider
    // receipts either: that is what `outstanding` (and so the next start) counts.
    let dlr_durable = matches!(recorded.dlr.backend, DlrBackend::File | DlrBackend::Postgresql);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let s = gateway.snapshot().await;
        let pending = s
            .ingress
            .as_ref()
            .and_then(|i| i.pending.as_ref())
            .map(|p| p.records)
            .unwrap_or(0);
        let staged = s.selector.as_ref().map(|x| x.staged).unwrap_or(0);
        let routed = s.router.as_ref().map(|r| r.units).unwrap_or(0);
        let dlr = s
            .dlr
            .as_ref()
            .and_then(|d| d.store.as_ref())
            .filter(|_| !dlr_stays_in_database);
        let receipts = dlr.map(|d| d.pending_deliveries).unwrap_or(0);
        let awaiting = dlr.filter(|_| dlr_durable).map(|d| d.awaiting_receipts).unwrap_or(0);
        println!(
            "drain: pending {pending}, router-queue {staged}, routed-work {routed}, receipts to deliver {receipts}, \
             awaiting provider receipts {awaiting}"
        );
        if pending == 0 && staged == 0 && routed == 0 && receipts == 0 && awaiting == 0 && gateway.readiness().is_ok() {
            break;
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
            gateway.shutdown().await;
            return Err(storage("drain timed out with work left; run it again to continue"));
        }
    }
    gateway.shutdown().await;
    println!("drain: done — every stage is empty; start with the new profile");
    Ok(())
}
