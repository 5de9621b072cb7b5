//! Running the real `sendium` binary.
//!
//! ```no_run
//! # async fn demo() {
//! use sendium_integration_tests::gateway::GatewayProcess;
//! let smsc_port = 2776; // e.g. TestSmsc::port()
//! let gw = GatewayProcess::builder(r#"
//!     [sms.pending]
//!     backend = "file"
//!     [storage.file]
//!     dir = "{data_dir}"
//!     [smpp]
//!     listen = "127.0.0.1:{smpp_port}"
//!     [http]
//!     listen = "127.0.0.1:{http_port}"
//!     [admin]
//!     listen = "127.0.0.1:{admin_port}"
//!     [[destinations]]
//!     name = "upstream-a"
//!     kind = "smpp"
//!     host = "127.0.0.1"
//!     port = {smsc_port}
//! "#)
//! .smsc_port(smsc_port)
//! .env("SENDIUM_FAILPOINT", "after-admit@50")
//! .start()
//! .await;
//! # }
//! ```
//!
//! ## Template placeholders
//!
//! | placeholder | replaced with |
//! |---|---|
//! | `{smpp_port}` | a free port for `[smpp] listen` |
//! | `{http_port}` | a free port for `[http] listen` |
//! | `{admin_port}` | a free port for `[admin] listen` (readiness is polled there) |
//! | `{data_dir}` | `<tempdir>/data`, created, kept across [`GatewayProcess::restart`] |
//! | `{smsc_port}` | the port given with [`GatewayBuilder::smsc_port`] |
//! | `{name}` | anything given with [`GatewayBuilder::var`] |
//!
//! Ports are picked up front (bind 127.0.0.1:0, read the port, release it; never the same
//! port twice in one test process) and stay the same across restarts. A `{word}` that is
//! not a known placeholder is an error (a typo would otherwise reach the binary); TOML
//! inline tables (`{ a = 1 }`) are left alone.
//!
//! The binary: `$SENDIUM_BIN` if set, else `sendium` in the target directory of the
//! running executable (test executables live in `target/<profile>/deps/`). Its stdout and
//! stderr go to files in the temp dir; they are printed when a test panics while the
//! gateway is alive (set `SENDIUM_KEEP_TMP=1` to keep the temp dir too).

use std::collections::HashSet;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::http::{self, HttpResponse};

/// Default time to wait for `/readyz`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The ports the gateway listens on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub smpp: u16,
    pub http: u16,
    pub admin: u16,
}

fn handed_out() -> &'static Mutex<HashSet<u16>> {
    static PORTS: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    PORTS.get_or_init(|| Mutex::new(HashSet::new()))
}

/// The lowest port [`free_port`] hands out.
const FIRST_TEST_PORT: u16 = 20_000;

/// The first port of the kernel's ephemeral range, from which outgoing connections and
/// listeners on port 0 take theirs.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A currently free port on 127.0.0.1. Never returns the same port twice in one process,
/// so parallel tests do not collide with each other.
///
/// The port lies below the kernel's ephemeral range: a gateway killed and restarted on
/// its ports would otherwise find one taken by some outgoing connection (its own to the
/// test SMSC, say) that was given it while nothing listened there. Each process starts
/// its scan at a point of its own, so concurrent test processes rarely try the same
/// ports. Where the ephemeral range leaves no room below it, the port is an ephemeral one.
pub fn free_port() -> u16 {
    let end = ephemeral_start();
    let mut handed = handed_out().lock().expect("port registry");
    if let Some(span) = end.checked_sub(FIRST_TEST_PORT).filter(|&span| span >= 1_000) {
        let span = u32::from(span);
        let start = std::process::id().wrapping_mul(2_654_435_761) % span;
        for step in 0..span {
            let Ok(offset) = u16::try_from((start + step) % span) else {
                break;
            };
            let port = FIRST_TEST_PORT + offset;
            if !handed.contains(&port) && TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).is_ok() {
                handed.insert(port);
                return port;
            }
        }
    }
    loop {
        let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local address").port();
        drop(listener);
        if handed.insert(port) {
            return port;
        }
    }
}

