//! `sendium healthcheck`: exit 0 when the admin endpoint answers `/readyz` with 200, for
//! a container's HEALTHCHECK, where no HTTP client is installed.
//!
//! The endpoint is `--addr`, else `[admin] listen` of `--config` (an unspecified address
//! is reached on loopback), else 127.0.0.1:9090. It speaks HTTPS when `--ca` is given
//! (the certificate must chain to it and carry `--server-name` or the host) or when the
//! configuration's `[admin] tls` is set: then exactly the certificate in its `cert` file
//! is accepted, under whatever name, since a healthcheck reaches its own gateway by a
//! loopback address the certificate does not name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sendium_profiles::AdminConfig;
use sendium_protocols::tls;

/// How long the whole check may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// What `sendium healthcheck` was told.
#[derive(Debug, Default, PartialEq)]
pub struct HealthcheckArgs {
    /// `--addr HOST:PORT`.
    pub addr: Option<String>,
    /// `--config FILE`: the admin listener's address and TLS certificate.
    pub config: Option<PathBuf>,
    /// `--ca FILE`: HTTPS, the server's certificate checked against these CA certificates.
    pub ca: Option<PathBuf>,
    /// `--server-name NAME`: the name that certificate must carry (default: the host).
    pub server_name: Option<String>,
}

impl HealthcheckArgs {
    /// The flags after `healthcheck`; a usage error names the flag.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut parsed = HealthcheckArgs::default();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = |what: &str| it.next().cloned().ok_or_else(|| format!("{flag} needs {what}"));
            match flag.as_str() {
                "--addr" => parsed.addr = Some(value("HOST:PORT")?),
                "--config" | "-c" => parsed.config = Some(PathBuf::from(value("a file")?)),
                "--ca" => parsed.ca = Some(PathBuf::from(value("a PEM file")?)),
                "--server-name" => parsed.server_name = Some(value("a name")?),
                other => return Err(format!("unexpected argument {other:?}")),
            }
        }
        if parsed.server_name.is_some() && parsed.ca.is_none() {
            return Err("--server-name needs --ca".into());
        }
        Ok(parsed)
    }
}

/// Why the check did not pass.
#[derive(Debug, thiserror::Error)]
pub enum HealthcheckError {
    /// The TLS material to check with cannot be used (exit 2, like any configuration error).
    #[error("{0}")]
    Config(String),
    /// No answer, or not 200.
    #[error("{0}")]
    Unhealthy(String),
}

/// Ask `/readyz`; the body of a 200 answer. `admin` is the `[admin]` table of `--config`.
pub async fn run(args: &HealthcheckArgs, admin: Option<&AdminConfig>) -> Result<String, HealthcheckError> {
    let addr = match (&args.addr, admin) {
        (Some(addr), _) => addr.clone(),
        (None, Some(admin)) => reachable(admin.listen).to_string(),
        (None, None) => "127.0.0.1:9090".to_owned(),
    };
    let unhealthy = |e: String| HealthcheckError::Unhealthy(format!("healthcheck: {e}"));
    let mut client = reqwest::Client::builder().timeout(TIMEOUT);
    let url = if let Some(ca) = &args.ca {
        let socket: SocketAddr = tokio::net::lookup_host(&addr)
            .await
            .map_err(|e| unhealthy(format!("{addr}: {e}")))?
            .next()
            .ok_or_else(|| unhealthy(format!("{addr}: no address")))?;
        let host = addr.rsplit_once(':').map_or(addr.as_str(), |(host, _)| host);
        let name = args
            .server_name
            .clone()
            .unwrap_or_else(|| host.trim_matches(['[', ']']).to_owned());
        let config = tls::client_config(&tls::ClientTlsSettings {
            server_name: name.clone(),
            ca: Some(ca.clone()),
            insecure_skip_verify: false,
            key: "--ca".into(),
        })
        .map_err(|e| HealthcheckError::Config(e.to_string()))?;
        client = client.use_preconfigured_tls(Arc::unwrap_or_clone(config));
        if name.parse::<IpAddr>().is_err() {
            // Connect to `addr` while checking the certificate against `name`.
            client = client.resolve(&name, socket);
        }
        let host = if name.contains(':') { format!("[{name}]") } else { name };
        format!("https://{host}:{}/readyz", socket.port())
    } else if let Some(files) = admin.and_then(|a| a.tls.as_ref()) {
        let config = tls::pinned_client_config("admin.tls.cert", &files.cert)
            .map_err(|e| HealthcheckError::Config(e.to_string()))?;
        client = client.use_preconfigured_tls(Arc::unwrap_or_clone(config));
        format!("https://{addr}/readyz")
    } else {
        format!("http://{addr}/readyz")
    };
    let client = client.build().map_err(|e| unhealthy(e.to_string()))?;
    let resp = client
        .get(&url)
        .send()
        .await
        .map_err(|e| HealthcheckError::Unhealthy(format!("{url}: {}", sendium_protocols::error::chain(&e))))?;
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(body)
    } else {
        Err(HealthcheckError::Unhealthy(format!("{url}: {status} {body}")))
    }
}

/// A listen address as a local client reaches it: an unspecified IP is loopback.
fn reachable(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => (Ipv4Addr::LOCALHOST, listen.port()).into(),
        IpAddr::V6(ip) if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, listen.port()).into(),
        _ => listen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn flags_are_read_and_misuse_is_named() {
        let parsed = HealthcheckArgs::parse(&args(&[
            "--config",
            "/etc/sendium/sendium.toml",
            "--ca",
            "/ca.pem",
            "--server-name",
            "admin.example.com",
        ]))
        .unwrap();
        assert_eq!(
            parsed,
            HealthcheckArgs {
                addr: None,
                config: Some("/etc/sendium/sendium.toml".into()),
                ca: Some("/ca.pem".into()),
                server_name: Some("admin.example.com".into()),
            }
        );
        for (bad, says) in [
            (&["--addr"][..], "--addr needs HOST:PORT"),
            (&["--server-name", "x"][..], "--server-name needs --ca"),
            (&["--port", "1"][..], "unexpected argument \"--port\""),
        ] {
            let err = HealthcheckArgs::parse(&args(bad)).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn an_unspecified_listen_address_is_reached_on_loopback() {
        let r = |s: &str| reachable(s.parse().unwrap()).to_string();
        assert_eq!(r("0.0.0.0:9090"), "127.0.0.1:9090");
        assert_eq!(r("[::]:9090"), "[::1]:9090");
        assert_eq!(r("10.1.2.3:9090"), "10.1.2.3:9090");
    }
}
