//! Inbound (mobile-originated, MO) messages: what a provider's `deliver_sm` that is not
//! a receipt becomes, how it is routed by `[[mo-routes]]`, and what the application
//! receives.
//!
//! A destination worker turns each such `deliver_sm` (or `data_sm`) into an
//! [`Arrival`]: a whole message routed to its target, a part of a multipart message to
//! hold until its group is complete, or a message no rule takes (answered per `[mo]
//! unrouted`). The DlrCorrelator stores it in the DLR store, and only then is the
//! provider answered; the store then delivers it like a receipt (see
//! [`sendium_storage::inbound`]). A multipart message is routed once it is whole, so
//! a keyword rule sees its whole text.

use std::sync::Arc;
use std::time::Duration;

use sendium_profiles::{Config, MoMessage, MoRouteError, MoRouteTable, MoTarget, MoUnrouted};
use sendium_protocols::smpp::client::InboundDeliver;
use sendium_protocols::text::{self, Alphabet};
use sendium_storage::{
    InboundGroup, InboundGroupKey, InboundMessage, InboundPart, MessageId, ReplyPath, RoutedInbound, Timestamp,
};

use crate::address::from_wire;

/// `[mo]` and `[[mo-routes]]` as the gateway uses them.
#[derive(Debug)]
pub struct MoSettings {
    pub routes: MoRouteTable,
    pub unrouted: MoUnrouted,
    pub multipart_expiry: Duration,
}

impl MoSettings {
    pub fn from_config(cfg: &Config) -> Result<Self, MoRouteError> {
        Ok(Self {
            routes: MoRouteTable::new(&cfg.mo_routes)?,
            unrouted: cfg.mo.unrouted,
            multipart_expiry: cfg.mo.multipart_expiry,
        })
    }
}

/// The inbound settings, replaced by a reload (messages routed after the swap follow
/// the new rules; messages already stored keep their target), and the counts
/// `/admin/mo` shows.
#[derive(Clone, Debug)]
pub struct LiveMo {
    settings: Arc<parking_lot::RwLock<Arc<MoSettings>>>,
    counts: Arc<MoCounts>,
}

impl LiveMo {
    pub fn new(settings: MoSettings) -> Self {
        Self {
            settings: Arc::new(parking_lot::RwLock::new(Arc::new(settings))),
            counts: Arc::default(),
        }
    }

    pub fn current(&self) -> Arc<MoSettings> {
        self.settings.read().clone()
    }

    pub fn replace(&self, settings: MoSettings) {
        *self.settings.write() = Arc::new(settings);
    }

    pub fn counts(&self) -> &MoCounts {
        &self.counts
    }

    /// `/admin/mo`: the settings, each route with its counts since start, and the
    /// counts by provider connection.
    pub fn view(&self) -> MoView {
        let settings = self.current();
        let counts = self.counts.inner.lock();
        MoView {
            unrouted: settings.unrouted.as_str(),
            multipart_expiry_seconds: settings.multipart_expiry.as_secs(),
            routes: settings
                .routes
                .routes()
                .map(|r| RouteView {
                    name: r.name.clone(),
                    to: match &r.target {
                        MoTarget::Account(a) => format!("account {a}"),
                        MoTarget::Url(u) => format!("url {}", url_origin(u)),
                    },
                    counts: counts.routes.get(&r.name).cloned().unwrap_or_default(),
                })
                .collect(),
            by_destination: counts.by_destination.clone(),
        }
    }
}

/// A URL's scheme, host and port: its path and query may hold an application's token.
fn url_origin(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(u) => u.origin().ascii_serialization(),
        Err(_) => "(invalid)".to_owned(),
    }
}

/// Inbound counts since start, by route and by provider connection.
#[derive(Debug, Default)]
pub struct MoCounts {
    inner: parking_lot::Mutex<CountsInner>,
}

#[derive(Debug, Default)]
struct CountsInner {
    routes: std::collections::BTreeMap<String, RouteCounts>,
    by_destination: std::collections::BTreeMap<String, DestinationCounts>,
}

/// One route's inbound messages since start.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct RouteCounts {
    /// Routed to it (whole messages; a multipart message once, when whole).
    pub routed: u64,
    pub delivered: u64,
    /// Given up after `[dlr] retention`.
    pub dead: u64,
    /// Delivered without every part (multipart deadline).
    pub incomplete: u64,
}

