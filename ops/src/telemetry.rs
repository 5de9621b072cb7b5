//! Logging setup. Log lines name stages, backends, accounts and destinations — never
//! message bodies, passwords or per-message ids.

use sendium_profiles::{LogConfig, LogFormat};
use tracing_subscriber::EnvFilter;

/// Install the global subscriber. `RUST_LOG` overrides the configured level (for
/// debugging one module without changing the file).
pub fn init(cfg: &LogConfig) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{},rusmpp=warn,hyper=warn,reqwest=warn", cfg.level.as_str())));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match cfg.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