/// A port on 127.0.0.1 where nothing will ever listen while this is alive: a bound,
/// never listening socket holds it, so connections to it are refused and the OS hands it
/// to no other socket (a port from [`free_port`] is free only until something binds it).
#[derive(Debug)]
pub struct ClosedPort {
    socket: tokio::net::TcpSocket,
}

impl ClosedPort {
    pub fn new() -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0).into())?;
        Ok(Self { socket })
    }

    pub fn port(&self) -> std::io::Result<u16> {
        Ok(self.socket.local_addr()?.port())
    }
}

/// Replaces `{name}` placeholders with `vars`. An unknown `{identifier}` is an error that
/// names it and the known ones.
pub fn render_template(template: &str, vars: &[(&str, String)]) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let ident_len = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let is_placeholder = ident_len > 0
            && after[ident_len..].starts_with('}')
            && after
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !is_placeholder {
            out.push('{');
            rest = after;
            continue;
        }
        let name = &after[..ident_len];
        match vars.iter().find(|(n, _)| *n == name) {
            Some((_, value)) => out.push_str(value),
            None => {
                let known: Vec<&str> = vars.iter().map(|(n, _)| *n).collect();
                return Err(format!(
                    "config template uses {{{name}}}, which is not a known placeholder (known: {})",
                    known.join(", ")
                ));
            }
        }
        rest = &after[ident_len + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Where the `sendium` binary is: `$SENDIUM_BIN`, else next to the running executable's
/// target directory. `Err` explains how to build it.
pub fn locate_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SENDIUM_BIN") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!("SENDIUM_BIN={} does not exist", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    let candidate = dir.join(format!("sendium{}", std::env::consts::EXE_SUFFIX));
    if candidate.is_file() {
        Ok(candidate)
    } else {
        Err(format!(
            "the sendium binary is missing at {}: build it first: cargo build -p sendium-ops (cargo test --workspace does this), or set SENDIUM_BIN",
            candidate.display()
        ))
    }
}

/// A `std::process::Command` for the `sendium` binary (for CLI tests such as
/// `sendium check-config FILE`). Panics with build instructions if it is missing.
pub fn sendium_command() -> Command {
    let bin = locate_binary().unwrap_or_else(|e| panic!("{e}"));
    Command::new(bin)
}

/// Builder for [`GatewayProcess`].
#[derive(Debug, Clone)]
pub struct GatewayBuilder {
    template: String,
    env: Vec<(String, String)>,
    vars: Vec<(String, String)>,
    smsc_port: Option<u16>,
    ready_timeout: Duration,
    ports: Option<Ports>,
}

