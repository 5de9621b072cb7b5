//! Routing a unit: which branches it gets and where each may go, and whom its receipt
//! is owed to. Pure functions of the route table and the unit.

use sendium_profiles::{RouteQuery, RouteTable};
use sendium_storage::{
    Branch, BranchKind, Channel, Disposition, ReceiptTarget, ReplyPath, RoutedUnit, Timestamp, Unit,
};

/// The route of a unit whose first part is `first`: the message's text is decoded only
/// when some rule matches on it.
pub(super) fn resolve<'t>(
    routes: &'t RouteTable,
    unit: &Unit,
    first: &sendium_storage::PendingRecord,
) -> Option<&'t sendium_profiles::Route> {
    route_of(routes, first, || text_of(unit))
}

/// The route a message resolves to, by `record`'s account, sender and destination, and
/// by its text only when some rule matches on text: `text` is called then. The one
/// resolution every caller shares (the Router; admission, for the stored priority;
/// Kannel's sendsms, for its `3:` answer).
pub fn route_of<'t>(
    routes: &'t RouteTable,
    record: &sendium_storage::PendingRecord,
    text: impl FnOnce() -> Option<String>,
) -> Option<&'t sendium_profiles::Route> {
    let text = routes.needs_text().then(text).flatten();
    routes.resolve(&RouteQuery {
        account: &record.account,
        source: &record.source.addr,
        destination: &record.destination.addr,
        text: text.as_deref(),
    })
}

/// The text of one record, decoded; `None` for binary data.
pub fn record_text(record: &sendium_storage::PendingRecord) -> Option<String> {
    sendium_protocols::text::decode(record.data_coding, &record.payload).ok()
}

/// The text of a unit's parts joined, decoded; `None` for binary data.
fn text_of(unit: &Unit) -> Option<String> {
    let first = unit.parts.first()?;
    let bytes: Vec<u8> = unit.parts.iter().flat_map(|p| p.payload.iter().copied()).collect();
    sendium_protocols::text::decode(first.data_coding, &bytes).ok()
}

/// Every branch routing gives a unit: the primary route with its failover targets and
/// each copied route, or — no route matched, or its multipart group expired — one primary
/// branch with nowhere to go, which fails at dispatch and carries the failure receipt.
pub(super) fn plan(routes: &RouteTable, unit: &Unit) -> RoutedUnit {
    let first = unit.parts.first();
    let (route, branches) = match (unit.disposition, first) {
        (Disposition::Deliver, Some(p)) => match resolve(routes, unit, p) {
            Some(r) => {
                let mut branches = vec![Branch {
                    no: 0,
                    kind: BranchKind::Primary,
                    targets: primary_targets(&r.to, p.destination_hint.as_deref()),
                    outcome: None,
                    failed_over_from: Vec::new(),
                }];
                for (i, copy) in r.copy_to.iter().enumerate() {
                    branches.push(Branch {
                        no: u16::try_from(i + 1).unwrap_or(u16::MAX),
                        kind: BranchKind::Copy,
                        targets: vec![copy.clone()],
                        outcome: None,
                        failed_over_from: Vec::new(),
                    });
                }
                (r.name.clone(), branches)
            }
            None => (String::new(), Vec::new()),
        },
        _ => (String::new(), Vec::new()),
    };
    let branches = if branches.is_empty() {
        // No route (or an expired group): one primary branch with nowhere to go; it
        // fails at dispatch and carries the failure receipt.
        vec![Branch {
            no: 0,
            kind: BranchKind::Primary,
            targets: Vec::new(),
            outcome: None,
            failed_over_from: Vec::new(),
        }]
    } else {
        branches
    };
    RoutedUnit {
        id: unit.id,
        members: unit.member_ids(),
        route,
        routed_at: Timestamp::now(),
        branches,
    }
}

/// The primary branch's failover order: the route's `to` list, with the destination the
/// client asked for (Kannel's `smsc` parameter) moved to the front when it is on the
/// list. A hint naming a destination the route does not list is ignored: the route
/// decides where a message may go, the client only chooses among those.
fn primary_targets(to: &[String], hint: Option<&str>) -> Vec<String> {
    let mut targets = to.to_vec();
    if let Some(at) = hint.and_then(|h| targets.iter().position(|t| t == h)) {
        let preferred = targets.remove(at);
        targets.insert(0, preferred);
    }
    targets
}

