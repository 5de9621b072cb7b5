//! Opening the selected backend of each stage, and the profile-change policy.
//!
//! Only what the configuration selected is opened, and only combinations that profile
//! validation accepted reach this point; a backend that cannot be opened stops startup
//! with an error that names it (and the file).
//!
//! The data directory records the profile that wrote it (its manifest). Starting with
//! a different profile while a stage that would change backend still holds durable
//! records is refused: those records would be abandoned, or their guarantee silently
//! downgraded. The operator finishes them first with `sendium drain`, which runs the
//! recorded profile until every stage is empty. Adding durability (a memory stage
//! becoming `file`) abandons nothing and is allowed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sendium_profiles::{Config, DlrBackend, StageBackend};
use sendium_storage::file::{
    DataDir, FileDlrStore, FilePendingStore, FileRoutedWorkStore, FileRouterQueueStore, Manifest,
};
use sendium_storage::memory::{
    MemoryDlrStore, MemoryPendingStore, MemoryRoutedWorkStore, MemoryRouterQueueStore, PendingLimits,
};
use sendium_storage::postgresql::{PgStageOptions, PgStages, PostgresDlrStore, StageAccess};
use sendium_storage::{BackendFailure, DlrRetention, DlrStore, PendingStore, RoutedWorkStore, RouterQueueStore};

/// The four stages' stores. They outlive every actor: the supervisor hands the same
/// store to each incarnation of its owner.
#[derive(Clone)]
pub struct Stores {
    pub pending: Arc<dyn PendingStore>,
    pub router_queue: Arc<dyn RouterQueueStore>,
    pub routed_work: Arc<dyn RoutedWorkStore>,
    /// `None` when DLR handling is disabled.
    pub dlr: Option<Arc<dyn DlrStore>>,
    /// The locked data directory, when a file backend is in use.
    pub data_dir: Option<Arc<DataDir>>,
    /// The database of the postgresql outbound stages, when they are in use.
    pub database: Option<Arc<PgStages>>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{key} = \"{backend}\" is not available in this build")]
    NotAvailable { key: &'static str, backend: &'static str },
    #[error("{0}")]
    Backend(#[from] BackendFailure),
    #[error(
        "data directory {dir} holds outstanding records written by storage profile {previous} ({outstanding}); \
         this configuration selects {requested}. Nothing is abandoned silently: finish that work first with \
         `sendium drain --config FILE` (it runs the recorded profile until every stage is empty), then start \
         with the new profile"
    )]
    ProfileChanged {
        dir: PathBuf,
        previous: String,
        requested: String,
        outstanding: String,
    },
    #[error(
        "data directory {dir} was last started with a postgresql backend; to change it, keep \
         storage.postgresql.url configured so Sendium can check that database holds no work still owed \
         (and `sendium drain --config FILE` can finish it)"
    )]
    RecordedDatabaseUnknown { dir: PathBuf },
    #[error("storage.file.dir is required because a stage uses the file backend")]
    NoDataDir,
    #[error("storage.postgresql.url is required because a stage uses the postgresql backend")]
    NoDatabase,
    #[error(
        "database {database} holds {records} outstanding messages of the postgresql outbound stages; this \
         configuration selects {requested}. Nothing is abandoned silently: finish them first with \
         `sendium drain --config FILE` using the postgresql configuration, then start with the new profile"
    )]
    DatabaseHoldsWork {
        database: String,
        records: u64,
        requested: String,
    },
}

fn unavailable(key: &'static str, b: StageBackend) -> OpenError {
    OpenError::NotAvailable {
        key,
        backend: b.as_str(),
    }
}

/// The limits every pending backend applies.
pub fn pending_limits(cfg: &Config) -> PendingLimits {
    PendingLimits {
        max_records: u64::try_from(cfg.sms.pending.max_messages).unwrap_or(u64::MAX),
        idempotency_retention: cfg
            .http
            .as_ref()
            .map(|h| h.idempotency_retention)
            .unwrap_or(PendingLimits::default().idempotency_retention),
    }
}

