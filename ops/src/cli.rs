//! The command line.
//!
//! ```text
//! sendium serve [--config FILE]   run the gateway (without --config: the embedded quickstart)
//! sendium check-config FILE       validate FILE and print its storage profile's guarantees
//! sendium demo                    run the quickstart and send one SMS over SMPP and HTTP
//! sendium inspect --config FILE   per-stage counts and oldest record of the data directory
//! sendium drain --config FILE     finish the work a previous profile left, then stop
//! sendium healthcheck             0 when /readyz answers 200 (the image's HEALTHCHECK)
//! sendium outbox schema           print the SQL of the outbox table an application creates
//! sendium outbox dead|retry        list a source's dead rows, or put them back to pending
//! sendium version
//! ```

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sendium_profiles::Config;

use crate::healthcheck;

const USAGE: &str = "\
usage:
  sendium serve [--config FILE]   run the gateway (without --config: the embedded quickstart
                                  configuration: memory profile, simulated destination)
  sendium check-config FILE       validate FILE; print its storage profile and restart guarantee
  sendium demo                    run the quickstart and send one SMS over SMPP and one over
                                  HTTP, printing their receipts; then keep serving
  sendium inspect --config FILE   per-stage record counts and the oldest record's age in the data
                                  directory (storage.file.dir) of a stopped gateway
  sendium drain --config FILE [--timeout 10m]
                                  run the storage profile recorded in the data directory with new
                                  submissions refused until every stage is empty, then stop (needed
                                  before switching a stage that holds records to another backend)
  sendium healthcheck [--addr 127.0.0.1:9090] [--config FILE] [--ca FILE [--server-name NAME]]
                                  exit 0 when the admin endpoint's /readyz answers 200
                                  (the container image's HEALTHCHECK). With --config: the
                                  admin listener's address, and HTTPS accepting exactly its
                                  [admin] tls certificate; --ca: HTTPS checked against a CA
  sendium outbox schema [--table NAME] [--dialect postgresql|sqlite]
                                  print the SQL that creates the outbox table (default
                                  sendium_outbox, postgresql) in an application's own database
  sendium outbox dead --config FILE --source NAME [--limit N]
                                  list the dead rows of an outbox source (refused max-attempts
                                  times), without their bodies
  sendium outbox retry --config FILE --source NAME [--event-id ID]
                                  put a source's dead rows (or one) back to pending
  sendium version

Environment: SENDIUM__SECTION__KEY overrides a configuration key (kebab-case keys, e.g.
SENDIUM__SMS__ROUTER_QUEUE__BACKEND=memory); RUST_LOG overrides the log filter.";

/// Exit codes: 0 ok, 1 runtime failure, 2 bad usage or configuration.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("sendium: {msg}\n\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Failure::Config(msg)) => {
            eprintln!("sendium: configuration error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Runtime(msg)) => {
            eprintln!("sendium: {msg}");
            ExitCode::from(1)
        }
    }
}

enum Failure {
    Usage(String),
    Config(String),
    Runtime(String),
}

fn load(path: Option<&Path>) -> Result<Config, Failure> {
    let cfg = match path {
        Some(p) => sendium_profiles::load(p),
        None => sendium_profiles::load_str_with_env(sendium_profiles::QUICKSTART, std::env::vars()),
    };
    cfg.map_err(|e| Failure::Config(e.to_string()))
}

fn config_flag(args: &[String]) -> Result<Option<PathBuf>, Failure> {
    let mut it = args.iter();
    let mut path = None;
    while let Some(a) = it.next() {
        match a.as_str() {
            "--config" | "-c" => match it.next() {
                Some(p) => path = Some(PathBuf::from(p)),
                None => return Err(Failure::Usage("--config needs a file".into())),
            },
            other => {
                if let Some(p) = other.strip_prefix("--config=") {
                    path = Some(PathBuf::from(p));
                } else {
                    return Err(Failure::Usage(format!("unexpected argument {other:?}")));
                }
            }
        }
    }
    Ok(path)
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sendium")
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the runtime: {e}")))
}

fn init_failpoints() -> Result<(), Failure> {
    sendium_storage::failpoint::init_from_env().map_err(|e| Failure::Config(format!("SENDIUM_FAILPOINT: {e}")))
}