/// Receipt targets of a unit: one per submission that asked for a receipt.
pub fn receipt_targets(unit: &Unit) -> Vec<ReceiptTarget> {
    unit.parts
        .iter()
        .filter(|p| p.wants_receipt())
        .filter_map(|p| {
            let reply = match p.channel {
                Channel::Smpp => ReplyPath::Smpp,
                Channel::Http => match p.dlr_mask {
                    Some(mask) => ReplyPath::Kannel {
                        url: p.callback_url.clone()?,
                        mask,
                    },
                    None => ReplyPath::Http {
                        url: p.callback_url.clone()?,
                    },
                },
            };
            Some(ReceiptTarget {
                submit_id: p.id,
                account: p.account.clone(),
                reply,
                source: p.source.clone(),
                destination: p.destination.clone(),
                submitted_at: p.accepted_at,
                failure_only: p.receipt_on_failure_only(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use sendium_storage::{Address, MessageId, PendingRecord};

    use super::*;

    fn routes() -> RouteTable {
        let cfg = sendium_profiles::load_str(
            r#"
[[destinations]]
name = "a"
kind = "simulator"
[[destinations]]
name = "b"
kind = "simulator"
[[destinations]]
name = "audit"
kind = "simulator"
[[routes]]
name = "uk"
destination-prefix = "44"
to = ["a", "b"]
copy-to = ["audit"]
"#,
        )
        .unwrap();
        RouteTable::from_config(&cfg)
    }

    fn unit(to: &str, disposition: Disposition, receipt: Option<&str>) -> Unit {
        let id = MessageId::generate();
        let record = PendingRecord {
            id,
            account: "esme1".into(),
            channel: if receipt.is_some() {
                Channel::Http
            } else {
                Channel::Smpp
            },
            source: Address::new(5, 0, "Shop"),
            destination: Address::new(1, 1, to),
            service_type: String::new(),
            esm_class: 0,
            protocol_id: 0,
            priority: 0,
            data_coding: 0,
            payload: b"hi".to_vec(),
            part: None,
            registered_delivery: 1,
            callback_url: receipt.map(str::to_string),
            idempotency_key: None,
            accepted_at: Timestamp::now(),
            valid_until: None,
            dlr_mask: None,
            route_priority: 0,
            destination_hint: None,
            deliver_at: None,
        };
        Unit {
            id,
            disposition,
            parts: vec![record],
        }
    }

    #[test]
    fn a_matching_route_gives_its_failover_list_and_one_branch_per_copy() {
        let u = unit("447700900123", Disposition::Deliver, None);
        let routed = plan(&routes(), &u);
        assert_eq!(routed.route, "uk");
        assert_eq!(routed.members, vec![u.id]);
        let branches: Vec<(u16, BranchKind, Vec<String>)> = routed
            .branches
            .iter()
            .map(|b| (b.no, b.kind, b.targets.clone()))
            .collect();
        assert_eq!(
            branches,
            vec![
                (0, BranchKind::Primary, vec!["a".to_string(), "b".to_string()]),
                (1, BranchKind::Copy, vec!["audit".to_string()]),
            ]
        );
        assert!(
            routed
                .branches
                .iter()
                .all(|b| b.outcome.is_none() && b.failed_over_from.is_empty())
        );
    }

    #[test]
    fn a_destination_hint_on_the_route_goes_first_and_one_elsewhere_is_ignored() {
        let targets = |hint: Option<&str>| {
            let mut u = unit("447700900123", Disposition::Deliver, None);
            u.parts[0].destination_hint = hint.map(str::to_string);
            let routed = plan(&routes(), &u);
            (routed.branches[0].targets.clone(), routed.branches[1].targets.clone())
        };
        let ab = vec!["a".to_string(), "b".to_string()];
        let ba = vec!["b".to_string(), "a".to_string()];
        let audit = vec!["audit".to_string()];
        assert_eq!(targets(Some("b")), (ba, audit.clone()));
        assert_eq!(targets(Some("a")), (ab.clone(), audit.clone()));
        assert_eq!(
            targets(Some("audit")),
            (ab.clone(), audit.clone()),
            "not on the route's `to` list"
        );
        assert_eq!(targets(Some("nowhere")), (ab.clone(), audit.clone()));
        assert_eq!(targets(None), (ab, audit));
    }

    #[test]
    fn no_route_or_an_expired_group_gives_one_branch_with_nowhere_to_go() {
        for u in [
            unit("33612345678", Disposition::Deliver, None),
            unit("447700900123", Disposition::Expired, None),
        ] {
            let routed = plan(&routes(), &u);
            assert_eq!(routed.route, "");
            assert_eq!(routed.branches.len(), 1);
            assert_eq!(routed.branches[0].kind, BranchKind::Primary);
            assert!(routed.branches[0].targets.is_empty());
        }
    }

    #[test]
    fn receipts_are_owed_to_each_asking_submission_by_its_channel() {
        let smpp = unit("44", Disposition::Deliver, None);
        let targets = receipt_targets(&smpp);
        assert_eq!(targets.len(), 1);
        assert_eq!(targets[0].reply, ReplyPath::Smpp);
        let http = unit("44", Disposition::Deliver, Some("http://127.0.0.1:9/dlr"));
        assert_eq!(
            receipt_targets(&http)[0].reply,
            ReplyPath::Http {
                url: "http://127.0.0.1:9/dlr".into()
            }
        );
        let mut kannel = unit("44", Disposition::Deliver, Some("http://127.0.0.1:9/dlr?t=%d"));
        kannel.parts[0].dlr_mask = Some(3);
        assert_eq!(
            receipt_targets(&kannel)[0].reply,
            ReplyPath::Kannel {
                url: "http://127.0.0.1:9/dlr?t=%d".into(),
                mask: 3
            }
        );
        let mut quiet = unit("44", Disposition::Deliver, None);
        quiet.parts[0].registered_delivery = 0;
        assert!(receipt_targets(&quiet).is_empty());
    }
}