/// Retention settings of the DLR store.
pub fn dlr_retention(cfg: &Config) -> DlrRetention {
    DlrRetention {
        retention: cfg.dlr.retention,
        orphan_retention: cfg.dlr.orphan_retention,
    }
}

/// The manifest a configuration writes.
pub fn manifest_of(cfg: &Config) -> Manifest {
    Manifest::new(
        cfg.sms.pending.backend.as_str(),
        cfg.sms.router_queue.backend.as_str(),
        cfg.sms.routed_work.backend.as_str(),
        cfg.dlr.backend.as_str(),
    )
}

fn profile_text(m: &Manifest) -> String {
    format!("{}/{}/{} + dlr {}", m.pending, m.router_queue, m.routed_work, m.dlr)
}

fn uses_file(cfg: &Config) -> bool {
    [
        cfg.sms.pending.backend,
        cfg.sms.router_queue.backend,
        cfg.sms.routed_work.backend,
    ]
    .contains(&StageBackend::File)
        || cfg.dlr.backend == DlrBackend::File
}

/// Outstanding records per stage in the durable stores a manifest describes: the
/// stages whose backend is `file`, and a `postgresql` DLR store that `cfg` moves away
/// from (what a profile change could abandon; one that stays keeps its rows, and may be
/// shared with other gateways still writing to it). The DLR database is the one `cfg`
/// names: it must still be configured, and be the same, when the DLR leaves it. Its
/// count covers the whole database, so with several gateways sharing it, theirs too.
pub async fn outstanding(
    dir: &Arc<DataDir>,
    m: &Manifest,
    cfg: &Config,
) -> Result<Vec<(&'static str, u64)>, OpenError> {
    let limits = pending_limits(cfg);
    let retention = dlr_retention(cfg);
    let mut out = Vec::new();
    if m.pending == "file" && dir.pending_path().exists() {
        let s = FilePendingStore::open(dir, limits)?;
        out.push(("pending", s.stats().await.map_err(|e| failure(e.into()))?.records));
    }
    if m.router_queue == "file" && dir.router_queue_path().exists() {
        let s = FileRouterQueueStore::open(dir)?;
        out.push(("router-queue", s.stats().await.map_err(|e| failure(e.into()))?.staged));
    }
    if m.routed_work == "file" && dir.routed_work_path().exists() {
        let s = FileRoutedWorkStore::open(dir)?;
        out.push(("routed-work", s.stats().await.map_err(|e| failure(e.into()))?.units));
    }
    if m.dlr == "file" && dir.dlr_path().exists() {
        let s = FileDlrStore::open(dir, retention)?;
        let st = s.stats().await.map_err(|e| failure(e.into()))?;
        out.push(("dlr", st.awaiting_receipts + st.pending_deliveries));
    }
    if m.pending == "postgresql" && cfg.sms.pending.backend != StageBackend::Postgresql {
        let url = cfg
            .storage
            .postgresql
            .url
            .as_ref()
            .ok_or(OpenError::RecordedDatabaseUnknown {
                dir: dir.path().to_path_buf(),
            })?;
        let readonly = PgStageOptions {
            access: StageAccess::ReadOnly,
            ..stage_options(cfg)
        };
        let pg = PgStages::connect(url.expose(), readonly).await?;
        let counts = async {
            let pending = pg.pending.stats().await.map_err(|e| failure(e.into()))?.records;
            let staged = pg.router_queue.stats().await.map_err(|e| failure(e.into()))?.staged;
            let routed = pg.routed_work.stats().await.map_err(|e| failure(e.into()))?.units;
            Ok::<_, OpenError>((pending, staged, routed))
        }
        .await;
        pg.close().await;
        let (pending, staged, routed) = counts?;
        out.push(("pending (postgresql)", pending));
        out.push(("router-queue (postgresql)", staged));
        out.push(("routed-work (postgresql)", routed));
    }
    if m.dlr == "postgresql" && cfg.dlr.backend != DlrBackend::Postgresql {
        let url = cfg
            .storage
            .postgresql
            .url
            .as_ref()
            .ok_or(OpenError::RecordedDatabaseUnknown {
                dir: dir.path().to_path_buf(),
            })?;
        let s = PostgresDlrStore::connect(url.expose(), 1, retention).await?;
        let st = s.stats().await.map_err(|e| failure(e.into()));
        s.close().await;
        let st = st?;
        out.push(("dlr (postgresql)", st.awaiting_receipts + st.pending_deliveries));
    }
    Ok(out)
}