/// One provider connection's inbound messages since start.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DestinationCounts {
    /// `deliver_sm`/`data_sm` that were not receipts (parts counted one by one).
    pub received: u64,
    /// Whole messages no route took.
    pub unrouted: u64,
    /// Refused as malformed (bad UDH or SAR values).
    pub malformed: u64,
}

/// `/admin/mo`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MoView {
    pub unrouted: &'static str,
    pub multipart_expiry_seconds: u64,
    pub routes: Vec<RouteView>,
    pub by_destination: std::collections::BTreeMap<String, DestinationCounts>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RouteView {
    pub name: String,
    /// `account SYSTEM-ID` or `url ORIGIN`.
    pub to: String,
    #[serde(flatten)]
    pub counts: RouteCounts,
}

/// What happened to inbound messages, counted for `/admin/mo` and `/metrics` at once.
#[derive(Clone, Copy, Debug)]
pub enum MoEvent {
    Received,
    Unrouted,
    Malformed,
    Routed,
    Incomplete,
    Delivered,
    Dead,
}

impl MoCounts {
    /// Count `n` events for a provider connection (`Received`, `Unrouted`,
    /// `Malformed`) or a route (the others).
    pub fn add(&self, event: MoEvent, key: &str, n: u64) {
        if n == 0 {
            return;
        }
        let mut c = self.inner.lock();
        let key_owned = key.to_owned();
        match event {
            MoEvent::Received | MoEvent::Unrouted | MoEvent::Malformed => {
                let d = c.by_destination.entry(key_owned.clone()).or_default();
                let (field, name) = match event {
                    MoEvent::Received => (&mut d.received, "sendium_mo_received_total"),
                    MoEvent::Unrouted => (&mut d.unrouted, "sendium_mo_unrouted_total"),
                    _ => (&mut d.malformed, "sendium_mo_malformed_total"),
                };
                *field += n;
                metrics::counter!(name, "destination" => key_owned).increment(n);
            }
            MoEvent::Routed | MoEvent::Incomplete | MoEvent::Delivered | MoEvent::Dead => {
                let r = c.routes.entry(key_owned.clone()).or_default();
                let (field, name) = match event {
                    MoEvent::Routed => (&mut r.routed, "sendium_mo_routed_total"),
                    MoEvent::Incomplete => (&mut r.incomplete, "sendium_mo_incomplete_total"),
                    MoEvent::Delivered => (&mut r.delivered, "sendium_mo_delivered_total"),
                    _ => (&mut r.dead, "sendium_mo_dead_total"),
                };
                *field += n;
                metrics::counter!(name, "route" => key_owned).increment(n);
            }
        }
    }
}

/// What a provider's inbound message is.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A whole message and where it goes.
    Routed(RoutedInbound),
    /// A part of a multipart message some rule may take once it is whole.
    Part(InboundPart),
    /// No rule takes it.
    Unrouted,
    /// Its UDH or SAR values are not a valid part: refused.
    Malformed,
}

/// ESME_RX_R_APPN: the ESME rejects the message permanently (an unrouted message with
/// `[mo] unrouted = "reject"`, or a malformed one): the provider does not send it again.
pub const REJECTED: u32 = 0x65;

/// Read one inbound `deliver_sm` from `destination`.
pub fn arrival(settings: &MoSettings, destination: &str, pdu: &InboundDeliver, now: Timestamp) -> Arrival {
    let Ok((concat, user_data)) = pdu.user_data() else {
        return Arrival::Malformed;
    };
    let message = InboundMessage {
        id: MessageId::generate(),
        from_destination: destination.to_owned(),
        source: from_wire(pdu.source.clone()),
        destination: from_wire(pdu.destination.clone()),
        data_coding: pdu.data_coding,
        payload: user_data.to_vec(),
        received_at: now,
        route: String::new(),
        incomplete: false,
    };
    match concat {
        Some(c) if c.total > 1 => {
            let fields = MoMessage {
                from_destination: destination,
                destination: &message.destination.addr,
                text: None,
            };
            if !settings.routes.may_route(&fields) {
                return Arrival::Unrouted;
            }
            Arrival::Part(InboundPart {
                key: InboundGroupKey {
                    from_destination: destination.to_owned(),
                    source: message.source.addr.clone(),
                    destination: message.destination.addr.clone(),
                    reference: c.reference,
                    total: c.total,
                },
                seq: c.seq,
                deadline: now.saturating_add(settings.multipart_expiry),
                message,
            })
        }
        _ => route(settings, message, None).map_or(Arrival::Unrouted, Arrival::Routed),
    }
}

