//! Prometheus exposition.
//!
//! Counters and histograms are recorded where things happen (through the `metrics`
//! facade; the storage crate records its fsync timings the same way); gauges of stage
//! counts, queue depths and ages are read from the actors at scrape time. Labels are
//! low-cardinality only: stage, actor, destination, status, store file name — never
//! message ids.

use std::collections::HashSet;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use sendium_actors::Snapshot;
use sendium_actors::outbox_relay::SourceView;
use sendium_actors::supervisor::ActorEntry;
use sendium_storage::Timestamp;

/// Upper bounds (seconds) of `sendium_admission_seconds`, the time from a submission's
/// batch reaching the pipeline to its answer (stored as promised, or refused), once per
/// submission. Fine below 10 ms, where an acknowledgement of a durable profile lives.
pub const ADMISSION_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0,
];

/// Upper bounds (seconds) of `sendium_outbox_relay_delay_seconds`, from a row's insert
/// to its admission: a notified relay answers within milliseconds, a polled one within
/// its `poll-interval`, a backlog in seconds or more.
pub const RELAY_DELAY_BUCKETS: &[f64] = &[
    0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
    10.0, 30.0, 60.0, 300.0,
];

/// Upper bounds (seconds) of `sendium_storage_fsync_seconds`, one fdatasync of a store
/// file: from a fast SSD's 0.1 ms to a disk that makes every acknowledgement slow.
pub const FSYNC_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Install the global recorder once. `None` if one is installed already (tests).
pub fn install() -> Option<PrometheusHandle> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("sendium_admission_seconds".into()), ADMISSION_BUCKETS)
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full(sendium_storage::file::FSYNC_SECONDS.into()),
            FSYNC_BUCKETS,
        )
        .ok()?
        .set_buckets_for_metric(
            Matcher::Full("sendium_outbox_relay_delay_seconds".into()),
            RELAY_DELAY_BUCKETS,
        )
        .ok()?
        .install_recorder()
        .ok()
}

fn age_seconds(t: Option<Timestamp>) -> f64 {
    t.map(|t| t.age(Timestamp::now()).as_secs_f64()).unwrap_or(0.0)
}

