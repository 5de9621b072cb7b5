//! A throwaway PostgreSQL cluster for tests: `cargo test` needs no manual setup.
//!
//! [`TestCluster::start`] runs the machine's own `initdb` on a fresh temporary
//! directory and starts the server with `pg_ctl` on 127.0.0.1 and a free port, with
//! `fsync=on` (the durability the postgresql backend claims is the one tested). Tests
//! share one cluster per test binary ([`TestCluster::shared`]) and isolate themselves
//! with a new database each ([`TestCluster::fresh_database`]).
//!
//! * Binaries are found through `pg_config --bindir`, then `PATH`, then
//!   `/usr/lib/postgresql/*/bin` (newest first). A machine without PostgreSQL fails
//!   the tests loudly, naming what it looked for — never a silent skip.
//! * `initdb` and `pg_ctl` refuse to run as root. Under root they run as the
//!   `postgres` user (through `CommandExt::uid`/`gid`, which also drops root's
//!   supplementary groups), and the cluster's directory is owned by that user. As any
//!   other user they simply run as that user.
//! * Clean-up: dropping a `TestCluster` stops the server (`pg_ctl stop -m immediate`)
//!   and deletes the directory. The shared cluster lives in a static, which is never
//!   dropped, so every cluster also has a watchdog: a small `sh` holding the read end
//!   of a pipe whose write end only this process has. When the process ends — normally,
//!   by panic or by SIGKILL — the pipe closes and the watchdog stops the server and
//!   removes the directory. Nothing is left behind.

use std::fmt;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::chown;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// The superuser `initdb` creates (trust authentication on loopback).
pub const USER: &str = "sendium";
/// The database created at start; [`TestCluster::url`] points at it.
pub const DATABASE: &str = "sendium";

/// Why a cluster could not be started or used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterError(String);

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgreSQL test cluster: {}", self.0)
    }
}

impl std::error::Error for ClusterError {}

fn err(msg: impl Into<String>) -> ClusterError {
    ClusterError(msg.into())
}

/// A running throwaway PostgreSQL cluster.
#[derive(Debug)]
pub struct TestCluster {
    base: PathBuf,
    data: PathBuf,
    sockets: PathBuf,
    log: PathBuf,
    port: u16,
    bindir: PathBuf,
    /// uid/gid to run the server tools as (set when this process is root).
    owner: Option<(u32, u32)>,
    next_db: AtomicU64,
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
}