fn failure(e: sendium_storage::StorageError) -> OpenError {
    OpenError::Backend(e.failure().clone())
}

/// Refuse a profile change that would abandon durable records. Returns the stages
/// still holding records (empty when the change is safe).
async fn check_profile_change(dir: &Arc<DataDir>, cfg: &Config) -> Result<(), OpenError> {
    let Some(previous) = dir.manifest()? else {
        return Ok(());
    };
    let requested = manifest_of(cfg);
    // A stage leaves a durable backend: a file, or (the DLR store) a PostgreSQL database,
    // which outlives the process like a file.
    let changed = |old: &str, new: &str| old != new && matches!(old, "file" | "postgresql");
    let at_risk = changed(&previous.pending, &requested.pending)
        || changed(&previous.router_queue, &requested.router_queue)
        || changed(&previous.routed_work, &requested.routed_work)
        || changed(&previous.dlr, &requested.dlr)
        // With the pending stage moving, everything staged or routed goes with it.
        || (previous.pending != requested.pending && previous.pending == "file");
    if !at_risk {
        return Ok(());
    }
    let counts = outstanding(dir, &previous, cfg).await?;
    let held: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(stage, n)| format!("{stage}: {n}"))
        .collect();
    if held.is_empty() {
        return Ok(());
    }
    Err(OpenError::ProfileChanged {
        dir: dir.path().to_path_buf(),
        previous: profile_text(&previous),
        requested: profile_text(&requested),
        outstanding: held.join(", "),
    })
}

/// The connection settings of the PostgreSQL outbound stages.
pub fn stage_options(cfg: &Config) -> PgStageOptions {
    let pg = &cfg.storage.postgresql;
    PgStageOptions {
        schema: pg.schema.clone(),
        partitions: pg.partitions,
        access: if pg.shared {
            StageAccess::Shared
        } else {
            StageAccess::Sole
        },
        ..PgStageOptions::new(cfg.storage.postgresql.max_connections, pending_limits(cfg))
    }
}

/// Leaving the PostgreSQL outbound stages while the configured database still holds
/// their messages is refused, as leaving a data directory with records is: the
/// database is where the postgresql profile keeps its work, with or without a data
/// directory (and its manifest) beside it.
async fn check_database_profile(cfg: &Config) -> Result<(), OpenError> {
    if cfg.sms.pending.backend == StageBackend::Postgresql {
        return Ok(());
    }
    let Some(url) = cfg.storage.postgresql.url.as_ref().filter(|u| !u.is_empty()) else {
        return Ok(());
    };
    let readonly = PgStageOptions {
        access: StageAccess::ReadOnly,
        ..stage_options(cfg)
    };
    let pg = PgStages::connect(url.expose(), readonly).await?;
    let records = pg.pending.stats().await.map_err(|e| failure(e.into()))?.records;
    pg.close().await;
    if records == 0 {
        return Ok(());
    }
    Err(OpenError::DatabaseHoldsWork {
        database: pg.location(),
        records,
        requested: profile_text(&manifest_of(cfg)),
    })
}

/// Lock the configured data directory when the profile (or a previous one) uses it.
fn data_dir(cfg: &Config) -> Result<Option<Arc<DataDir>>, OpenError> {
    let dir: Option<&Path> = cfg.storage.file.dir.as_deref();
    match dir {
        Some(d) if uses_file(cfg) || d.join("manifest.json").exists() => Ok(Some(Arc::new(DataDir::open(d)?))),
        Some(_) => Ok(None),
        None if uses_file(cfg) => Err(OpenError::NoDataDir),
        None => Ok(None),
    }
}

