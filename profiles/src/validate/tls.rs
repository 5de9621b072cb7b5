//! The TLS keys: listeners that do not collide, non-empty file paths, and destination
//! `tls-*` keys only where they mean something. Whether the files can be read and hold
//! a usable certificate is checked when the gateway starts or reloads.

use std::path::Path;

use super::Validator;
use crate::{Config, DestinationKind};

impl Validator {
    pub(super) fn tls(&mut self, cfg: &Config) {
        if let Some(s) = &cfg.smpp
            && let Some(t) = &s.tls
        {
            if t.listen == s.listen {
                self.invalid(
                    "smpp.tls.listen",
                    format!("must differ from smpp.listen ({})", s.listen),
                );
            }
            self.path("smpp.tls.cert", &t.cert);
            self.path("smpp.tls.key", &t.key);
            if let Some(ca) = &t.client_ca {
                self.path("smpp.tls.client-ca", ca);
            }
        }
        if let Some(s) = &cfg.smpp {
            let mutual = s.tls.as_ref().is_some_and(|t| t.client_ca.is_some());
            for (i, a) in s.accounts.iter().enumerate() {
                let Some(subject) = &a.tls_subject else { continue };
                let key = format!("smpp.accounts[{i}].tls-subject");
                if let Err(reason) = check_subject(subject) {
                    self.value(&key, format!("{subject:?}"), reason);
                } else if !mutual {
                    self.invalid(
                        &key,
                        "needs smpp.tls.client-ca (client certificates are only asked for with it)",
                    );
                }
            }
        }
        if let Some(t) = cfg.http.as_ref().and_then(|h| h.tls.as_ref()) {
            self.path("http.tls.cert", &t.cert);
            self.path("http.tls.key", &t.key);
        }
        if let Some(t) = &cfg.admin.tls {
            self.path("admin.tls.cert", &t.cert);
            self.path("admin.tls.key", &t.key);
        }
        for (i, d) in cfg.destinations.iter().enumerate() {
            let key = format!("destinations[{i}]");
            let extras = [
                ("tls-ca", d.tls_ca.is_some()),
                ("tls-server-name", d.tls_server_name.is_some()),
                ("tls-insecure-skip-verify", d.tls_insecure_skip_verify),
            ];
            if d.kind != DestinationKind::Smpp {
                if d.tls {
                    self.invalid(
                        format!("{key}.tls"),
                        "applies to kind = \"smpp\" only (an HTTP destination uses TLS by its https:// url)",
                    );
                }
                for (name, set) in extras {
                    if !set {
                        continue;
                    }
                    if name != "tls-ca" {
                        self.invalid(format!("{key}.{name}"), "applies to kind = \"smpp\" only");
                    } else if d.kind != DestinationKind::Http {
                        self.invalid(format!("{key}.tls-ca"), "applies to kind = \"smpp\" or \"http\" only");
                    } else if !d.is_https() {
                        self.invalid(format!("{key}.tls-ca"), "only used with an https:// url");
                    } else if let Some(ca) = &d.tls_ca {
                        self.path(&format!("{key}.tls-ca"), ca);
                    }
                }
                continue;
            }
            if !d.tls {
                for (name, set) in extras {
                    if set {
                        self.invalid(format!("{key}.{name}"), "only used with tls = true");
                    }
                }
                continue;
            }
            if let Some(ca) = &d.tls_ca {
                self.path(&format!("{key}.tls-ca"), ca);
                if d.tls_insecure_skip_verify {
                    self.invalid(
                        format!("{key}.tls-insecure-skip-verify"),
                        "contradicts tls-ca: set one or the other",
                    );
                }
            }
            if let Some(name) = &d.tls_server_name {
                self.not_empty(&format!("{key}.tls-server-name"), name);
            }
        }
    }

    fn path(&mut self, key: &str, path: &Path) {
        if path.as_os_str().is_empty() {
            self.invalid(key, "must name a PEM file");
        }
    }
}

/// The attribute names `tls-subject` accepts (the protocols crate reads them from the
/// certificate).
const SUBJECT_NAMES: [&str; 6] = ["CN", "O", "OU", "C", "L", "ST"];