/// Set the scrape-time gauges from a snapshot of the actors.
pub fn publish(s: &Snapshot, actors: &[ActorEntry], ready: bool) {
    metrics::gauge!("sendium_ready").set(if ready { 1.0 } else { 0.0 });
    if let Some(i) = &s.ingress {
        metrics::gauge!("sendium_ingress_waiting_requests").set(i.waiting_requests as f64);
        if let Some(p) = &i.pending {
            metrics::gauge!("sendium_stage_records", "stage" => "pending").set(p.records as f64);
            metrics::gauge!("sendium_pending_ready_units").set(p.ready_units as f64);
            metrics::gauge!("sendium_pending_incomplete_groups").set(p.incomplete_groups as f64);
            metrics::gauge!("sendium_pending_receipt_requests").set(p.receipt_requests as f64);
            metrics::gauge!("sendium_pending_oldest_age_seconds").set(age_seconds(p.oldest_accepted_at));
        }
    }
    if let Some(sel) = &s.selector {
        metrics::gauge!("sendium_stage_records", "stage" => "router-queue").set(sel.staged as f64);
        metrics::gauge!("sendium_selector_credit").set(sel.credit as f64);
    }
    if let Some(r) = &s.router {
        metrics::gauge!("sendium_stage_records", "stage" => "routed-work").set(r.units as f64);
        metrics::gauge!("sendium_routed_open_branches").set(r.open_branches as f64);
        metrics::gauge!("sendium_routed_awaiting_handoff").set(r.awaiting_handoff as f64);
        metrics::gauge!("sendium_router_queued_branches").set(r.queued_for_workers as f64);
        metrics::gauge!("sendium_router_free_slots").set(r.free as f64);
        metrics::gauge!("sendium_branches_waiting_oldest_age_seconds").set(r.oldest_waiting.as_secs_f64());
        for d in &r.destinations {
            let name = || d.name.clone();
            metrics::gauge!("sendium_destination_reachable", "destination" => name()).set(if d.up { 1.0 } else { 0.0 });
            metrics::gauge!("sendium_destination_assigned_branches", "destination" => name()).set(d.assigned as f64);
            metrics::gauge!("sendium_branches_waiting", "destination" => name()).set(d.waiting as f64);
        }
    }
    if let Some(d) = &s.dlr {
        if let Some(st) = &d.store {
            metrics::gauge!("sendium_stage_records", "stage" => "dlr").set(st.awaiting_receipts as f64);
            metrics::gauge!("sendium_dlr_correlations").set(st.correlations as f64);
            metrics::gauge!("sendium_dlr_pending_receipts").set(st.pending_deliveries as f64);
            metrics::gauge!("sendium_dlr_oldest_pending_receipt_age_seconds")
                .set(age_seconds(st.oldest_pending_delivery));
            metrics::gauge!("sendium_dlr_unmatched_receipts").set(st.orphans as f64);
            metrics::gauge!("sendium_mo_held_parts").set(st.inbound_parts as f64);
        }
        metrics::gauge!("sendium_dlr_deliveries_in_flight").set(d.deliveries_in_flight as f64);
        if let Some((held, cap)) = d.reserved {
            metrics::gauge!("sendium_dlr_reserved_receipts").set(held as f64);
            metrics::gauge!("sendium_dlr_capacity").set(cap as f64);
        }
    }
    for (name, w) in &s.workers {
        if let Some(w) = w {
            metrics::gauge!("sendium_destination_branches", "destination" => name.clone()).set(w.branches as f64);
            metrics::gauge!("sendium_destination_parts_in_flight", "destination" => name.clone())
                .set(w.parts_in_flight as f64);
            metrics::gauge!("sendium_destination_retries_waiting", "destination" => name.clone())
                .set(w.retries_waiting as f64);
        }
    }
    for a in actors {
        metrics::gauge!("sendium_actor_mailbox", "actor" => a.name.clone()).set(a.mailbox as f64);
        metrics::gauge!("sendium_actor_queued", "actor" => a.name.clone()).set(a.queued as f64);
        metrics::gauge!("sendium_actor_restarts", "actor" => a.name.clone()).set(a.restarts as f64);
    }
    metrics::gauge!("sendium_smpp_bound_sessions").set(s.smpp_sessions as f64);
    metrics::counter!("sendium_storage_fsyncs_total").absolute(sendium_storage::file::fsyncs());
}

/// Set the outbox sources' gauges (labelled by source name, from the configuration).
pub fn publish_outbox(sources: &[SourceView]) {
    for s in sources {
        let name = || s.name.clone();
        metrics::gauge!("sendium_outbox_source_reachable", "source" => name()).set(if s.reachable { 1.0 } else { 0.0 });
        metrics::gauge!("sendium_outbox_partitions_held", "source" => name()).set(s.held.len() as f64);
        if let Some(n) = s.backlog {
            metrics::gauge!("sendium_outbox_backlog_rows", "source" => name()).set(n as f64);
        }
        if let Some(age) = s.oldest_seconds {
            metrics::gauge!("sendium_outbox_oldest_row_age_seconds", "source" => name()).set(age);
        }
        if let Some(n) = s.dead {
            metrics::gauge!("sendium_outbox_dead_rows", "source" => name()).set(n as f64);
        }
    }
}

/// The destinations and outbox sources the gateway has now, whose series `/metrics` shows.
pub struct Present<'a> {
    /// Destination workers, a retiring one (removed by a reload, finishing what it had in
    /// flight) included until it stopped.
    pub destinations: HashSet<&'a str>,
    pub sources: HashSet<&'a str>,
}

impl<'a> Present<'a> {
    pub fn of(s: &'a Snapshot, sources: &'a [SourceView]) -> Self {
        Present {
            destinations: s.workers.iter().map(|(name, _)| name.as_str()).collect(),
            sources: sources.iter().map(|v| v.name.as_str()).collect(),
        }
    }

