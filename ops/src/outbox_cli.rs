//! `sendium outbox dead` and `sendium outbox retry`: the dead rows of a configured
//! source, listed for an operator (without their bodies) and put back to pending.

use sendium_actors::outbox_relay::open_source;
use sendium_outbox::relay::OutboxSource;
use sendium_profiles::Config;

/// Dead rows listed at most.
pub const DEFAULT_LIMIT: i64 = 100;

fn source(cfg: &Config, name: &str) -> Result<OutboxSource, String> {
    let (i, c) = cfg
        .outbox
        .sources
        .iter()
        .enumerate()
        .find(|(_, s)| s.name == name)
        .ok_or_else(|| {
            let names: Vec<&str> = cfg.outbox.sources.iter().map(|s| s.name.as_str()).collect();
            format!(
                "no outbox source named {name:?} in the configuration (sources: {})",
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            )
        })?;
    open_source(i, c).map_err(|e| e.to_string())
}

/// The dead rows of source `name`, one line each: id, event id, account, group,
/// attempts, created, last error.
pub async fn dead(cfg: &Config, name: &str, limit: i64) -> Result<String, String> {
    let src = source(cfg, name)?;
    let rows = src.dead(limit).await.map_err(|e| e.to_string());
    src.close().await;
    let rows = rows?;
    let mut out = format!("{} dead row(s) in source {name}", rows.len());
    if i64::try_from(rows.len()).is_ok_and(|n| n >= limit) {
        out.push_str(&format!(" (the first {limit}; --limit shows more)"));
    }
    out.push('\n');
    for r in rows {
        out.push_str(&format!(
            "id={} event_id={} account={} group={} attempts={} created_at={} error={}\n",
            r.id,
            r.event_id,
            r.account,
            r.group_key.as_deref().unwrap_or("-"),
            r.attempts,
            r.created_at,
            r.last_error.as_deref().unwrap_or("-"),
        ));
    }
    Ok(out)
}

/// Put dead rows of source `name` back to pending: every one, or the one with `event_id`.
pub async fn retry(cfg: &Config, name: &str, event_id: Option<&str>) -> Result<String, String> {
    let src = source(cfg, name)?;
    let n = src.retry_dead(event_id).await.map_err(|e| e.to_string());
    src.close().await;
    let n = n?;
    if n == 0 && event_id.is_some() {
        return Err(format!("source {name} has no dead row with that event id"));
    }
    Ok(format!("{n} dead row(s) of source {name} put back to pending\n"))
}