/// Route a whole message (`group`: the multipart group it was assembled from).
pub fn route(settings: &MoSettings, mut message: InboundMessage, group: Option<u64>) -> Option<RoutedInbound> {
    let text = decode(message.data_coding, &message.payload);
    let matched = settings.routes.route(&MoMessage {
        from_destination: &message.from_destination,
        destination: &message.destination.addr,
        text: text.as_deref(),
    })?;
    message.route = matched.name.clone();
    let (account, reply) = match &matched.target {
        MoTarget::Account(account) => (account.clone(), ReplyPath::Smpp),
        MoTarget::Url(url) => (matched.name.clone(), ReplyPath::Http { url: url.clone() }),
    };
    Some(RoutedInbound {
        account,
        reply,
        message,
        group,
    })
}

/// A group the store says is ready, assembled and routed; `None` when no rule takes the
/// whole message (the caller drops the group) or the group has no parts.
pub fn route_group(settings: &MoSettings, group: &InboundGroup) -> Option<RoutedInbound> {
    let message = group.assemble("")?;
    route(settings, message, Some(group.no))
}

/// The text of user data in `data_coding`; `None` for binary data or bytes that are not
/// valid in their coding.
pub fn decode(data_coding: u8, payload: &[u8]) -> Option<String> {
    text::decode(data_coding, payload).ok()
}

/// The coding's name as the HTTP target sees it.
pub fn coding_name(data_coding: u8) -> &'static str {
    match Alphabet::from_data_coding(data_coding) {
        Alphabet::Gsm7 => "gsm7",
        Alphabet::Ia5 => "ascii",
        Alphabet::Latin1 => "latin1",
        Alphabet::Ucs2 => "ucs2",
        Alphabet::Binary => "binary",
    }
}

/// The JSON an HTTP target receives for an inbound message.
#[derive(serde::Serialize)]
struct InboundBody<'a> {
    id: String,
    from: &'a str,
    to: &'a str,
    /// The decoded text; for binary data (`coding` "binary") the octets in hex.
    text: String,
    coding: &'static str,
    data_coding: u8,
    received_at: String,
    /// The provider connection it came from.
    destination: &'a str,
    route: &'a str,
    /// Parts were missing at the multipart deadline.
    incomplete: bool,
}