/// `NAME=value` pairs separated by commas, NAME one of [`SUBJECT_NAMES`].
fn check_subject(text: &str) -> Result<(), String> {
    let expected = format!(
        "NAME=value pairs separated by commas, NAME one of {}, e.g. \"CN=esme1, O=Shop\"",
        SUBJECT_NAMES.join(", ")
    );
    for part in text.split(',') {
        match part.split_once('=') {
            Some((name, value))
                if SUBJECT_NAMES.iter().any(|n| n.eq_ignore_ascii_case(name.trim())) && !value.trim().is_empty() => {}
            _ => return Err(expected),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::load_str;

    fn problems(toml: &str) -> String {
        match load_str(toml) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    const SMSC: &str = "[[destinations]]\nname = \"up\"\nkind = \"smpp\"\nhost = \"smsc.example.com\"\nport = 3550\nsystem-id = \"s\"\n";

    #[test]
    fn listeners_take_a_cert_and_a_key() {
        let ok = "[smpp]\n[smpp.tls]\nlisten = \"127.0.0.1:3550\"\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n\
                  [http]\ntls = { cert = \"/c.pem\", key = \"/k.pem\" }\n[admin]\ntls = { cert = \"/c.pem\", key = \"/k.pem\" }\n";
        let cfg = load_str(ok).unwrap();
        let smpp_tls = cfg.smpp.unwrap().tls.unwrap();
        assert_eq!(smpp_tls.listen.port(), 3550);
        assert!(cfg.http.unwrap().tls.is_some() && cfg.admin.tls.is_some());

        let same = problems(
            "[smpp]\nlisten = \"127.0.0.1:2775\"\ntls = { listen = \"127.0.0.1:2775\", cert = \"/c\", key = \"/k\" }\n",
        );
        assert!(
            same.contains("smpp.tls.listen") && same.contains("must differ from smpp.listen"),
            "{same}"
        );
        let empty = problems("[http]\ntls = { cert = \"\", key = \"/k\" }\n");
        assert!(
            empty.contains("http.tls.cert") && empty.contains("must name a PEM file"),
            "{empty}"
        );
        let missing = problems("[admin]\ntls = { cert = \"/c\" }\n");
        assert!(missing.contains("key"), "{missing}");
        let unknown =
            problems("[smpp]\ntls = { listen = \"127.0.0.1:3550\", cert = \"/c\", key = \"/k\", ca = \"/x\" }\n");
        assert!(unknown.contains("ca"), "{unknown}");
    }

    #[test]
    fn tls_subject_needs_a_client_ca_and_known_names() {
        let base = "[smpp]\ntls = { listen = \"127.0.0.1:3550\", cert = \"/c\", key = \"/k\", client-ca = \"/ca\" }\n\
                    [[smpp.accounts]]\nsystem-id = \"a\"\npassword = \"pw\"\n";
        let ok = format!("{base}tls-subject = \"CN=esme1, O=Shop\"\n");
        assert_eq!(
            load_str(&ok).unwrap().smpp.unwrap().accounts[0].tls_subject.as_deref(),
            Some("CN=esme1, O=Shop")
        );
        let bad = problems(&format!("{base}tls-subject = \"esme1\"\n"));
        assert!(
            bad.contains("smpp.accounts[0].tls-subject") && bad.contains("NAME=value"),
            "{bad}"
        );
        let unknown = problems(&format!("{base}tls-subject = \"SERIAL=1\"\n"));
        assert!(unknown.contains("CN, O, OU, C, L, ST"), "{unknown}");
        let no_ca = problems(&format!(
            "{}tls-subject = \"CN=a\"\n",
            base.replace(", client-ca = \"/ca\"", "")
        ));
        assert!(no_ca.contains("needs smpp.tls.client-ca"), "{no_ca}");
    }

    #[test]
    fn destination_tls_keys_need_tls_and_smpp() {
        let ok = format!("{SMSC}tls = true\ntls-ca = \"/ca.pem\"\ntls-server-name = \"smsc.example.com\"\n");
        let cfg = load_str(&ok).unwrap();
        assert!(cfg.destinations[0].tls);

        let without = problems(&format!("{SMSC}tls-ca = \"/ca.pem\"\n"));
        assert!(
            without.contains("destinations[0].tls-ca") && without.contains("only used with tls = true"),
            "{without}"
        );
        let both = problems(&format!(
            "{SMSC}tls = true\ntls-ca = \"/ca.pem\"\ntls-insecure-skip-verify = true\n"
        ));
        assert!(both.contains("destinations[0].tls-insecure-skip-verify"), "{both}");
        let sim = problems("[[destinations]]\nname = \"sim\"\nkind = \"simulator\"\ntls = true\n");
        assert!(
            sim.contains("destinations[0].tls") && sim.contains("applies to kind = \"smpp\" only"),
            "{sim}"
        );
        let name = problems(&format!("{SMSC}tls = true\ntls-server-name = \" \"\n"));
        assert!(name.contains("destinations[0].tls-server-name"), "{name}");
    }
}