fn run(args: &[String]) -> Result<(), Failure> {
    let Some(cmd) = args.first() else {
        return Err(Failure::Usage("no command given".into()));
    };
    match cmd.as_str() {
        "serve" => {
            init_failpoints()?;
            let path = config_flag(&args[1..])?;
            let cfg = load(path.as_deref())?;
            crate::telemetry::init(&cfg.log);
            runtime()?
                .block_on(crate::serve::run(cfg, crate::serve::ConfigSource::new(path)))
                .map_err(|e| Failure::Runtime(e.to_string()))
        }
        "check-config" => {
            let path = match args.get(1) {
                Some(p) if p != "--config" => PathBuf::from(p),
                _ => match config_flag(&args[1..])? {
                    Some(p) => p,
                    None => return Err(Failure::Usage("check-config needs a file".into())),
                },
            };
            let cfg = load(Some(&path))?;
            // The certificate, key and CA files are read as `serve` would read them.
            sendium_actors::tls::TlsIdentities::load(&cfg).map_err(|e| Failure::Config(e.to_string()))?;
            print!("{}", check_config_report(&cfg));
            Ok(())
        }
        "inspect" => {
            let path = config_flag(&args[1..])?;
            let cfg = load(path.as_deref())?;
            let report = runtime()?
                .block_on(crate::stores_cli::inspect(&cfg))
                .map_err(|e| Failure::Runtime(e.to_string()))?;
            print!("{report}");
            Ok(())
        }
        "drain" => {
            let mut rest: Vec<String> = Vec::new();
            let mut timeout = None;
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                if a == "--timeout" {
                    let v = it
                        .next()
                        .ok_or_else(|| Failure::Usage("--timeout needs a duration".into()))?;
                    timeout = Some(
                        sendium_profiles::duration::parse(v)
                            .map_err(|e| Failure::Usage(format!("--timeout {v:?}: {e}")))?,
                    );
                } else {
                    rest.push(a.clone());
                }
            }
            let path = config_flag(&rest)?;
            let cfg = load(path.as_deref())?;
            crate::telemetry::init(&cfg.log);
            runtime()?
                .block_on(crate::stores_cli::drain(&cfg, timeout))
                .map_err(|e| Failure::Runtime(e.to_string()))
        }
        "outbox" => outbox(&args[1..]),
        "healthcheck" => {
            let check = healthcheck::HealthcheckArgs::parse(&args[1..]).map_err(Failure::Usage)?;
            let admin = match &check.config {
                Some(path) => Some(load(Some(path))?.admin),
                None => None,
            };
            match runtime()?.block_on(healthcheck::run(&check, admin.as_ref())) {
                Ok(body) => {
                    println!("{body}");
                    Ok(())
                }
                Err(healthcheck::HealthcheckError::Config(e)) => Err(Failure::Config(e)),
                Err(healthcheck::HealthcheckError::Unhealthy(e)) => Err(Failure::Runtime(e)),
            }
        }
        "demo" => {
            let cfg = load(None)?;
            crate::telemetry::init(&cfg.log);
            runtime()?
                .block_on(crate::demo::run(cfg))
                .map_err(|e| Failure::Runtime(e.to_string()))
        }
        "version" | "--version" | "-V" => {
            println!(
                "sendium {} (commit {})",
                env!("CARGO_PKG_VERSION"),
                env!("SENDIUM_GIT_COMMIT")
            );
            Ok(())
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}

/// `sendium outbox …`.
fn outbox(args: &[String]) -> Result<(), Failure> {
    match args.first().map(String::as_str) {
        Some("schema") => {
            let mut table = sendium_outbox::TableName::default();
            let mut dialect = sendium_outbox::Dialect::Postgresql;
            let mut it = args[1..].iter();
            while let Some(flag) = it.next() {
                let value = it
                    .next()
                    .ok_or_else(|| Failure::Usage(format!("{flag} needs a value")))?;
                match flag.as_str() {
                    "--table" => {
                        table = value.parse().map_err(|e| Failure::Usage(format!("--table: {e}")))?;
                    }
                    "--dialect" => {
                        dialect = value.parse().map_err(|e| Failure::Usage(format!("--dialect: {e}")))?;
                    }
                    other => return Err(Failure::Usage(format!("unknown outbox schema flag {other:?}"))),
                }
            }
            print!("{}", sendium_outbox::schema(dialect, &table));
            Ok(())
        }
        Some(cmd @ ("dead" | "retry")) => {
            let mut rest = Vec::new();
            let (mut name, mut event_id, mut limit) = (None, None, crate::outbox_cli::DEFAULT_LIMIT);
            let mut it = args[1..].iter();
            while let Some(a) = it.next() {
                let mut value = |flag: &str| {
                    it.next()
                        .cloned()
                        .ok_or_else(|| Failure::Usage(format!("{flag} needs a value")))
                };
                match a.as_str() {
                    "--source" => name = Some(value("--source")?),
                    "--event-id" if cmd == "retry" => event_id = Some(value("--event-id")?),
                    "--limit" if cmd == "dead" => {
                        let v = value("--limit")?;
                        limit = v
                            .parse()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| Failure::Usage(format!("--limit {v:?}: expected a positive number")))?;
                    }
                    _ => rest.push(a.clone()),
                }
            }
            let name = name.ok_or_else(|| Failure::Usage(format!("outbox {cmd} needs --source NAME")))?;
            let path = config_flag(&rest)?;
            let cfg = load(path.as_deref())?;
            let report = runtime()?
                .block_on(async {
                    if cmd == "dead" {
                        crate::outbox_cli::dead(&cfg, &name, limit).await
                    } else {
                        crate::outbox_cli::retry(&cfg, &name, event_id.as_deref()).await
                    }
                })
                .map_err(Failure::Runtime)?;
            print!("{report}");
            Ok(())
        }
        Some(other) => Err(Failure::Usage(format!("unknown outbox command {other:?}"))),
        None => Err(Failure::Usage("outbox needs a command: schema, dead or retry".into())),
    }
}

