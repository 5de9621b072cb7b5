//! The container image's contract, tested without a container engine (none runs on
//! this machine kind): the Dockerfile declares what operators rely on, the image's
//! configurations validate only with the secrets the operator must give, and the binary
//! with the image's configuration runs as PID 1 of a new PID namespace (as in a
//! container: `unshare --pid --fork --mount-proc`), answers the HEALTHCHECK, and stops
//! on SIGTERM with exit status 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sendium_integration_tests::{free_port, sendium_command};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap()
}

#[test]
fn the_dockerfile_declares_the_images_contract() {
    let d = read("Dockerfile");
    let lines: Vec<&str> = d.lines().map(str::trim).filter(|l| !l.starts_with('#')).collect();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    assert_eq!(
        lines.iter().filter(|l| l.starts_with("FROM ")).count(),
        2,
        "multi-stage"
    );
    assert!(has("FROM debian:bookworm-slim"), "slim Debian runtime");
    assert!(has("cargo build --release --locked"), "--locked build");
    assert!(has("USER sendium"), "non-root");
    assert!(has("useradd --system --uid 10001"), "a system user");
    assert!(has("VOLUME [\"/var/lib/sendium\"]"));
    assert!(has("EXPOSE 2775 8080 9090"));
    assert!(has("STOPSIGNAL SIGTERM"));
    assert!(has(
        "CMD [\"sendium\", \"healthcheck\", \"--addr\", \"127.0.0.1:9090\"]"
    ));
    assert!(has("COPY deploy/sendium.toml /etc/sendium/sendium.toml"));
    assert!(has("CMD [\"serve\", \"--config\", \"/etc/sendium/sendium.toml\"]"));
    let ignore = read(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target/"), "{ignore}");
    let compose = read("compose.yaml");
    assert!(compose.contains("image: postgres:16") && compose.contains("SENDIUM__ADMIN__TOKEN"));
}

fn check_config(path: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = sendium_command();
    cmd.arg("check-config").arg(repo(path));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_images_configurations_need_the_operators_secrets() {
    let (ok, out) = check_config("deploy/sendium.toml", &[]);
    assert!(!ok, "{out}");
    assert!(out.contains("missing required key admin.token"), "{out}");
    let (ok, out) = check_config("deploy/sendium.toml", &[("SENDIUM__ADMIN__TOKEN", "t")]);
    assert!(ok, "{out}");
    assert!(out.contains("storage profile: file/file/file + dlr file"), "{out}");

    let (ok, out) = check_config("deploy/sendium-postgresql.toml", &[("SENDIUM__ADMIN__TOKEN", "t")]);
    assert!(!ok && out.contains("storage.postgresql.url"), "{out}");
    let (ok, out) = check_config(
        "deploy/sendium-postgresql.toml",
        &[
            ("SENDIUM__ADMIN__TOKEN", "t"),
            (
                "SENDIUM__STORAGE__POSTGRESQL__URL",
                "postgres://sendium:pw@127.0.0.1/sendium",
            ),
        ],
    );
    assert!(ok, "{out}");
    assert!(
        out.contains("postgresql/postgresql/postgresql + dlr postgresql"),
        "{out}"
    );
}

fn healthcheck(admin: &str) -> bool {
    sendium_command()
        .args(["healthcheck", "--addr", admin])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// The pid (in this namespace) of `parent`'s only child.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn the_image_configuration_runs_as_pid_1_and_stops_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let log = data.path().join("sendium.log");
    let admin = format!("127.0.0.1:{}", free_port());
    let bin = sendium_integration_tests::gateway::locate_binary().unwrap();
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(&bin)
        .args(["serve", "--config"])
        .arg(repo("deploy/sendium.toml"))
        .env("SENDIUM__ADMIN__TOKEN", "operator-token")
        .env("SENDIUM__STORAGE__FILE__DIR", data.path().join("data"))
        // Loopback only in tests; the image listens on 0.0.0.0.
        .env("SENDIUM__SMPP__LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("SENDIUM__HTTP__LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("SENDIUM__ADMIN__LISTEN", &admin)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("unshare (util-linux) runs the binary in a new PID namespace");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !healthcheck(&admin) {
        if let Some(status) = unshare.try_wait().unwrap() {
            panic!(
                "exited before ready ({status}); unshare needs CAP_SYS_ADMIN\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "not ready within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = child_of(unshare.id()).expect("the gateway under unshare");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert_eq!(nspid.split_whitespace().last(), Some("1"), "PID 1 inside: {nspid}");

    // PID 1 gets only the signals it handles: SIGTERM must be one of them.
    assert!(sendium_integration_tests::gateway::sigterm(pid));
    let exit = wait_exit(&mut unshare, Duration::from_secs(20)).expect("stopped within 20 s of SIGTERM");
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(exit.success(), "exit status {exit}\n{text}");
    assert!(text.contains("shutting down"), "{text}");
    assert!(text.lines().all(|l| l.starts_with('{')), "JSON log lines: {text}");
    assert!(!healthcheck(&admin), "the healthcheck fails once it is gone");
}
