//! The gateway's TLS identities: read from the configured PEM files at startup (an
//! unreadable or unusable file fails startup naming its key and path), and read again at
//! each reload, all before any is swapped, so a bad file refuses the whole reload and the
//! running certificates stay. New connections take the current identity; established
//! sessions keep the one they shook hands with.

use sendium_profiles::Config;
use sendium_protocols::http_client::Trust;
use sendium_protocols::tls::{self, ClientTlsSettings, PreparedServerTls, ServerTls, ServerTlsFiles, TlsError};

/// The server identities of the listeners that speak TLS.
#[derive(Clone, Debug, Default)]
pub struct TlsIdentities {
    pub smpp: Option<ServerTls>,
    pub http: Option<ServerTls>,
    pub admin: Option<ServerTls>,
}

/// A reload's identities, read and checked, not yet in use.
pub struct PreparedIdentities(Vec<(ServerTls, PreparedServerTls)>);

const HTTP_ALPN: &[u8] = b"http/1.1";

fn files(cfg: &Config) -> [Option<ServerTlsFiles>; 3] {
    let smpp = cfg.smpp.as_ref().and_then(|s| s.tls.as_ref()).map(|t| ServerTlsFiles {
        key: "smpp.tls".into(),
        cert: t.cert.clone(),
        private_key: t.key.clone(),
        alpn: Vec::new(),
        client_ca: t.client_ca.clone(),
    });
    let https = |key: &str, t: &sendium_profiles::TlsConfig| ServerTlsFiles {
        key: key.into(),
        cert: t.cert.clone(),
        private_key: t.key.clone(),
        alpn: vec![HTTP_ALPN.to_vec()],
        client_ca: None,
    };
    let http = cfg
        .http
        .as_ref()
        .and_then(|h| h.tls.as_ref())
        .map(|t| https("http.tls", t));
    let admin = cfg.admin.tls.as_ref().map(|t| https("admin.tls", t));
    [smpp, http, admin]
}

impl TlsIdentities {
    /// Reads every configured identity and checks every SMPP destination's CA file.
    pub fn load(cfg: &Config) -> Result<Self, TlsError> {
        check_destinations(cfg)?;
        let [smpp, http, admin] = files(cfg).map(|f| f.map(ServerTls::load).transpose());
        Ok(TlsIdentities {
            smpp: smpp?,
            http: http?,
            admin: admin?,
        })
    }

    /// Reads `new`'s files for the listeners that speak TLS (which ones cannot change
    /// live: the reload checks that first).
    pub fn prepare(&self, new: &Config) -> Result<PreparedIdentities, TlsError> {
        check_destinations(new)?;
        let [smpp, http, admin] = files(new);
        let mut prepared = Vec::new();
        for (current, files) in [(&self.smpp, smpp), (&self.http, http), (&self.admin, admin)] {
            if let (Some(current), Some(files)) = (current, files) {
                prepared.push((current.clone(), ServerTls::prepare(files)?));
            }
        }
        Ok(PreparedIdentities(prepared))
    }

    /// Swaps the prepared identities in, for connections accepted from now on.
    pub fn apply(prepared: PreparedIdentities) {
        for (current, new) in prepared.0 {
            current.replace(new);
        }
    }
}

/// The client TLS settings of a `kind = "smpp"` destination with `tls = true`.
pub fn destination_settings(i: usize, d: &sendium_profiles::DestinationConfig) -> Option<ClientTlsSettings> {
    d.tls.then(|| ClientTlsSettings {
        server_name: d.tls_server_name.clone().or_else(|| d.host.clone()).unwrap_or_default(),
        ca: d.tls_ca.clone(),
        insecure_skip_verify: d.tls_insecure_skip_verify,
        key: format!("destinations[{i}]"),
    })
}

/// The certificates a `kind = "http"` destination's https:// url is checked against.
pub fn http_destination_trust(i: usize, d: &sendium_profiles::DestinationConfig) -> Trust {
    match &d.tls_ca {
        Some(path) => Trust::CaFile {
            key: format!("destinations[{i}]"),
            path: path.clone(),
        },
        None => Trust::WebPki,
    }
}

/// Every TLS destination's CA file is readable and holds certificates, and its server name
/// is one TLS can verify.
fn check_destinations(cfg: &Config) -> Result<(), TlsError> {
    for (i, d) in cfg.destinations.iter().enumerate() {
        if d.kind == sendium_profiles::DestinationKind::Http {
            http_destination_trust(i, d).check()?;
        }
        if let Some(settings) = destination_settings(i, d) {
            tls::client_config(&settings)?;
            if tls::server_name(&settings.server_name).is_err() {
                return Err(TlsError::Name {
                    key: format!("destinations[{i}].tls-server-name"),
                    name: settings.server_name,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        sendium_profiles::load_str(&format!(
            "[[destinations]]\nname = \"up\"\nkind = \"smpp\"\nhost = \"127.0.0.1\"\nport = 2776\nsystem-id = \"s\"\n{extra}\
             [[routes]]\nname = \"default\"\nto = [\"up\"]\n"
        ))
        .unwrap()
    }

    #[test]
    fn a_destination_ca_that_cannot_be_read_fails_startup_and_reload_naming_the_key() {
        let plain = config("");
        let identities = TlsIdentities::load(&plain).unwrap();
        assert!(identities.smpp.is_none() && identities.http.is_none() && identities.admin.is_none());
        let bad = config("tls = true\ntls-ca = \"/nonexistent/ca.pem\"\n");
        let err = TlsIdentities::load(&bad).unwrap_err().to_string();
        assert!(
            err.starts_with("destinations[0].tls-ca: cannot read /nonexistent/ca.pem"),
            "{err}"
        );
        assert!(identities.prepare(&bad).is_err(), "a reload to it is refused");
        assert!(identities.prepare(&plain).is_ok());
        // Without tls-ca the webpki roots are used: nothing to read.
        assert!(TlsIdentities::load(&config("tls = true\n")).is_ok());
        let name = config("tls = true\ntls-server-name = \"not a name\"\n");
        let err = TlsIdentities::load(&name).unwrap_err().to_string();
        assert!(err.starts_with("destinations[0].tls-server-name"), "{err}");
    }
}