    /// Whether a sample line names only what is present: its `destination`, its outbox
    /// `source`, a destination worker's `actor`, and the `from`/`to` of a failover.
    fn keeps(&self, line: &str) -> bool {
        let Some(labels) = line.find('{').map(|at| &line[at..]) else {
            return true;
        };
        let present = |key: &str, set: &HashSet<&str>, prefix: &str| {
            label(labels, key)
                .and_then(|v| v.strip_prefix(prefix))
                .is_none_or(|name| set.contains(name))
        };
        let failover = line.starts_with("sendium_branches_failed_over_total");
        present("destination", &self.destinations, "")
            && present("actor", &self.destinations, "destination-worker:")
            && (!line.starts_with("sendium_outbox_") || present("source", &self.sources, ""))
            && (!failover || (present("from", &self.destinations, "") && present("to", &self.destinations, "")))
    }
}

/// The value of label `key` in a sample's `{…}` label set (values here are names and fixed
/// words, never escaped).
fn label<'t>(labels: &'t str, key: &str) -> Option<&'t str> {
    let mut rest = labels;
    while let Some(at) = rest.find(key) {
        let before = rest[..at].chars().next_back();
        let after = &rest[at + key.len()..];
        if matches!(before, Some('{' | ','))
            && let Some(value) = after.strip_prefix("=\"")
        {
            return value.find('"').map(|end| &value[..end]);
        }
        rest = after;
    }
    None
}

/// `text` without the series of destinations and outbox sources a reload removed: the
/// exporter keeps every series it was ever given, so without this a removed destination's
/// last `sendium_destination_up` (or its queue gauges) would stay in every scrape, and in
/// every alert on them, until the process restarts.
pub fn without_removed(text: String, present: &Present<'_>) -> String {
    let sample = |l: &&str| !l.starts_with('#') && !l.is_empty();
    if text.lines().filter(sample).all(|l| present.keeps(l)) {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        if !sample(&line) || present.keeps(line) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_of_removed_destinations_and_sources_are_left_out() {
        let text = "# TYPE sendium_destination_up gauge\n\
            sendium_destination_up{destination=\"kept\"} 1\n\
            sendium_destination_up{destination=\"gone\"} 0\n\
            sendium_destination_submits_total{destination=\"gone\",result=\"ok\"} 7\n\
            sendium_provider_retries_total{reason=\"x\",destination=\"kept\"} 2\n\
            sendium_actor_restarts{actor=\"destination-worker:gone\"} 0\n\
            sendium_actor_restarts{actor=\"destination-worker:kept\"} 0\n\
            sendium_actor_restarts{actor=\"router\"} 0\n\
            sendium_outbox_backlog_rows{source=\"old\"} 3\n\
            sendium_outbox_backlog_rows{source=\"orders\"} 4\n\
            sendium_branches_failed_over_total{from=\"gone\",to=\"kept\"} 1\n\
            sendium_branches_failed_over_total{from=\"kept\",to=\"kept2\"} 1\n\
            sendium_admitted_total 9\n\
            sendium_admission_seconds_bucket{le=\"0.005\"} 9\n";
        let present = Present {
            destinations: ["kept", "kept2"].into_iter().collect(),
            sources: ["orders"].into_iter().collect(),
        };
        let out = without_removed(text.to_owned(), &present);
        assert_eq!(
            out,
            "# TYPE sendium_destination_up gauge\n\
             sendium_destination_up{destination=\"kept\"} 1\n\
             sendium_provider_retries_total{reason=\"x\",destination=\"kept\"} 2\n\
             sendium_actor_restarts{actor=\"destination-worker:kept\"} 0\n\
             sendium_actor_restarts{actor=\"router\"} 0\n\
             sendium_outbox_backlog_rows{source=\"orders\"} 4\n\
             sendium_branches_failed_over_total{from=\"kept\",to=\"kept2\"} 1\n\
             sendium_admitted_total 9\n\
             sendium_admission_seconds_bucket{le=\"0.005\"} 9\n"
        );
        // Nothing removed: the text comes back as it was.
        let all = Present {
            destinations: ["kept", "kept2", "gone"].into_iter().collect(),
            sources: ["orders", "old"].into_iter().collect(),
        };
        assert_eq!(without_removed(text.to_owned(), &all), text);
        // A label whose name ends in "destination" is not the destination label.
        assert_eq!(
            label("{from_destination=\"a\",destination=\"b\"}", "destination"),
            Some("b")
        );
        assert_eq!(label("{from_destination=\"a\"}", "destination"), None);
    }
}