impl Stores {
    pub async fn open(cfg: &Config) -> Result<Stores, OpenError> {
        let limits = pending_limits(cfg);
        let data_dir = data_dir(cfg)?;
        if let Some(dir) = &data_dir {
            check_profile_change(dir, cfg).await?;
        }
        let dir = || data_dir.clone().ok_or(OpenError::NoDataDir);
        check_database_profile(cfg).await?;
        // The PostgreSQL stages come as a set (the only profile with them is
        // postgresql/postgresql/postgresql), on one pool.
        let pg = if cfg.sms.pending.backend == StageBackend::Postgresql {
            let url = cfg.storage.postgresql.url.as_ref().ok_or(OpenError::NoDatabase)?;
            Some(Arc::new(PgStages::connect(url.expose(), stage_options(cfg)).await?))
        } else {
            None
        };
        let pending: Arc<dyn PendingStore> = match (cfg.sms.pending.backend, &pg) {
            (StageBackend::Memory, _) => Arc::new(MemoryPendingStore::new(limits)),
            (StageBackend::File, _) => Arc::new(FilePendingStore::open(&dir()?, limits)?),
            (StageBackend::Postgresql, Some(pg)) => pg.pending.clone(),
            (b, _) => return Err(unavailable("sms.pending.backend", b)),
        };
        let router_queue: Arc<dyn RouterQueueStore> = match (cfg.sms.router_queue.backend, &pg) {
            (StageBackend::Memory, _) => Arc::new(MemoryRouterQueueStore::new()),
            (StageBackend::File, _) => Arc::new(FileRouterQueueStore::open(&dir()?)?),
            (StageBackend::Postgresql, Some(pg)) => pg.router_queue.clone(),
            (b, _) => return Err(unavailable("sms.router-queue.backend", b)),
        };
        let routed_work: Arc<dyn RoutedWorkStore> = match (cfg.sms.routed_work.backend, &pg) {
            (StageBackend::Memory, _) => Arc::new(MemoryRoutedWorkStore::new()),
            (StageBackend::File, _) => Arc::new(FileRoutedWorkStore::open(&dir()?)?),
            (StageBackend::Postgresql, Some(pg)) => pg.routed_work.clone(),
            (b, _) => return Err(unavailable("sms.routed-work.backend", b)),
        };
        let retention = dlr_retention(cfg);
        let dlr: Option<Arc<dyn DlrStore>> = match cfg.dlr.backend {
            DlrBackend::Memory => Some(Arc::new(MemoryDlrStore::new(
                u64::try_from(cfg.dlr.capacity).unwrap_or(u64::MAX),
                retention,
            ))),
            DlrBackend::Disabled => None,
            DlrBackend::File => {
                let store = FileDlrStore::open(&dir()?, retention)?;
                // This process holds the directory's lock: claims in the file are a
                // killed predecessor's, and their receipts go again now, not after the lease.
                let released = store
                    .release_claims(cfg.dlr.claim_lease)
                    .await
                    .map_err(|e| failure(e.into()))?;
                if released > 0 {
                    tracing::info!(
                        released,
                        "receipt deliveries interrupted by the last stop are due again"
                    );
                }
                Some(Arc::new(store))
            }
            DlrBackend::Postgresql => {
                let url = cfg.storage.postgresql.url.as_ref().ok_or(OpenError::NoDatabase)?;
                Some(Arc::new(
                    PostgresDlrStore::connect(url.expose(), cfg.storage.postgresql.max_connections, retention).await?,
                ))
            }
        };
        if let Some(dir) = &data_dir {
            dir.file_stages_opened();
            dir.write_manifest(&manifest_of(cfg))?;
        }
        Ok(Stores {
            pending,
            router_queue,
            routed_work,
            dlr,
            data_dir,
            database: pg,
        })
    }
}