/// The TLS lines of `check-config`: one per listener or destination that speaks TLS
/// (nothing when none does).
fn tls_report(cfg: &Config) -> String {
    let mut lines = Vec::new();
    if let Some(t) = cfg.smpp.as_ref().and_then(|s| s.tls.as_ref()) {
        lines.push(format!("  SMPP over TLS on {} (cert {})", t.listen, t.cert.display()));
    }
    if let Some(t) = cfg.http.as_ref().and_then(|h| h.tls.as_ref()) {
        lines.push(format!("  HTTP ingress serves HTTPS (cert {})", t.cert.display()));
    }
    if let Some(t) = &cfg.admin.tls {
        lines.push(format!("  admin serves HTTPS (cert {})", t.cert.display()));
    }
    for d in cfg.destinations.iter().filter(|d| d.tls) {
        let trust = match (&d.tls_ca, d.tls_insecure_skip_verify) {
            (_, true) => "certificate NOT verified (tls-insecure-skip-verify)".to_owned(),
            (Some(ca), false) => format!("trusts {}", ca.display()),
            (None, false) => "trusts the webpki roots".to_owned(),
        };
        lines.push(format!("  destination {} over TLS, {trust}", d.name));
    }
    for d in cfg.destinations.iter().filter(|d| d.is_https()) {
        let trust = match &d.tls_ca {
            Some(ca) => format!("trusts {}", ca.display()),
            None => "trusts the webpki roots".to_owned(),
        };
        lines.push(format!("  destination {} over HTTPS, {trust}", d.name));
    }
    if lines.is_empty() {
        String::new()
    } else {
        format!("TLS:\n{}\n", lines.join("\n"))
    }
}

/// What `check-config` prints: the chosen profile, its restart guarantee, and the table
/// of every supported profile.
pub fn check_config_report(cfg: &Config) -> String {
    let profile = cfg.storage_profile();
    let mut out = String::new();
    out.push_str("configuration OK\n\n");
    out.push_str(&format!("storage profile: {profile}\n"));
    if let Ok(g) = sendium_profiles::check_supported(&profile) {
        out.push_str(&format!("  after a restart (outbound): {}\n", g.outbound));
        out.push_str(&format!("  after a restart (DLR):      {}\n", g.dlr));
        out.push_str(&format!(
            "  acknowledged messages survive a restart: {}\n",
            if g.durable { "yes" } else { "NO" }
        ));
    }
    out.push_str(&format!(
        "\nSMPP: {}\nHTTP: {}\nadmin: {}\ndestinations: {}\nroutes: {}\n",
        cfg.smpp
            .as_ref()
            .map(|s| format!("{} ({} accounts)", s.listen, s.accounts.len()))
            .unwrap_or_else(|| "off".into()),
        cfg.http
            .as_ref()
            .map(|h| {
                let mut s = format!("{} ({} api keys", h.listen, h.api_keys.len());
                if !h.sendsms_users.is_empty() {
                    let names: Vec<&str> = h.sendsms_users.iter().map(|u| u.username.as_str()).collect();
                    s.push_str(&format!("; /cgi-bin/sendsms users: {}", names.join(", ")));
                }
                s.push(')');
                s
            })
            .unwrap_or_else(|| "off".into()),
        cfg.admin.listen,
        cfg.destinations
            .iter()
            .map(|d| format!("{} ({})", d.name, d.kind.as_str()))
            .collect::<Vec<_>>()
            .join(", "),
        cfg.routes
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
    ));
    if !cfg.outbox.sources.is_empty() {
        out.push_str("outbox sources:\n");
        for s in &cfg.outbox.sources {
            let dialect = if s.url.expose().starts_with("sqlite:") {
                "sqlite"
            } else {
                "postgresql"
            };
            out.push_str(&format!(
                "  {} ({dialect}, table {}, {} partition(s), batch {})\n",
                s.name, s.table, s.partitions, s.batch_size
            ));
        }
        if cfg.sms.pending.backend == sendium_profiles::StageBackend::Memory {
            out.push_str(
                "  NOTE: a relayed row leaves the outbox once admitted; with sms.pending.backend = \"memory\" \
                 a restart loses what was admitted and not yet sent\n",
            );
        }
    }
    out.push_str(&tls_report(cfg));
    out.push_str("\nsupported storage profiles:\n");
    out.push_str(&sendium_profiles::guarantee_table());
    out
}
