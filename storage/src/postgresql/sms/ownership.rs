//! Which process works on what in a database's outbound stages: [`Ownership`].
//!
//! Every lock here is a transaction-level advisory lock held by a transaction left open
//! on a connection of its own, so it can never be stranded: if the process, its
//! connection or the server dies, PostgreSQL releases it, and no lease, heartbeat or
//! claim timestamp needs tuning. The transactions only ever run `SELECT`s, take no
//! snapshot between them (READ COMMITTED) and get no transaction id, so holding them
//! open does not hold back vacuum. They keep no session state, so they work through a
//! transaction-pooling PgBouncer too (each pins one server connection while it lasts).
//!
//! * The stages lock `(SEND, 1)`: a process serving the database alone
//!   ([`StageAccess::Sole`]) holds it exclusively; each of several processes sharing it
//!   ([`StageAccess::Shared`]) holds it shared. So a sole process and a shared one
//!   never run together, and the shared holders are the members, counted from
//!   `pg_locks` without any registry.
//! * The partition locks `(SEND, 256 + p)`, shared mode only: a process selects,
//!   routes and delivers the work of partition `p` only while it holds that lock. Each
//!   member takes free partitions up to its share (the partition count divided by the
//!   members, rounded up) and hands back what exceeds it: it stops selecting those
//!   partitions at once, the pipeline sees them [`Assignment::releasing`], and the
//!   lock's transaction ends only when the pipeline has settled its work there
//!   ([`Ownership::released`]), so two processes never submit the same branch
//!   concurrently. A member that dies releases its partitions with its connections;
//!   the others take them within [`CHECK_EVERY`] or two.
//!
//! The pipeline reads the [`Assignment`] on its own ticks (a level, not an edge): an
//! actor that restarts reads where things stand, and no notice can be lost.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection, Row};
use tokio::sync::mpsc;

use super::super::failure::{Location, failure};
use crate::error::{BackendFailure, FailureKind};

/// How a process uses a database's outbound stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StageAccess {
    /// Reads only (a profile check, a test's inspection): takes no lock.
    ReadOnly,
    /// The one process serving the database; every partition is its own.
    Sole,
    /// One of several processes serving the database, each working on the partitions
    /// it holds.
    Shared,
}

impl StageAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            StageAccess::ReadOnly => "read-only",
            StageAccess::Sole => "sole",
            StageAccess::Shared => "shared",
        }
    }
}

/// Sendium's advisory lock class ("SEND").
const LOCK_CLASS: i32 = 0x5345_4E44;
/// The stages lock's second key.
const LOCK_STAGES: i32 = 1;
/// Partition `p`'s lock is `(LOCK_CLASS, LOCK_PARTITION_BASE + p)`.
const LOCK_PARTITION_BASE: i32 = 256;
/// How often held locks are checked and partitions balanced.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long startup keeps trying a stages lock another process holds (one SIGKILLed a
/// moment ago holds it until the server notices its connection closed).
const TAKE_WITHIN: Duration = Duration::from_secs(3);

/// The partitions this process works on now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Held: select, route and deliver their work.
    pub active: Vec<u16>,
    /// Held, but being handed to another process: no new work from them; call
    /// [`Ownership::released`] once the work in hand there is settled. A partition in
    /// neither list is not held (any more): forget its work at once.
    pub releasing: Vec<u16>,
}

/// The partitions the stores' reads take work from.
#[derive(Debug)]
pub(crate) struct PartitionView {
    selectable: RwLock<Arc<[i16]>>,
}

impl PartitionView {
    fn new(partitions: impl IntoIterator<Item = u16>) -> Self {
        let view = Self {
            selectable: RwLock::new(Arc::from(Vec::new())),
        };
        view.set(partitions);
        view
    }

    /// The partitions to read work from now.
    pub(crate) fn selectable(&self) -> Arc<[i16]> {
        match self.selectable.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn set(&self, partitions: impl IntoIterator<Item = u16>) {
        let list: Arc<[i16]> = partitions.into_iter().filter_map(|p| i16::try_from(p).ok()).collect();
        match self.selectable.write() {
            Ok(mut g) => *g = list,
            Err(poisoned) => *poisoned.into_inner() = list,
        }
    }
}

/// What `/admin/cluster` shows of this process's ownership.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnershipStatus {
    /// `sole`, `shared` or `read-only`.
    pub access: &'static str,
    pub partitions: u16,
    /// Holding the stages lock (writes are refused while not).
    pub member: bool,
    /// Processes serving the database (shared mode; 1 when sole).
    pub members: u32,
    /// Partitions held, including those being handed back.
    pub held: Vec<u16>,
    pub releasing: Vec<u16>,
}

