//! The gateway configuration the soak runs: the file/file/file profile with the file DLR
//! store (the `durable_config(DLR_FILE)` of the black-box tests), two SMPP accounts, two
//! API keys and one upstream at the test SMSC.

use std::path::Path;
use std::process::Command;

/// The configuration template (placeholders filled by `GatewayBuilder`; `{multipart_expiry}`
/// and `{callback_allow}` are soak variables).
pub const TEMPLATE: &str = r#"[sms]
multipart-expiry = "{multipart_expiry}"
[sms.pending]
backend = "file"
[sms.router-queue]
backend = "file"
[sms.routed-work]
backend = "file"
[storage.file]
dir = "{data_dir}"
[dlr]
backend = "file"

[smpp]
listen = "127.0.0.1:{smpp_port}"
window = 1000
[[smpp.accounts]]
system-id = "esme1"
password = "secret"
max-binds = 8
[[smpp.accounts]]
system-id = "esme2"
password = "secret2"
max-binds = 4

[http]
listen = "127.0.0.1:{http_port}"
{callback_allow}
[[http.api-keys]]
key = "key-1"
account = "esme1"
[[http.api-keys]]
key = "key-2"
account = "esme2"

[admin]
listen = "127.0.0.1:{admin_port}"
[log]
level = "info"

[[destinations]]
name = "upstream"
kind = "smpp"
host = "127.0.0.1"
port = {smsc_port}
system-id = "sendium"
password = "pw"
window = 200
reconnect-min = "50ms"
reconnect-max = "500ms"
response-timeout = "2s"
enquire-link-interval = "5s"

[[routes]]
name = "default"
to = ["upstream"]
"#;

/// Lets HTTP callbacks reach the callback sink on loopback, for gateways that guard
/// callback targets (`[http] callback-allow`).
pub const CALLBACK_ALLOW: &str = r#"callback-allow = ["127.0.0.1/32"]"#;

/// The value of `{callback_allow}` this binary takes: [`CALLBACK_ALLOW`] when
/// `sendium check-config` accepts it, else nothing (a gateway without the key refuses
/// unknown keys). Errors when the configuration is refused either way.
pub fn callback_allow_for(bin: &Path, dir: &Path, multipart_expiry: &str) -> Result<&'static str, String> {
    let mut last = String::new();
    for allow in [CALLBACK_ALLOW, ""] {
        let vars: Vec<(&str, String)> = vec![
            ("smpp_port", "1".to_owned()),
            ("http_port", "2".to_owned()),
            ("admin_port", "3".to_owned()),
            ("smsc_port", "4".to_owned()),
            ("data_dir", dir.join("check-data").display().to_string()),
            ("multipart_expiry", multipart_expiry.to_owned()),
            ("callback_allow", allow.to_owned()),
        ];
        let config = crate::gateway::render_template(TEMPLATE, &vars)?;
        let path = dir.join("check-config.toml");
        std::fs::write(&path, config).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let out = Command::new(bin)
            .arg("check-config")
            .arg(&path)
            .output()
            .map_err(|e| format!("cannot run {} check-config: {e}", bin.display()))?;
        if out.status.success() {
            return Ok(allow);
        }
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Err(format!("sendium check-config refuses the soak configuration:\n{last}"))
}
