//! The running gateway: stores opened, the actor tree started, listeners bound.
//!
//! `ops` builds one [`Gateway`] from a validated configuration and serves the admin
//! endpoints from the views it offers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use sendium_profiles::{Config, DlrBackend, Guarantee, RouteTable, StorageProfile};
use sendium_protocols::auth_guard::AuthGuard;
use sendium_protocols::http::{HttpAccess, HttpIngressConfig};
use sendium_protocols::http_listener::{self, ListenerLimits};
use sendium_protocols::smpp::server::{self, AccountBook, ServerConfig, SessionRegistry};
use sendium_storage::postgresql::StageAccess;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::context::{Restarts, Shared, Stopping};
use crate::destination_worker::{WorkerMsg, WorkerStatus};
use crate::directory::Directory;
use crate::dlr_correlator::{DlrMsg, DlrStatus};
use crate::health::Health;
use crate::http_ingress::HttpIngress;
use crate::inbound::{LiveMo, MoSettings};
use crate::ingress::{IngressMsg, IngressStatus};
use crate::outbox_relay::{OutboxConfigError, OutboxRelays, SourceView};
use crate::reload::{self, ConfigView, LiveConfig, ReloadError, ReloadSummary};
use crate::router::{RouterMsg, RouterStatus};
use crate::selector::{SelectorMsg, SelectorStatus};
use crate::smpp_ingress::SmppIngress;
use crate::spec::{DestinationSpec, GatewaySpec};
use crate::stores::{OpenError, Stores};
use crate::supervisor::{ActorEntry, DestinationChanges, Supervisor, SupervisorArgs, SupervisorMsg};
use crate::tls::TlsIdentities;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("cannot open storage: {0}")]
    Storage(#[from] OpenError),
    #[error("{0}")]
    Profile(#[from] sendium_profiles::ConfigError),
    #[error("cannot start the actor system: {0}")]
    Actors(String),
    #[error("invalid {0}")]
    Outbox(#[from] OutboxConfigError),
    #[error("invalid {0}")]
    MoRoutes(#[from] sendium_profiles::MoRouteError),
    #[error("{0}")]
    Tls(#[from] sendium_protocols::tls::TlsError),
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Everything an operator's dashboards read, gathered from the actors.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub ingress: Option<IngressStatus>,
    pub selector: Option<SelectorStatus>,
    pub router: Option<RouterStatus>,
    pub dlr: Option<DlrStatus>,
    pub workers: Vec<(String, Option<WorkerStatus>)>,
    pub restarts: u64,
    pub smpp_sessions: usize,
}

/// One line of `/admin/destinations`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DestinationEntry {
    pub name: String,
    /// `bound`, `reconnecting`, `retiring` (a reload removed or changed it: its worker
    /// finishes what it has in flight), or `unknown` while its worker does not answer.
    pub state: &'static str,
    /// When it entered that state (RFC 3339), and how many seconds ago.
    pub since: Option<String>,
    pub for_seconds: Option<u64>,
    /// Branches its worker holds: being submitted, or waiting to be retried.
    pub open_branches: u64,
    /// Branches queued for it, beyond what its worker holds at once.
    pub queued: u64,
    /// Branches that wait for it to become reachable (it is their first preference).
    pub waiting: u64,
    /// Submissions sent and not answered yet.
    pub parts_in_flight: u64,
    /// HTTP destinations: requests since the worker started, by the class they ended
    /// in (`2xx`, `4xx`, `429`, `5xx`, `timeout`, `error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_requests: Option<std::collections::BTreeMap<&'static str, u64>>,
}

impl Snapshot {
    /// The destinations, from the Router's and the workers' views.
    pub fn destinations(&self) -> Vec<DestinationEntry> {
        let now = std::time::SystemTime::now();
        self.workers
            .iter()
            .map(|(name, w)| {
                let routed = self
                    .router
                    .as_ref()
                    .and_then(|r| r.destinations.iter().find(|d| &d.name == name));
                let since = w.as_ref().and_then(|w| w.since);
                DestinationEntry {
                    name: name.clone(),
                    state: match w {
                        Some(w) if w.retiring => "retiring",
                        Some(w) if w.up => "bound",
                        Some(_) => "reconnecting",
                        None => "unknown",
                    },
                    since: since.map(|at| humantime::format_rfc3339_seconds(now - at.elapsed()).to_string()),
                    for_seconds: since.map(|at| at.elapsed().as_secs()),
                    open_branches: w.as_ref().map_or(0, |w| w.branches),
                    queued: routed.map_or(0, |d| d.queued),
                    waiting: routed.map_or(0, |d| d.waiting),
                    parts_in_flight: w.as_ref().map_or(0, |w| w.parts_in_flight),
                    http_requests: w
                        .as_ref()
                        .and_then(|w| w.http_results.as_ref())
                        .map(|r| r.iter().copied().collect()),
                }
            })
            .collect()
    }
}

/// What an orderly stop found when it ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// Everything the stop waits for finished before the timeout.
    pub drained: bool,
    /// Acknowledged messages not completed (pending records), and how many of them
    /// asked for a receipt.
    pub messages_left: u64,
    pub messages_owing_receipts: u64,
    /// Receipts of the DLR store: owed (waiting for the provider's receipt) or not
    /// delivered yet.
    pub receipts_left: u64,
    /// Provider submissions without their `submit_sm_resp`, and receipt deliveries
    /// (callbacks, deliver_sm) in progress.
    pub in_flight_left: u64,
}

impl StopReport {
    fn of(s: &Snapshot, durable: bool) -> StopReport {
        let pending = s.ingress.as_ref().and_then(|i| i.pending.as_ref());
        let messages_left = pending.map_or(0, |p| p.records);
        let messages_owing_receipts = pending.map_or(0, |p| p.receipt_requests);
        let store = s.dlr.as_ref().and_then(|d| d.store.as_ref());
        let undelivered = store.map_or(0, |d| d.pending_deliveries);
        let receipts_left = store.map_or(0, |d| d.awaiting_receipts) + undelivered;
        let in_flight_left = s
            .workers
            .iter()
            .filter_map(|(_, w)| w.as_ref())
            .map(|w| w.parts_in_flight)
            .sum::<u64>()
            + s.dlr.as_ref().map_or(0, |d| d.deliveries_in_flight);
        // Durable: what is in flight finishes, the rest waits in the stores. Memory: the
        // pipeline sends what it acknowledged and delivers the receipts it has.
        let drained = if durable {
            in_flight_left == 0
        } else {
            messages_left == 0 && undelivered == 0 && in_flight_left == 0
        };
        StopReport {
            drained,
            messages_left,
            messages_owing_receipts,
            receipts_left,
            in_flight_left,
        }
    }
}

/// `/admin/cluster`: this process's share of the database its outbound stages are on.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ClusterView {
    /// `host:port/database`.
    pub database: String,
    /// `sole` (this process alone serves the database) or `shared`.
    pub access: &'static str,
    /// Processes serving the database now.
    pub members: u32,
    /// Holding the database's stages lock (writes are refused while not).
    pub member: bool,
    pub partitions: u16,
    /// Partitions this process works on, and those it is handing to another process.
    pub held: Vec<u16>,
    pub releasing: Vec<u16>,
    /// Who holds each partition (shared only).
    pub holders: Vec<PartitionHolder>,
    /// Why `holders` could not be read, if it could not.
    pub holders_error: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct PartitionHolder {
    pub partition: u16,
    /// `this process`, `another process` or `nobody` (between two holders).
    pub held_by: &'static str,
    /// The database backend pid of the holding connection.
    pub backend_pid: Option<i32>,
}

/// How the gateway runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Serve,
    /// Admission refuses everything; the rest of the pipeline runs until the stores
    /// are empty (`sendium drain`).
    Drain,
}

pub struct Gateway {
    shared: Arc<Shared>,
    spec: Arc<GatewaySpec>,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_task: parking_lot::Mutex<Option<JoinHandle<()>>>,
    shutdown: CancellationToken,
    /// Cancelled first by [`Gateway::stop`]: the outbox relays admit nothing more.
    outbox_stop: CancellationToken,
    listeners: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    profile: StorageProfile,
    guarantee: Guarantee,
    smpp_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    outbox: OutboxRelays,
    live: LiveConfig,
    reloading: tokio::sync::Mutex<()>,
    /// The listeners' TLS identities, swapped by reloads.
    tls: TlsIdentities,
    smpp_tls_addr: Option<SocketAddr>,
}

impl Gateway {
    /// Open the selected stores, start the actors, and bind the listeners.
    pub async fn start(cfg: &Config) -> Result<Gateway, GatewayError> {
        Self::start_with(cfg, Mode::Serve).await
    }

    /// Start in a mode: serving, or draining (no new admissions: the pipeline finishes
    /// what the stores hold).
    pub async fn start_with(cfg: &Config, mode: Mode) -> Result<Gateway, GatewayError> {
        let profile = cfg.storage_profile();
        let guarantee = sendium_profiles::check_supported(&profile)?;
        let tls = TlsIdentities::load(cfg)?;
        let stores = Stores::open(cfg).await?;
        let mut spec = GatewaySpec::new(cfg, stores);
        spec.accepting = mode == Mode::Serve;
        let spec = Arc::new(spec);
        let shared = Arc::new(Shared {
            dir: Directory::new(cfg.destinations.iter().map(|d| d.name.clone())),
            links: crate::context::DestinationLinks::default(),
            health: Health::default(),
            sessions: SessionRegistry::new(),
            restarts: Restarts::default(),
            dlr_enabled: cfg.dlr.backend != DlrBackend::Disabled,
            partitions: spec
                .stores
                .database
                .as_ref()
                .map(|db| db.ownership())
                .filter(|o| o.access() == StageAccess::Shared),
            stopping: Stopping::default(),
            mo: LiveMo::new(MoSettings::from_config(cfg)?),
            schedule_horizon: crate::context::schedule_horizon(cfg),
        });
        reserve_recovered_receipts(&spec).await;
        let (supervisor, supervisor_task) = Actor::spawn(
            Some("supervisor".to_string()),
            Supervisor,
            SupervisorArgs {
                shared: shared.clone(),
                spec: spec.clone(),
            },
        )
        .await
        .map_err(|e| GatewayError::Actors(e.to_string()))?;
        let shutdown = CancellationToken::new();
        let mut listeners = Vec::new();
        // Failed binds and API keys back off per address, SMPP and HTTP together.
        let auth_guard = Arc::new(AuthGuard::new());
        let mut smpp_addr = None;
        let mut smpp_tls_addr = None;
        let mut account_book = None;
        let mut http_access = None;
        let mut provider_receipts = None;
        if let Some(smpp) = &cfg.smpp {
            let listener = TcpListener::bind(smpp.listen)
                .await
                .map_err(|source| GatewayError::Listen {
                    what: "smpp.listen",
                    addr: smpp.listen,
                    source,
                })?;
            smpp_addr = listener.local_addr().ok();
            let tls_listener = match (&smpp.tls, &tls.smpp) {
                (Some(t), Some(identity)) => {
                    let l = TcpListener::bind(t.listen)
                        .await
                        .map_err(|source| GatewayError::Listen {
                            what: "smpp.tls.listen",
                            addr: t.listen,
                            source,
                        })?;
                    smpp_tls_addr = l.local_addr().ok();
                    Some((l, identity.clone()))
                }
                _ => None,
            };
            let book = AccountBook::new(&reload::smpp_accounts(smpp));
            account_book = Some(book.clone());
            let config = Arc::new(ServerConfig {
                auth: auth_guard.clone(),
                system_id: "sendium".into(),
                max_connections: usize::try_from(smpp.max_connections).unwrap_or(1024),
                max_unbound: usize::try_from(smpp.max_unbound).unwrap_or(256),
                max_unbound_per_address: usize::try_from(smpp.max_unbound_per_address).unwrap_or(16),
                max_command_length: smpp.max_command_length,
                window: usize::try_from(smpp.window).unwrap_or(100),
                bind_timeout: smpp.bind_timeout,
                idle_timeout: smpp.idle_timeout,
                deliver_timeout: smpp.deliver_timeout,
                accounts: book,
            });
            let handler = Arc::new(SmppIngress::new(shared.clone(), spec.multipart_expiry));
            let registry = shared.sessions.clone();
            let token = shutdown.clone();
            listeners.push(tokio::spawn(async move {
                if let Err(e) = server::serve_with_tls(listener, tls_listener, config, handler, registry, token).await {
                    tracing::error!(error = %e, "SMPP listener stopped");
                }
            }));
        }
        let mut http_addr = None;
        if let Some(http) = &cfg.http {
            let listener = TcpListener::bind(http.listen)
                .await
                .map_err(|source| GatewayError::Listen {
                    what: "http.listen",
                    addr: http.listen,
                    source,
                })?;
            http_addr = listener.local_addr().ok();
            let (keys, max_tps) = reload::http_access(cfg, http);
            let access = HttpAccess::new(keys, max_tps);
            http_access = Some(access.clone());
            let receipts = Arc::new(crate::provider_receipts::ProviderReceipts::new(cfg));
            provider_receipts = Some(receipts.clone());
            let app = sendium_protocols::http::router(
                HttpIngressConfig {
                    access,
                    max_body_bytes: http.max_body_bytes,
                    callback_targets: spec.callback_targets.clone(),
                    auth: auth_guard.clone(),
                    body_timeout: http.body_timeout,
                },
                Arc::new(
                    HttpIngress::new(shared.clone(), receipts)
                        .multipart_expiry(spec.multipart_expiry)
                        .routes(spec.routes.clone()),
                ),
            );
            let limits = ListenerLimits {
                max_connections: usize::try_from(http.max_connections).unwrap_or(1024),
                header_timeout: http.header_timeout,
            };
            listeners.push(tokio::spawn(http_listener::serve_with_tls(
                listener,
                app,
                limits,
                tls.http.clone().map(|identity| (identity, "http")),
                shutdown.clone(),
            )));
        }
        // A draining gateway admits nothing: its sources wait for the next serving one.
        let outbox_stop = shutdown.child_token();
        let outbox = if mode == Mode::Serve {
            let (relays, tasks) = OutboxRelays::start(cfg, shared.clone(), spec.receipt_policy, &outbox_stop)
                .inspect_err(|_| {
                    shutdown.cancel();
                })?;
            listeners.extend(tasks);
            relays
        } else {
            OutboxRelays::none()
        };
        let live = LiveConfig::new(
            cfg.clone(),
            account_book,
            http_access,
            provider_receipts,
            spec.routes.clone(),
            shared.sessions.clone(),
        );
        Ok(Gateway {
            live,
            reloading: tokio::sync::Mutex::new(()),
            tls,
            smpp_tls_addr,
            outbox,
            outbox_stop,
            http_addr,
            shared,
            spec,
            supervisor,
            supervisor_task: parking_lot::Mutex::new(Some(supervisor_task)),
            shutdown,
            listeners: parking_lot::Mutex::new(listeners),
            profile,
            guarantee,
            smpp_addr,
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    pub fn profile(&self) -> &StorageProfile {
        &self.profile
    }

    pub fn guarantee(&self) -> &Guarantee {
        &self.guarantee
    }

    pub fn smpp_addr(&self) -> Option<SocketAddr> {
        self.smpp_addr
    }

    /// The SMPP TLS listener's address (`[smpp.tls]`).
    pub fn smpp_tls_addr(&self) -> Option<SocketAddr> {
        self.smpp_tls_addr
    }

    /// The listeners' TLS identities (the admin listener, started outside, takes its own).
    pub fn tls(&self) -> &TlsIdentities {
        &self.tls
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    pub fn multipart_expiry(&self) -> Duration {
        self.spec.multipart_expiry
    }

    /// The database's outbound stages as this process shares them; `None` unless they
    /// are on postgresql.
    pub async fn cluster(&self) -> Option<ClusterView> {
        let db = self.spec.stores.database.as_ref()?;
        let status = db.ownership().status();
        let (holders, holders_error) = if status.access == StageAccess::Shared.as_str() {
            match db.partition_holders().await {
                Ok(by) => (
                    (0..status.partitions)
                        .map(|p| PartitionHolder {
                            partition: p,
                            held_by: match by.get(&p) {
                                None => "nobody",
                                Some(_) if status.held.contains(&p) => "this process",
                                Some(_) => "another process",
                            },
                            backend_pid: by.get(&p).copied(),
                        })
                        .collect(),
                    None,
                ),
                Err(e) => (Vec::new(), Some(e.to_string())),
            }
        } else {
            (Vec::new(), None)
        };
        Some(ClusterView {
            database: db.location(),
            access: status.access,
            members: status.members,
            member: status.member,
            partitions: status.partitions,
            held: status.held,
            releasing: status.releasing,
            holders,
            holders_error,
        })
    }

    /// Ready: stores healthy and startup reconciliation done. Otherwise the reasons.
    pub fn readiness(&self) -> Result<(), Vec<String>> {
        let reasons = self.shared.health.not_ready_reasons();
        if reasons.is_empty() { Ok(()) } else { Err(reasons) }
    }

    /// Swap in a reloaded configuration's destinations, routes, accounts and API keys,
    /// or refuse it whole (see [`crate::reload`]). The outbox relays take the new
    /// account list too. One reload at a time.
    pub async fn reload(&self, new: Config) -> Result<ReloadSummary, ReloadError> {
        let _one_at_a_time = self.reloading.lock().await;
        let destinations_differ = self.live.check(&new)?;
        // Certificates are read before anything changes: a bad file refuses the reload.
        let identities = self
            .tls
            .prepare(&new)
            .map_err(|e| ReloadError::Invalid(e.to_string()))?;
        let routes = RouteTable::from_config(&new);
        let mo = MoSettings::from_config(&new).map_err(|e| ReloadError::Invalid(e.to_string()))?;
        let changes = if destinations_differ {
            let destinations = new.destinations.iter().map(|d| DestinationSpec::new(&new, d)).collect();
            match self
                .supervisor
                .call(
                    |reply| SupervisorMsg::Reconfigure {
                        destinations,
                        routes,
                        reply,
                    },
                    Some(Duration::from_secs(30)),
                )
                .await
            {
                Ok(ractor::rpc::CallResult::Success(changes)) => changes,
                Ok(_) => return Err(ReloadError::Destinations("the supervisor did not answer".into())),
                Err(e) => return Err(ReloadError::Destinations(e.to_string())),
            }
        } else {
            self.live.replace_routes(routes);
            DestinationChanges::default()
        };
        let accounts = new
            .smpp
            .iter()
            .flat_map(|s| s.accounts.iter().map(|a| a.system_id.clone()))
            .collect();
        self.shared.mo.replace(mo);
        TlsIdentities::apply(identities);
        let mut summary = self.live.commit(new);
        summary.destinations = changes;
        self.outbox.set_accounts(accounts);
        Ok(summary)
    }

    /// `/admin/mo`: inbound routes and their counts.
    pub fn mo_view(&self) -> crate::inbound::MoView {
        self.shared.mo.view()
    }

    /// `/admin/config`.
    pub fn config_view(&self) -> ConfigView {
        self.live.view()
    }

    /// Outbox sources whose database does not answer. The gateway stays ready: SMPP
    /// and HTTP admissions, and every other source, do not depend on them.
    pub fn degraded(&self) -> Vec<String> {
        self.outbox.unreachable()
    }

    /// `/admin/outbox`: every outbox source's state.
    pub fn outbox(&self) -> Vec<SourceView> {
        self.outbox.views()
    }

    pub async fn actors(&self) -> Vec<ActorEntry> {
        self.supervisor
            .call(SupervisorMsg::Actors, Some(Duration::from_secs(5)))
            .await
            .ok()
            .and_then(|r| match r {
                ractor::rpc::CallResult::Success(v) => Some(v),
                _ => None,
            })
            .unwrap_or_default()
    }

    pub async fn snapshot(&self) -> Snapshot {
        let t = Duration::from_millis(500);
        let dir = &self.shared.dir;
        let mut workers = Vec::new();
        for (name, mb) in dir.workers() {
            workers.push((name, mb.call(WorkerMsg::Status, t).await.ok()));
        }
        Snapshot {
            ingress: dir.ingress.call(IngressMsg::Status, t).await.ok(),
            selector: dir.selector.call(SelectorMsg::Status, t).await.ok(),
            router: dir.router.call(RouterMsg::Status, t).await.ok(),
            dlr: if self.shared.dlr_enabled {
                dir.dlr.call(DlrMsg::Status, t).await.ok()
            } else {
                None
            },
            workers,
            restarts: self.shared.restarts.total(),
            smpp_sessions: self.shared.sessions.sessions().len(),
        }
    }

    /// A token cancelled when the gateway shuts down (for listeners started outside).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Run a listener task that shutdown waits for.
    pub fn add_listener(&self, task: JoinHandle<()>) {
        self.listeners.lock().push(task);
    }

    /// An orderly stop within `timeout`: refuse new admissions (SMPP, HTTP, outbox),
    /// then wait — on a durable profile for the provider submissions and receipt
    /// deliveries in flight (new submissions are held: they stay in the stages for the
    /// next start); on a memory pending stage for the pipeline to send everything it
    /// acknowledged and deliver the receipts it holds — and then [`Gateway::shutdown`].
    /// What could not finish in time is logged as counts.
    pub async fn stop(&self, timeout: Duration) -> StopReport {
        let deadline = tokio::time::Instant::now() + timeout;
        self.shared.stopping.refuse_admissions();
        self.outbox_stop.cancel();
        let durable = self.guarantee.durable;
        if durable {
            self.shared.stopping.hold_submissions();
        }
        tracing::info!(
            timeout_s = timeout.as_secs_f64(),
            durable,
            "stopping: admissions refused, waiting for work in flight"
        );
        let dlr_durable = matches!(self.profile.dlr, DlrBackend::File | DlrBackend::Postgresql);
        let report = loop {
            let report = StopReport::of(&self.snapshot().await, durable);
            if report.drained || tokio::time::Instant::now() >= deadline {
                break report;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if !durable && report.messages_left > 0 {
            tracing::warn!(
                messages = report.messages_left,
                owing_receipts = report.messages_owing_receipts,
                "stopping with acknowledged messages the memory pending stage cannot keep: dropped"
            );
        }
        if !dlr_durable && report.receipts_left > 0 {
            tracing::warn!(
                receipts = report.receipts_left,
                "stopping with receipts the memory DLR store cannot keep (owed or undelivered): dropped"
            );
        }
        if durable {
            tracing::info!(
                in_flight = report.in_flight_left,
                messages = report.messages_left,
                drained = report.drained,
                "stopped: unfinished messages stay in the stores for the next start"
            );
        }
        self.shutdown().await;
        report
    }

    /// Stop accepting, unbind sessions, stop the actors.
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        let listeners: Vec<JoinHandle<()>> = std::mem::take(&mut *self.listeners.lock());
        for l in listeners {
            let _ = tokio::time::timeout(Duration::from_secs(5), l).await;
        }
        let _ = self
            .supervisor
            .call(SupervisorMsg::Shutdown, Some(Duration::from_secs(5)))
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.supervisor.stop(Some("shutdown".into()));
        let task = self.supervisor_task.lock().take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
        }
        self.outbox.close().await;
    }
}

/// A bounded memory DLR store starts empty, but a durable pending stage may hold
/// recovered messages that still owe receipts: reserve their capacity so new
/// admissions cannot crowd them out.
async fn reserve_recovered_receipts(spec: &GatewaySpec) {
    let Some(gate) = &spec.reservations else {
        return;
    };
    if let Ok(stats) = spec.stores.pending.stats().await
        && stats.receipt_requests > 0
    {
        gate.force_reserve(stats.receipt_requests);
    }
}