impl GatewayBuilder {
    pub fn env(mut self, key: &str, value: &str) -> GatewayBuilder {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The value of `{smsc_port}`.
    pub fn smsc_port(mut self, port: u16) -> GatewayBuilder {
        self.smsc_port = Some(port);
        self
    }

    /// An extra placeholder `{name}` (e.g. a second SMSC's port, a callback URL).
    pub fn var(mut self, name: &str, value: &str) -> GatewayBuilder {
        self.vars.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn ready_timeout(mut self, timeout: Duration) -> GatewayBuilder {
        self.ready_timeout = timeout;
        self
    }

    /// Use these ports instead of picking free ones.
    pub fn ports(mut self, ports: Ports) -> GatewayBuilder {
        self.ports = Some(ports);
        self
    }

    /// Writes the config and spawns the process without waiting for readiness (for
    /// startup-failure tests: follow with [`GatewayProcess::wait_exit`]).
    pub fn spawn(self) -> GatewayProcess {
        let bin = locate_binary().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix("sendium-it-")
            .tempdir()
            .expect("create temp dir");
        let data_dir = dir.path().join("data");
        fs::create_dir_all(&data_dir).expect("create data dir");
        let ports = self.ports.unwrap_or_else(|| Ports {
            smpp: free_port(),
            http: free_port(),
            admin: free_port(),
        });
        let mut vars: Vec<(&str, String)> = vec![
            ("smpp_port", ports.smpp.to_string()),
            ("http_port", ports.http.to_string()),
            ("admin_port", ports.admin.to_string()),
            ("data_dir", data_dir.display().to_string()),
        ];
        if let Some(port) = self.smsc_port {
            vars.push(("smsc_port", port.to_string()));
        }
        for (name, value) in &self.vars {
            vars.push((name.as_str(), value.clone()));
        }
        let config = render_template(&self.template, &vars).unwrap_or_else(|e| panic!("{e}"));
        let config_path = dir.path().join("sendium.toml");
        fs::write(&config_path, &config).expect("write config");
        let mut gateway = GatewayProcess {
            dir: Some(dir),
            bin,
            config_path,
            data_dir,
            config,
            ports,
            env: self.env,
            child: None,
            starts: 0,
            ready_timeout: self.ready_timeout,
        };
        gateway.spawn_child();
        gateway
    }

    /// Spawns the process and waits until `/readyz` answers 200 (panics with the log if it
    /// exits or the timeout passes).
    ///
    /// A port picked by [`free_port`] is free when picked, but an outgoing connection of
    /// any process on the machine may be given it as its local port before the gateway
    /// binds it (the kernel hands out ephemeral ports from the same range). A gateway
    /// that exits because a listen address is taken is therefore started again on fresh
    /// ports, up to three times, when the ports were picked here.
    pub async fn start(self) -> GatewayProcess {
        let fresh_ports = self.ports.is_none();
        let mut attempts = 0;
        loop {
            let mut gateway = self.clone().spawn();
            match gateway.ready_or_exit().await {
                Ok(()) => return gateway,
                Err(_) if fresh_ports && attempts < 3 && gateway.log_report().contains("Address already in use") => {
                    attempts += 1;
                }
                Err(status) => panic!(
                    "sendium exited with {status} before becoming ready\n{}",
                    gateway.log_report()
                ),
            }
        }
    }
}

/// A running (or exited) `sendium serve` process.
#[derive(Debug)]
pub struct GatewayProcess {
    dir: Option<tempfile::TempDir>,
    bin: PathBuf,
    config_path: PathBuf,
    data_dir: PathBuf,
    config: String,
    ports: Ports,
    env: Vec<(String, String)>,
    child: Option<Child>,
    starts: u32,
    ready_timeout: Duration,
}

impl GatewayProcess {
    /// A builder for `config_template` (see the module docs for placeholders).
    pub fn builder(config_template: &str) -> GatewayBuilder {
        GatewayBuilder {
            template: config_template.to_owned(),
            env: Vec::new(),
            vars: Vec::new(),
            smsc_port: None,
            ready_timeout: READY_TIMEOUT,
            ports: None,
        }
    }

    /// Writes the config, starts `sendium serve --config FILE` with `env` added, and waits
    /// for readiness. A template using `{smsc_port}` needs [`GatewayProcess::builder`].
    pub async fn start(config_template: &str, env: &[(&str, &str)]) -> GatewayProcess {
        let mut builder = GatewayProcess::builder(config_template);
        for (key, value) in env {
            builder = builder.env(key, value);
        }
        builder.start().await
    }

    fn dir(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).unwrap_or_else(|| Path::new("."))
    }

    fn stdout_path(&self) -> PathBuf {
        self.dir().join(format!("stdout.{}.log", self.starts))
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir().join(format!("stderr.{}.log", self.starts))
    }

    fn spawn_child(&mut self) {
        self.starts += 1;
        let stdout = fs::File::create(self.stdout_path()).expect("create stdout log");
        let stderr = fs::File::create(self.stderr_path()).expect("create stderr log");
        let mut command = Command::new(&self.bin);
        command
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .env("NO_COLOR", "1");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// Polls `GET /readyz` until 200. Panics (with the log) if the process exits first or
    /// the ready timeout passes.
    pub async fn wait_ready(&mut self) {
        if let Err(status) = self.ready_or_exit().await {
            panic!(
                "sendium exited with {status} before becoming ready\n{}",
                self.log_report()
            );
        }
    }

    /// Polls `GET /readyz` until 200, or until the process exits (its status). Panics
    /// (with the log) if the ready timeout passes.
    async fn ready_or_exit(&mut self) -> Result<(), ExitStatus> {
        let deadline = Instant::now() + self.ready_timeout;
        let mut last;
        loop {
            if let Some(status) = self.try_wait() {
                return Err(status);
            }
            match http::request_with_timeout(self.admin_addr(), "GET", "/readyz", &[], None, Duration::from_secs(2))
                .await
            {
                Ok(resp) if resp.status == 200 => return Ok(()),
                Ok(resp) => last = format!("{} {}", resp.status, resp.text()),
                Err(e) => last = e.to_string(),
            }
            if Instant::now() >= deadline {
                panic!(
                    "sendium not ready after {:?} (last /readyz: {last})\n{}",
                    self.ready_timeout,
                    self.log_report()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn ports(&self) -> Ports {
        self.ports
    }

    pub fn smpp_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.ports.smpp))
    }

    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.ports.http))
    }