enum Command {
    Released(Vec<u16>),
}

/// This process's locks on a database's outbound stages, kept by a background task for
/// as long as this value lives.
#[derive(Debug)]
pub struct Ownership {
    access: StageAccess,
    partitions: u16,
    view: Arc<PartitionView>,
    member: Arc<AtomicBool>,
    status: Arc<Mutex<OwnershipStatus>>,
    commands: Option<mpsc::UnboundedSender<Command>>,
    task: Option<tokio::task::JoinHandle<()>>,
    loc: Location,
}

impl Drop for Ownership {
    fn drop(&mut self) {
        // Ending the task drops its connections: the server releases the locks.
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// A transaction left open on a connection of its own, holding an advisory lock.
struct HeldLock {
    conn: PgConnection,
}

impl HeldLock {
    /// Open a connection and try to take `(LOCK_CLASS, key)` in a transaction left open.
    async fn take(options: &PgConnectOptions, key: i32, shared: bool) -> Result<Option<Self>, sqlx::Error> {
        let mut conn = options.connect().await?;
        sqlx::query("BEGIN").execute(&mut conn).await?;
        let sql = if shared {
            "SELECT pg_try_advisory_xact_lock_shared($1, $2)"
        } else {
            "SELECT pg_try_advisory_xact_lock($1, $2)"
        };
        let got: bool = sqlx::query_scalar(sql)
            .bind(LOCK_CLASS)
            .bind(key)
            .fetch_one(&mut conn)
            .await?;
        if got {
            Ok(Some(Self { conn }))
        } else {
            let _ = conn.close().await;
            Ok(None)
        }
    }

    async fn alive(&mut self) -> bool {
        sqlx::query("SELECT 1").execute(&mut self.conn).await.is_ok()
    }

    /// End the transaction (and the session): the lock is released.
    async fn end(self) {
        let _ = self.conn.close().await;
    }
}

fn partition_key(p: u16) -> i32 {
    LOCK_PARTITION_BASE + i32::from(p)
}

impl Ownership {
    /// Reads only: every partition, no lock.
    pub(crate) fn read_only(partitions: u16, loc: Location) -> Self {
        Self::idle(StageAccess::ReadOnly, partitions, loc)
    }

    fn idle(access: StageAccess, partitions: u16, loc: Location) -> Self {
        Self {
            access,
            partitions,
            view: Arc::new(PartitionView::new(0..partitions)),
            member: Arc::new(AtomicBool::new(true)),
            status: Arc::new(Mutex::new(OwnershipStatus {
                access: access.as_str(),
                partitions,
                member: true,
                members: 1,
                held: (0..partitions).collect(),
                releasing: Vec::new(),
            })),
            commands: None,
            task: None,
            loc,
        }
    }

    /// Take the stages lock (exclusively for [`StageAccess::Sole`], shared for
    /// [`StageAccess::Shared`]) or refuse, naming who holds it; in shared mode also take
    /// this process's first share of free partitions before returning.
    pub(crate) async fn acquire(
        access: StageAccess,
        partitions: u16,
        options: PgConnectOptions,
        loc: Location,
    ) -> Result<Self, BackendFailure> {
        if access == StageAccess::ReadOnly {
            return Ok(Self::read_only(partitions, loc));
        }
        let shared = access == StageAccess::Shared;
        let deadline = tokio::time::Instant::now() + TAKE_WITHIN;
        let member = loop {
            if let Some(held) = HeldLock::take(&options, LOCK_STAGES, shared)
                .await
                .map_err(|e| failure(&loc, &e))?
            {
                break held;
            }
            if tokio::time::Instant::now() >= deadline {
                let why = if shared {
                    "a Sendium process serving this database alone runs its outbound stages \
                     ([storage.postgresql] shared = false there); every process on one database must set shared = true"
                } else {
                    "another Sendium process runs the outbound stages of this database; several processes on one \
                     database need [storage.postgresql] shared = true in each"
                };
                return Err(loc.failure(FailureKind::Locked, why));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let mut this = Self::idle(access, partitions, loc.clone());
        if shared {
            this.view.set([]);
        }
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let mut keeper = Keeper {
            options,
            loc,
            access,
            partitions,
            member: Some(member),
            held: BTreeMap::new(),
            releasing: BTreeSet::new(),
            members: 1,
            view: this.view.clone(),
            member_flag: this.member.clone(),
            status: this.status.clone(),
        };
        if shared {
            // The first share is taken before the pipeline starts.
            keeper.balance().await;
        }
        keeper.publish();
        this.commands = Some(commands_tx);
        this.task = Some(tokio::spawn(keeper.run(commands_rx)));
        Ok(this)
    }

    pub fn access(&self) -> StageAccess {
        self.access
    }

    /// How many partitions the database's work is spread over.
    pub fn partitions(&self) -> u16 {
        self.partitions
    }

    pub(crate) fn view(&self) -> Arc<PartitionView> {
        self.view.clone()
    }

    /// The partitions this process works on now.
    pub fn assignment(&self) -> Assignment {
        let s = self.status();
        Assignment {
            active: s.held.iter().copied().filter(|p| !s.releasing.contains(p)).collect(),
            releasing: s.releasing,
        }
    }

    /// The partition of a message to `destination` from `account` (see
    /// [`super::partition_of`]).
    pub fn partition_of(&self, account: &str, destination: &str) -> u16 {
        super::partition_of(account, destination, self.partitions)
    }

    /// The pipeline has settled its work in these partitions (listed as
    /// [`Assignment::releasing`]): their locks can go.
    pub fn released(&self, partitions: Vec<u16>) {
        if let Some(c) = &self.commands {
            let _ = c.send(Command::Released(partitions));
        }
    }

    pub fn status(&self) -> OwnershipStatus {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Refuse a write while this process does not hold the stages lock (its connection
    /// was lost and it is not taken again yet).
    pub(crate) fn check(&self) -> Result<(), BackendFailure> {
        if self.member.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err(self.loc.failure(
                FailureKind::Unavailable,
                "this process does not hold the outbound stages' lock on the database (its connection was lost)",
            ))
        }
    }
}

/// The background task's state.
struct Keeper {
    options: PgConnectOptions,
    loc: Location,
    access: StageAccess,
    partitions: u16,
    member: Option<HeldLock>,
    held: BTreeMap<u16, HeldLock>,
    releasing: BTreeSet<u16>,
    members: u32,
    view: Arc<PartitionView>,
    member_flag: Arc<AtomicBool>,
    status: Arc<Mutex<OwnershipStatus>>,
}

impl Keeper {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => self.check().await,
                cmd = commands.recv() => match cmd {
                    Some(Command::Released(ps)) => self.end(ps).await,
                    None => return,
                },
            }
            self.publish();
        }
    }

    /// Hand back partitions whose work the pipeline settled.
    async fn end(&mut self, ps: Vec<u16>) {
        for p in ps {
            if self.releasing.remove(&p)
                && let Some(lock) = self.held.remove(&p)
            {
                lock.end().await;
            }
        }
    }

    async fn check(&mut self) {
        self.keep_membership().await;
        if self.access != StageAccess::Shared {
            return;
        }
        let mut lost = Vec::new();
        for (p, lock) in &mut self.held {
            if !lock.alive().await {
                lost.push(*p);
            }
        }
        if !lost.is_empty() {
            for p in &lost {
                self.held.remove(p);
                self.releasing.remove(p);
            }
            self.view.set(self.active());
            tracing::warn!(database = %self.loc, partitions = ?lost, "lost partitions with their connections");
        }
        if self.member.is_some() {
            self.balance().await;
        }
    }

    /// Keep the stages lock; take it again after a lost connection.
    async fn keep_membership(&mut self) {
        if let Some(m) = &mut self.member
            && m.alive().await
        {
            return;
        }
        if self.member.take().is_some() {
            self.member_flag.store(false, Ordering::Release);
            tracing::warn!(database = %self.loc, "lost the connection holding the outbound stages' lock; taking it again");
        }
        match HeldLock::take(&self.options, LOCK_STAGES, self.access == StageAccess::Shared).await {
            Ok(Some(m)) => {
                self.member = Some(m);
                self.member_flag.store(true, Ordering::Release);
                tracing::info!(database = %self.loc, "holding the outbound stages' lock again");
            }
            Ok(None) => tracing::error!(
                database = %self.loc,
                "another Sendium process took the outbound stages' lock of this database; this process refuses \
                 every write to them"
            ),
            Err(e) => tracing::debug!(database = %self.loc, error = %e, "cannot take the stages' lock yet"),
        }
    }

    /// Partitions held and not being handed back.
    fn active(&self) -> Vec<u16> {
        self.held
            .keys()
            .copied()
            .filter(|p| !self.releasing.contains(p))
            .collect()
    }

    /// Take free partitions up to this process's share, or hand back what exceeds it.
    async fn balance(&mut self) {
        let Some(member) = &mut self.member else {
            return;
        };
        let Ok((members, taken)) = census(&mut member.conn).await else {
            return;
        };
        self.members = members.max(1);
        let share = usize::from(self.partitions).div_ceil(self.members as usize);
        let active = self.active();
        if active.len() < share {
            let mut adopted = Vec::new();
            let free: Vec<u16> = (0..self.partitions)
                .filter(|p| !self.held.contains_key(p) && !taken.contains(p))
                .collect();
            for p in free {
                if active.len() + adopted.len() >= share {
                    break;
                }
                match HeldLock::take(&self.options, partition_key(p), false).await {
                    Ok(Some(lock)) => {
                        self.held.insert(p, lock);
                        adopted.push(p);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::debug!(database = %self.loc, error = %e, "cannot take a partition now");
                        break;
                    }
                }
            }
            if !adopted.is_empty() {
                self.view.set(self.active());
                tracing::info!(partitions = ?adopted, members = self.members, "took partitions");
            }
        } else if active.len() > share {
            let surplus: Vec<u16> = active.iter().rev().take(active.len() - share).copied().collect();
            self.releasing.extend(surplus.iter().copied());
            self.view.set(self.active());
            tracing::info!(partitions = ?surplus, members = self.members, "handing partitions to another process");
        }
    }

    fn publish(&self) {
        let mut s = self.status.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        s.member = self.member.is_some();
        if self.access == StageAccess::Shared {
            s.members = self.members;
            s.held = self.held.keys().copied().collect();
            s.releasing = self.releasing.iter().copied().collect();
        }
    }
}

/// How many processes hold the stages lock shared, and which partitions anyone holds
/// (advisory locks belong to a database, but `pg_locks` lists every database's).
async fn census(conn: &mut PgConnection) -> Result<(u32, BTreeSet<u16>), sqlx::Error> {
    let rows = sqlx::query(
        "SELECT objid::int8 AS key FROM pg_locks \
         WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND classid = $1::int8::oid AND objsubid = 2 AND granted",
    )
    .bind(i64::from(LOCK_CLASS))
    .fetch_all(&mut *conn)
    .await?;
    let mut members = 0u32;
    let mut taken = BTreeSet::new();
    for row in rows {
        let key: i64 = row.try_get("key")?;
        if key == i64::from(LOCK_STAGES) {
            members += 1;
        } else if let Some(p) = key
            .checked_sub(i64::from(LOCK_PARTITION_BASE))
            .and_then(|p| u16::try_from(p).ok())
        {
            taken.insert(p);
        }
    }
    Ok((members, taken))
}

/// How many processes hold the stages lock shared.
pub(crate) async fn members(conn: &mut PgConnection) -> Result<u32, sqlx::Error> {
    Ok(census(conn).await?.0)
}

/// Who holds each partition, for `/admin/cluster`: the backend pid of the connection
/// holding its lock.
pub(crate) async fn holders(conn: &mut PgConnection) -> Result<BTreeMap<u16, i32>, sqlx::Error> {
    let rows = sqlx::query(
        "SELECT objid::int8 AS key, pid FROM pg_locks \
         WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND classid = $1::int8::oid AND objsubid = 2 AND granted AND objid >= $2::int8::oid",
    )
    .bind(i64::from(LOCK_CLASS))
    .bind(i64::from(LOCK_PARTITION_BASE))
    .fetch_all(&mut *conn)
    .await?;
    let mut out = BTreeMap::new();
    for row in rows {
        let key: i64 = row.try_get("key")?;
        if let Some(p) = key
            .checked_sub(i64::from(LOCK_PARTITION_BASE))
            .and_then(|p| u16::try_from(p).ok())
        {
            out.insert(p, row.try_get::<i32, _>("pid")?);
        }
    }
    Ok(out)
}
