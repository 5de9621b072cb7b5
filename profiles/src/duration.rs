//! Durations written the way operators write them (`"500ms"`, `"10s"`,
//! `"72h"`, `"1h 30m"`), parsed with `humantime` into [`Duration`].
//!
//! A bare number is refused on purpose: `retention = 10` could mean seconds,
//! minutes or hours, and guessing wrong silently changes how long receipts are
//! kept. Use with `#[serde(deserialize_with = "crate::duration::deserialize")]`.

use std::fmt;
use std::time::Duration;

use serde::Deserializer;
use serde::de::{self, Visitor};

use crate::error::value_error_message;

/// What a rejected duration is told to look like.
pub const EXPECTED: &str = "a duration such as \"500ms\", \"10s\", \"5m\" or \"72h\"";

/// Parses a humantime duration string (`"10s"`, `"1h 30m"`).
pub fn parse(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text.trim())
}

/// Renders a duration in the same notation the file uses (`10s`, `1h 30m`).
pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// serde `deserialize_with` helper for [`Duration`] fields.
pub fn deserialize<'de, D>(deserializer: D) -> Result<Duration, D::Error>
where
    D: Deserializer<'de>,
{
    deserializer.deserialize_str(DurationVisitor)
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
        parse(v).map_err(|_| E::custom(value_error_message(format_args!("{v:?}"), EXPECTED)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Holder {
        #[serde(deserialize_with = "deserialize")]
        d: Duration,
    }

    fn holder(toml: &str) -> Result<Duration, String> {
        config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .and_then(|c| c.try_deserialize::<Holder>())
            .map(|h| h.d)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_humantime_strings() {
        assert_eq!(parse("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse("72h").unwrap(), Duration::from_secs(72 * 3600));
        assert_eq!(parse("1h 30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(holder("d = \"10m\"").unwrap(), Duration::from_secs(600));
    }

    #[test]
    fn bare_numbers_and_unknown_units_are_refused() {
        assert!(parse("10").is_err());
        assert!(parse("10x").is_err());
        let err = holder("d = \"10x\"").unwrap_err();
        assert!(err.contains("\"10x\""), "{err}");
    }

    #[test]
    fn format_uses_file_notation() {
        assert_eq!(format(Duration::from_secs(10)), "10s");
        assert_eq!(format(Duration::from_secs(5400)), "1h 30m");
    }
}