impl TestCluster {
    /// Start a new cluster, or panic with the reason (a test without its database must
    /// fail, loudly).
    pub fn start() -> TestCluster {
        match Self::try_start() {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    /// The cluster shared by every test of this process (started on first use).
    pub fn shared() -> &'static TestCluster {
        static SHARED: OnceLock<Result<TestCluster, ClusterError>> = OnceLock::new();
        match SHARED.get_or_init(Self::try_start) {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        }
    }

    pub fn try_start() -> Result<TestCluster, ClusterError> {
        let bindir = find_bindir()?;
        let owner = if rustix::process::geteuid().is_root() {
            Some(postgres_user()?)
        } else {
            None
        };
        let base = make_base_dir()?;
        let mut cluster = TestCluster {
            data: base.join("data"),
            sockets: base.join("sockets"),
            log: base.join("server.log"),
            base,
            port: 0,
            bindir,
            owner,
            next_db: AtomicU64::new(0),
            watchdog: Mutex::new(None),
        };
        // From here on, Drop cleans up whatever was created.
        std::fs::create_dir(&cluster.sockets).map_err(|e| err(format!("creating {:?}: {e}", cluster.sockets)))?;
        if let Some((uid, gid)) = owner {
            for dir in [&cluster.base, &cluster.sockets] {
                chown(dir, Some(uid), Some(gid)).map_err(|e| err(format!("chown {dir:?} to postgres: {e}")))?;
            }
        }
        cluster.spawn_watchdog()?;
        let initdb = cluster
            .server_tool("initdb")
            .arg("-D")
            .arg(&cluster.data)
            .args(["-A", "trust", "-U", USER, "-E", "UTF8", "--locale=C"])
            .output();
        check("initdb", initdb)?;
        // A free port can be taken by someone else before the server binds it: retry.
        let mut last = None;
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.start_server() {
                Ok(()) => {
                    last = None;
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            return Err(e);
        }
        cluster.create_database(DATABASE)?;
        Ok(cluster)
    }

    /// `postgres://sendium@127.0.0.1:PORT/sendium`.
    pub fn url(&self) -> String {
        self.url_for(DATABASE)
    }

    pub fn url_for(&self, database: &str) -> String {
        format!("postgres://{USER}@127.0.0.1:{}/{database}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (data directory, sockets, server log); removed on drop.
    pub fn dir(&self) -> &Path {
        &self.base
    }

    /// A new, empty database; returns its URL. Panics on failure (test helper).
    pub fn fresh_database(&self) -> String {
        match self.try_fresh_database() {
            Ok(url) => url,
            Err(e) => panic!("{e}"),
        }
    }

    pub fn try_fresh_database(&self) -> Result<String, ClusterError> {
        let n = self.next_db.fetch_add(1, Ordering::Relaxed);
        let name = format!("test_{n}");
        self.create_database(&name)?;
        Ok(self.url_for(&name))
    }

    /// Stop the server as a crash would (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint; the next start runs crash recovery). For failure tests.
    pub fn stop_server(&self) -> Result<(), ClusterError> {
        let out = self
            .server_tool("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
        check("pg_ctl stop", out).map(|_| ())
    }

    /// Start the server again (same port) after [`stop_server`](Self::stop_server).
    pub fn start_server(&self) -> Result<(), ClusterError> {
        let mut options = format!(
            "-k '{}' -p {} -c listen_addresses=127.0.0.1 -c fsync=on -c max_connections=200",
            self.sockets.display(),
            self.port
        );
        // Statement counts for the benchmark, where the server ships the module.
        if self.has_pg_stat_statements() {
            options.push_str(" -c shared_preload_libraries=pg_stat_statements");
        }
        let out = self
            .server_tool("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(&self.log)
            .args(["-w", "-t", "60", "-o", &options, "start"])
            .output();
        check("pg_ctl start", out).map(|_| ()).map_err(|e| {
            let mut log = String::new();
            let _ = std::fs::File::open(&self.log).and_then(|mut f| f.read_to_string(&mut log));
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            err(format!("{}\nserver log {:?}:\n{}", e.0, self.log, tail.join("\n")))
        })
    }

    /// Whether the server's library directory has `pg_stat_statements` (preloaded when
    /// it does; `CREATE EXTENSION pg_stat_statements` in a database then shows what ran).
    pub fn has_pg_stat_statements(&self) -> bool {
        self.bindir
            .parent()
            .is_some_and(|root| root.join("lib").join("pg_stat_statements.so").exists())
    }

    /// The server's process id (the postmaster; its backends are its children).
    pub fn server_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    fn create_database(&self, name: &str) -> Result<(), ClusterError> {
        let out = Command::new(self.bindir.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", USER, name])
            .current_dir(&self.base)
            .output();
        check(&format!("createdb {name}"), out).map(|_| ())
    }

    /// A server-side tool, run as the cluster's owner.
    fn server_tool(&self, name: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(name));
        // The owner may not be allowed into the test's working directory.
        cmd.current_dir(&self.base).stdin(Stdio::null());
        // Its own process group: a terminal's Ctrl-C reaches the test, whose exit
        // then lets the watchdog stop the server in order.
        cmd.process_group(0);
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn spawn_watchdog(&self) -> Result<(), ClusterError> {
        let script = r#"cat >/dev/null; "$0" -D "$1" -m immediate -w stop >/dev/null 2>&1; rm -rf "$2""#;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .arg(self.bindir.join("pg_ctl"))
            .arg(&self.data)
            .arg(&self.base)
            .current_dir(&self.base)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        if let Some((uid, gid)) = self.owner {
            cmd.uid(uid).gid(gid);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| err(format!("starting the clean-up watchdog (sh): {e}")))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| err("the clean-up watchdog has no stdin"))?;
        *self.watchdog.lock() = Some((child, stdin));
        Ok(())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        match self.watchdog.lock().take() {
            Some((mut child, stdin)) => {
                // EOF: the watchdog stops the server and removes the directory.
                drop(stdin);
                let _ = child.wait();
            }
            None => {
                let _ = self.stop_server();
                let _ = std::fs::remove_dir_all(&self.base);
            }
        }
    }
}

fn check(what: &str, out: std::io::Result<Output>) -> Result<Output, ClusterError> {
    let out = out.map_err(|e| err(format!("running {what}: {e}")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

fn has_server_tools(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("pg_ctl").is_file()
}

/// Where `initdb` and `pg_ctl` are: `pg_config --bindir`, `PATH`, or the Debian layout.
fn find_bindir() -> Result<PathBuf, ClusterError> {
    let pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    find_bindir_in(pg_config, std::env::var_os("PATH"), Path::new("/usr/lib/postgresql"))
}

fn find_bindir_in(
    pg_config_bindir: Option<PathBuf>,
    path: Option<std::ffi::OsString>,
    versions_root: &Path,
) -> Result<PathBuf, ClusterError> {
    if let Some(dir) = pg_config_bindir
        && has_server_tools(&dir)
    {
        return Ok(dir);
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(&path) {
            if has_server_tools(&dir) {
                // Follow a symlinked initdb to the real directory, where createdb is too.
                return Ok(std::fs::canonicalize(dir.join("initdb"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                    .filter(|d| has_server_tools(d))
                    .unwrap_or(dir));
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(versions_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            has_server_tools(&bin).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        err(
            "PostgreSQL server binaries (initdb, pg_ctl) not found: looked in `pg_config --bindir`, \
             PATH and /usr/lib/postgresql/*/bin. The postgresql backend's tests need a real server and \
             are never skipped; install it (Debian: apt-get install postgresql).",
        )
    })
}

/// uid and gid of the `postgres` user, to run the server tools as when we are root.
fn postgres_user() -> Result<(u32, u32), ClusterError> {
    let id = |flag: &str| -> Result<u32, ClusterError> {
        let out = Command::new("id").args([flag, "postgres"]).output();
        let out = check(&format!("id {flag} postgres"), out).map_err(|e| {
            err(format!(
                "running as root, and initdb refuses to run as root; no `postgres` user to run it as \
                 (the postgresql package creates one): {e}"
            ))
        })?;
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .map_err(|e| err(format!("id {flag} postgres: {e}")))
    };
    Ok((id("-u")?, id("-g")?))
}

/// A new private directory under the system temp dir.
fn make_base_dir() -> Result<PathBuf, ClusterError> {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    for _ in 0..100 {
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sendium-pg-{}-{nanos:x}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err(format!("creating {dir:?}: {e}"))),
        }
    }
    Err(err("could not create a temporary directory"))
}

fn free_port() -> Result<u16, ClusterError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| err(format!("finding a free port: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_installation_is_a_loud_error() {
        let empty = std::env::temp_dir().join(format!("sendium-no-pg-{}", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let e = find_bindir_in(Some(empty.clone()), Some(empty.clone().into_os_string()), &empty).unwrap_err();
        std::fs::remove_dir_all(&empty).unwrap();
        let msg = e.to_string();
        assert!(msg.contains("initdb") && msg.contains("never skipped"), "{msg}");
    }

    #[test]
    fn the_newest_debian_version_is_found() {
        let root = std::env::temp_dir().join(format!("sendium-fake-pg-{}", std::process::id()));
        for v in ["9", "15", "13"] {
            let bin = root.join(v).join("bin");
            std::fs::create_dir_all(&bin).unwrap();
            std::fs::write(bin.join("initdb"), "").unwrap();
            std::fs::write(bin.join("pg_ctl"), "").unwrap();
        }
        let found = find_bindir_in(None, None, &root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(found, root.join("15").join("bin"));
    }

    #[test]
    fn dropping_a_cluster_stops_it_and_removes_its_directory() {
        let c = TestCluster::start();
        let (dir, port) = (c.dir().to_path_buf(), c.port());
        assert!(dir.join("data").join("PG_VERSION").is_file());
        assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        drop(c);
        assert!(!dir.exists(), "{dir:?} removed");
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "server stopped"
        );
    }
}