    pub fn admin_addr(&self) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.ports.admin))
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The rendered configuration.
    pub fn config(&self) -> &str {
        &self.config
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How many times the process was started (1 + restarts).
    pub fn starts(&self) -> u32 {
        self.starts
    }

    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_wait().is_none()
    }

    /// SIGTERM: an orderly stop (see [`sigterm`]); then [`GatewayProcess::wait_exit`].
    pub fn terminate(&self) -> bool {
        self.pid().is_some_and(sigterm)
    }

    /// SIGKILL (`Child::kill` is SIGKILL on Unix) and reap.
    pub fn kill(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the process to exit by itself (e.g. a `SENDIUM_FAILPOINT` kill).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if self.child.is_none() || Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Kills the process if it still runs, then starts it again with the same config,
    /// ports and data dir and waits for readiness. The environment is kept except
    /// `SENDIUM_FAILPOINT` (the usual flow is crash, then recover); use
    /// [`GatewayProcess::restart_with_env`] to choose.
    pub async fn restart(&mut self) {
        let env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| k != "SENDIUM_FAILPOINT")
            .cloned()
            .collect();
        self.restart_with(env).await;
    }

    /// Like [`GatewayProcess::restart`] with exactly this environment (added to the
    /// inherited one).
    pub async fn restart_with_env(&mut self, env: &[(&str, &str)]) {
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        self.restart_with(env).await;
    }

    async fn restart_with(&mut self, env: Vec<(String, String)>) {
        self.kill();
        self.env = env;
        self.spawn_child();
        self.wait_ready().await;
    }

    /// `GET path` on the admin port: (status, body).
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        match http::get(self.admin_addr(), path).await {
            Ok(resp) => (resp.status, resp.text()),
            Err(e) => panic!("GET {path} on the admin port failed: {e}\n{}", self.log_report()),
        }
    }

    /// `GET path` on the admin port with a bearer token.
    pub async fn admin_get_with_token(&self, path: &str, token: &str) -> (u16, String) {
        let auth = format!("Bearer {token}");
        match http::request(self.admin_addr(), "GET", path, &[("Authorization", &auth)], None).await {
            Ok(resp) => (resp.status, resp.text()),
            Err(e) => panic!("GET {path} on the admin port failed: {e}\n{}", self.log_report()),
        }
    }

    /// `POST /v1/messages` with `Authorization: Bearer api_key` and the JSON body.
    pub async fn post_message(&self, api_key: &str, json: &str) -> std::io::Result<HttpResponse> {
        self.post_message_with(api_key, json, &[]).await
    }

    /// `POST /v1/messages` with extra headers (e.g. `Idempotency-Key`).
    pub async fn post_message_with(
        &self,
        api_key: &str,
        json: &str,
        headers: &[(&str, &str)],
    ) -> std::io::Result<HttpResponse> {
        let auth = format!("Bearer {api_key}");
        let mut all: Vec<(&str, &str)> = vec![("Authorization", &auth)];
        all.extend_from_slice(headers);
        http::post_json(self.http_addr(), "/v1/messages", &all, json).await
    }

    /// stdout and stderr of every run so far, oldest first.
    pub fn log(&self) -> String {
        let mut out = String::new();
        for run in 1..=self.starts {
            for stream in ["stdout", "stderr"] {
                let path = self.dir().join(format!("{stream}.{run}.log"));
                let text = fs::read_to_string(&path).unwrap_or_default();
                if !text.is_empty() {
                    out.push_str(&format!("--- run {run} {stream} ---\n{text}"));
                    if !text.ends_with('\n') {
                        out.push('\n');
                    }
                }
            }
        }
        out
    }

    fn log_report(&self) -> String {
        format!(
            "--- sendium log ({}) ---\n{}--- end of sendium log ---",
            self.dir().display(),
            self.log()
        )
    }

    /// Prints the log to stderr (the test harness shows it for failed tests).
    pub fn dump_log(&self) {
        eprintln!("{}", self.log_report());
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            self.dump_log();
            if std::env::var_os("SENDIUM_KEEP_TMP").is_some()
                && let Some(dir) = self.dir.take()
            {
                let kept = dir.keep();
                eprintln!("kept {}", kept.display());
            }
        }
    }
}