/// The JSON body of an inbound message's HTTP delivery.
pub fn http_body(m: &InboundMessage) -> Vec<u8> {
    // Bytes their text coding cannot decode are given as binary.
    let decoded = decode(m.data_coding, &m.payload);
    let coding = if decoded.is_some() {
        coding_name(m.data_coding)
    } else {
        "binary"
    };
    let text = decoded.unwrap_or_else(|| hex(&m.payload));
    let body = InboundBody {
        id: m.id.to_string(),
        from: &m.source.addr,
        to: &m.destination.addr,
        text,
        coding,
        data_coding: m.data_coding,
        received_at: crate::dlr_correlator::deliver::rfc3339(m.received_at),
        destination: &m.from_destination,
        route: &m.route,
        incomplete: m.incomplete,
    };
    // Strings and numbers in a fixed struct: encoding cannot fail.
    serde_json::to_vec(&body).unwrap_or_default()
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendium_protocols::smpp::SmppAddress;
    use sendium_storage::Address;

    fn settings(toml: &str) -> MoSettings {
        let cfg = sendium_profiles::load_str(&format!(
            "[smpp]\n[[smpp.accounts]]\nsystem-id = \"app\"\npassword = \"pw\"\n[[destinations]]\nname = \"up\"\nkind = \"simulator\"\n{toml}"
        ))
        .unwrap();
        MoSettings::from_config(&cfg).unwrap()
    }

    fn pdu(esm: u8, data_coding: u8, short_message: &[u8], sar: Option<(u16, u8, u8)>) -> InboundDeliver {
        InboundDeliver {
            source: SmppAddress::new(1, 1, "447700900001"),
            destination: SmppAddress::new(0, 0, "81234"),
            esm_class: esm,
            data_coding,
            short_message: short_message.to_vec(),
            message_payload: None,
            receipted_message_id: None,
            message_state: None,
            sar,
        }
    }

    #[test]
    fn a_whole_message_is_routed_by_keyword_and_a_part_waits_for_its_group() {
        let s = settings(
            "[[mo-routes]]\nname = \"join\"\nkeyword = \"join\"\nto-url = \"http://127.0.0.1:1/mo\"\n[[mo-routes]]\nname = \"rest\"\ndestination-prefix = \"8\"\nto-account = \"app\"",
        );
        let now = Timestamp(1_000);
        let Arrival::Routed(r) = arrival(&s, "up", &pdu(0, 0, b"JOIN club", None), now) else {
            panic!("not routed");
        };
        assert_eq!(r.message.route, "join");
        assert_eq!(
            r.reply,
            ReplyPath::Http {
                url: "http://127.0.0.1:1/mo".into()
            }
        );
        let Arrival::Routed(r) = arrival(&s, "up", &pdu(0, 0, b"hello", None), now) else {
            panic!("not routed");
        };
        assert_eq!((r.account.as_str(), &r.reply), ("app", &ReplyPath::Smpp));

        let udh = [0x05, 0x00, 0x03, 0x2a, 0x02, 0x02, b'x'];
        let Arrival::Part(p) = arrival(&s, "up", &pdu(0x40, 0, &udh, None), now) else {
            panic!("not a part");
        };
        assert_eq!((p.key.reference, p.key.total, p.seq), (0x2a, 2, 2));
        assert_eq!(p.message.payload, b"x");
        assert_eq!(p.deadline, now.saturating_add(Duration::from_secs(600)));
        let Arrival::Part(p) = arrival(&s, "up", &pdu(0, 0, b"y", Some((7, 3, 1))), now) else {
            panic!("not a SAR part");
        };
        assert_eq!((p.key.reference, p.key.total, p.seq), (7, 3, 1));
        assert_eq!(
            arrival(&s, "up", &pdu(0x40, 0, &[0x09, 0x00], None), now),
            Arrival::Malformed
        );
    }

    #[test]
    fn the_admin_view_counts_by_route_and_hides_url_paths() {
        let live = LiveMo::new(settings(
            "[[mo-routes]]\nname = \"hook\"\nto-url = \"https://app.example:8443/mo?token=s3cret\"\n[[mo-routes]]\nname = \"esme\"\nto-account = \"app\"",
        ));
        live.counts().add(MoEvent::Received, "up", 3);
        live.counts().add(MoEvent::Unrouted, "up", 1);
        live.counts().add(MoEvent::Routed, "hook", 2);
        live.counts().add(MoEvent::Delivered, "hook", 1);
        let view = live.view();
        assert_eq!((view.unrouted, view.multipart_expiry_seconds), ("ack", 600));
        assert_eq!(view.routes[0].to, "url https://app.example:8443");
        assert_eq!((view.routes[0].counts.routed, view.routes[0].counts.delivered), (2, 1));
        assert_eq!(view.routes[1].to, "account app");
        assert_eq!(view.routes[1].counts.routed, 0);
        assert_eq!(
            (view.by_destination["up"].received, view.by_destination["up"].unrouted),
            (3, 1)
        );
        assert!(!serde_json::to_string(&view).unwrap().contains("s3cret"));
    }

    #[test]
    fn unmatched_messages_and_parts_are_unrouted() {
        let s = settings("[[mo-routes]]\nname = \"only\"\ndestination-prefix = \"99\"\nto-account = \"app\"");
        assert_eq!(
            arrival(&s, "up", &pdu(0, 0, b"hi", None), Timestamp(0)),
            Arrival::Unrouted
        );
        assert_eq!(
            arrival(&s, "up", &pdu(0, 0, b"hi", Some((1, 2, 1))), Timestamp(0)),
            Arrival::Unrouted
        );
    }

    #[test]
    fn http_body_decodes_text_and_gives_binary_as_hex() {
        let mut m = InboundMessage {
            id: MessageId::generate(),
            from_destination: "up".into(),
            source: Address::new(1, 1, "447700900001"),
            destination: Address::new(0, 0, "81234"),
            data_coding: 8,
            payload: vec![0x04, 0x1f, 0x04, 0x40, 0x04, 0x38],
            received_at: Timestamp(1_764_590_400_000),
            route: "r".into(),
            incomplete: false,
        };
        let v: serde_json::Value = serde_json::from_slice(&http_body(&m)).unwrap();
        assert_eq!(v["text"], "При");
        assert_eq!(v["coding"], "ucs2");
        assert_eq!(v["from"], "447700900001");
        assert_eq!(v["to"], "81234");
        assert_eq!(v["destination"], "up");
        assert_eq!(v["received_at"], "2025-12-01T12:00:00Z");
        m.data_coding = 4;
        m.payload = vec![0xde, 0xad];
        let v: serde_json::Value = serde_json::from_slice(&http_body(&m)).unwrap();
        assert_eq!(
            (v["text"].as_str(), v["coding"].as_str()),
            (Some("dead"), Some("binary"))
        );
    }
}