/// Send SIGTERM to `pid` (through `kill(1)`: the kit has no unsafe code); true when sent.
pub fn sigterm(pid: u32) -> bool {
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_substituted() {
        let vars = vec![("smpp_port", "2775".to_owned()), ("data_dir", "/tmp/x".to_owned())];
        let out = render_template(
            "listen = \"127.0.0.1:{smpp_port}\"\ndir = \"{data_dir}\"\nt = { a = 1 }\nx = \"{}\"",
            &vars,
        )
        .unwrap();
        assert_eq!(
            out,
            "listen = \"127.0.0.1:2775\"\ndir = \"/tmp/x\"\nt = { a = 1 }\nx = \"{}\""
        );
        let err = render_template("port = {smsc_port}", &vars).unwrap_err();
        assert!(err.contains("{smsc_port}") && err.contains("smpp_port"), "{err}");
        // unterminated / non-identifier braces are left alone
        assert_eq!(render_template("{a-b} {", &vars).unwrap(), "{a-b} {");
        assert_eq!(render_template("{1x}", &vars).unwrap(), "{1x}");
    }

    #[test]
    fn free_ports_are_distinct_and_bindable() {
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len());
        let ephemeral = ephemeral_start();
        for port in ports {
            assert!(port > 0);
            if ephemeral >= FIRST_TEST_PORT + 1_000 {
                // No outgoing connection is given it while a killed gateway restarts.
                assert!(
                    (FIRST_TEST_PORT..ephemeral).contains(&port),
                    "{port} in the ephemeral range"
                );
            }
            TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).unwrap();
        }
    }

    #[test]
    fn missing_binary_explains_how_to_build_it() {
        // Only meaningful when SENDIUM_BIN is not set and the binary is not built.
        if std::env::var_os("SENDIUM_BIN").is_none()
            && let Err(e) = locate_binary()
        {
            assert!(e.contains("cargo build -p sendium-ops"), "{e}");
        }
    }
}
