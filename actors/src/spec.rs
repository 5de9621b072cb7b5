//! Everything the supervisor needs to (re)build each actor, derived once from the
//! validated configuration and the opened stores.

use std::sync::Arc;
use std::time::Duration;

use sendium_profiles::{
    BindMode, Config, DestinationConfig, DestinationKind, DlrBackend, IdFormat, OnReceiptRequest, RouteTable,
};
use sendium_profiles::{HttpBody, HttpMethod, HttpParts, TemplatePiece};
use sendium_protocols::callback::CallbackTargets;
use sendium_protocols::http_provider::HttpProviderConfig;
use sendium_protocols::http_provider::render::{Encoding, Piece, Placeholder};
use sendium_protocols::receipt::IdFormat as WireIdFormat;
use sendium_protocols::smpp::client::{BindMode as WireBind, ClientConfig};
use sendium_storage::ReceiptReservations;

use crate::destination_worker::{ProviderSpec, SimulatorConfig};
use crate::ingress::ReceiptPolicy;
use crate::stores::Stores;

/// A destination as the Router plans with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationSlot {
    pub name: String,
    /// Branches its worker holds at once.
    pub capacity: usize,
    pub failover_after: Duration,
}

/// One destination worker's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DestinationSpec {
    pub name: String,
    pub id_format: WireIdFormat,
    pub window: usize,
    /// Work held for this destination moves to the next reachable destination of its
    /// route once it has been unreachable, or has kept throttling, this long.
    pub failover_after: Duration,
    pub smpp: Option<ClientConfig>,
    pub simulator: Option<SimulatorConfig>,
    pub http: Option<HttpProviderConfig>,
    /// HTTP only: one request per SMS part rather than one with the whole text.
    pub split: bool,
}

impl DestinationSpec {
    /// One `[[destinations]]` entry of a configuration.
    pub fn new(cfg: &Config, d: &DestinationConfig) -> Self {
        let max_command_length = cfg.smpp.as_ref().map(|s| s.max_command_length).unwrap_or(16_384);
        let window = usize::try_from(d.window).unwrap_or(1).max(1);
        let http = (d.kind == DestinationKind::Http).then(|| http_provider_config(cfg, d, window));
        let (smpp, simulator) = match d.kind {
            DestinationKind::Smpp => (
                Some(ClientConfig {
                    name: d.name.clone(),
                    host: d.host.clone().unwrap_or_default(),
                    port: d.port.unwrap_or(0),
                    system_id: d.system_id.clone().unwrap_or_default(),
                    password: d.password.expose().to_string(),
                    system_type: d.system_type.clone(),
                    bind: match d.bind {
                        BindMode::Transceiver => WireBind::Transceiver,
                        BindMode::TransmitterReceiver => WireBind::TransmitterReceiver,
                    },
                    window,
                    max_tps: d.max_tps,
                    enquire_link_interval: d.enquire_link_interval,
                    response_timeout: d.response_timeout,
                    reconnect_min: d.reconnect_min,
                    reconnect_max: d.reconnect_max,
                    max_command_length,
                    tls: crate::tls::destination_settings(index_of(cfg, d), d),
                }),
                None,
            ),
            DestinationKind::Http => (None, None),
            DestinationKind::Simulator => (
                None,
                Some(SimulatorConfig {
                    dlr_delay: Duration::from_millis(d.dlr_delay_ms),
                }),
            ),
        };
        DestinationSpec {
            name: d.name.clone(),
            id_format: wire_id_format(d.id_format),
            window,
            failover_after: d.failover_after,
            smpp,
            simulator,
            http,
            split: d.parts == HttpParts::Split,
        }
    }

    /// Branches its worker holds at once: enough to keep its window full while outcomes
    /// travel back, bounded so a slow destination cannot take every slot.
    pub fn capacity(&self) -> usize {
        (self.window * 4).max(256)
    }

    /// What the Router needs to know of it.
    pub fn slot(&self) -> DestinationSlot {
        DestinationSlot {
            name: self.name.clone(),
            capacity: self.capacity(),
            failover_after: self.failover_after,
        }
    }

    pub fn provider(&self) -> ProviderSpec {
        if let Some(h) = &self.http {
            return ProviderSpec::Http {
                config: h.clone(),
                split: self.split,
            };
        }
        match (&self.smpp, self.simulator) {
            (Some(c), _) => ProviderSpec::Smpp(c.clone()),
            (None, Some(s)) => ProviderSpec::Simulator(s),
            (None, None) => ProviderSpec::Simulator(SimulatorConfig {
                dlr_delay: Duration::from_millis(100),
            }),
        }
    }
}

/// `d`'s place in `[[destinations]]`, which configuration errors name it by.
fn index_of(cfg: &Config, d: &DestinationConfig) -> usize {
    cfg.destinations.iter().position(|x| x.name == d.name).unwrap_or(0)
}

/// The HTTP provider settings of a `kind = "http"` destination (validated already).
fn http_provider_config(cfg: &Config, d: &DestinationConfig, window: usize) -> HttpProviderConfig {
    let encoding = match (d.method.unwrap_or_default(), d.body.unwrap_or_default()) {
        (HttpMethod::Get, _) => Encoding::Query,
        (HttpMethod::Post, HttpBody::Json) => Encoding::Json,
        (HttpMethod::Post, HttpBody::Form) => Encoding::Form,
    };
    let templates: Vec<(String, String)> = if d.fields.is_empty() {
        sendium_profiles::default_fields()
    } else {
        d.fields.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let fields = templates
        .into_iter()
        .map(|(name, t)| {
            let pieces = sendium_profiles::parse_template(&t)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| match p {
                    TemplatePiece::Literal(s) => Some(Piece::Literal(s)),
                    TemplatePiece::Placeholder(n) => Placeholder::from_name(n).map(Piece::Value),
                })
                .collect();
            (name, pieces)
        })
        .collect();
    HttpProviderConfig {
        name: d.name.clone(),
        url: d.url.clone().unwrap_or_default(),
        encoding,
        headers: d
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.expose().to_owned()))
            .collect(),
        fields,
        id_pointer: d.id_pointer.clone(),
        callback: receipt_url(cfg, &d.name),
        window,
        max_tps: d.max_tps,
        response_timeout: d.response_timeout,
        reconnect_min: d.reconnect_min,
        reconnect_max: d.reconnect_max,
        trust: crate::tls::http_destination_trust(index_of(cfg, d), d),
    }
}

/// `{callback}`: the receipt endpoint on the HTTP listener, under `[http] public-url`
/// when set, else under the listen address (an unspecified one written as loopback).
fn receipt_url(cfg: &Config, destination: &str) -> String {
    let Some(http) = &cfg.http else {
        return String::new();
    };
    let base = match &http.public_url {
        Some(url) => url.clone(),
        None => {
            let mut addr = http.listen;
            if addr.ip().is_unspecified() {
                addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            format!("http://{addr}")
        }
    };
    // Validation accepted the base as a URL; the name is escaped as a path segment.
    let Ok(mut url) = url::Url::parse(&base) else {
        return String::new();
    };
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(["v1", "providers", destination, "receipts"]);
    }
    url.into()
}

pub struct GatewaySpec {
    pub stores: Stores,
    pub reservations: Option<Arc<ReceiptReservations>>,
    pub receipt_policy: ReceiptPolicy,
    pub routes: LiveRoutes,
    pub selection_batch: usize,
    pub max_in_flight: usize,
    pub callback_timeout: Duration,
    pub claim_lease: Duration,
    pub multipart_expiry: Duration,
    /// `[sms] max-age`: the longest a message is kept trying.
    pub max_age: Duration,
    /// The destinations at startup; a reload changes them through the supervisor, which
    /// keeps the current set.
    pub destinations: Vec<DestinationSpec>,
    /// False while draining: Ingress refuses every admission.
    pub accepting: bool,
    /// Where HTTP receipt callbacks may go (`[http] callback-allow`).
    pub callback_targets: CallbackTargets,
}

/// Where HTTP receipt callbacks may go: `[http] callback-allow` opens networks the
/// default refuses (see [`sendium_protocols::callback`]).
pub fn callback_targets(cfg: &Config) -> CallbackTargets {
    CallbackTargets::new(cfg.http.as_ref().map(|h| h.callback_allow.clone()).unwrap_or_default())
}

pub(crate) fn wire_id_format(f: IdFormat) -> WireIdFormat {
    match f {
        IdFormat::Auto => WireIdFormat::Auto,
        IdFormat::Hex => WireIdFormat::Hex,
        IdFormat::Dec => WireIdFormat::Dec,
        IdFormat::Exact => WireIdFormat::Exact,
    }
}

impl GatewaySpec {
    pub fn new(cfg: &Config, stores: Stores) -> Self {
        let receipt_policy = match (cfg.dlr.backend, cfg.dlr.on_receipt_request) {
            (DlrBackend::Disabled, OnReceiptRequest::Refuse) => ReceiptPolicy::Refuse,
            (DlrBackend::Disabled, OnReceiptRequest::Accept) => ReceiptPolicy::AcceptWithoutReceipt,
            _ => ReceiptPolicy::Track,
        };
        let destinations = cfg.destinations.iter().map(|d| DestinationSpec::new(cfg, d)).collect();
        let reservations = stores.dlr.as_ref().and_then(|d| d.capabilities().reservations);
        Self {
            stores,
            reservations,
            receipt_policy,
            routes: LiveRoutes::new(RouteTable::from_config(cfg)),
            selection_batch: cfg.sms.router_queue.batch_size,
            max_in_flight: cfg.sms.routed_work.max_in_flight,
            callback_timeout: cfg.dlr.callback_timeout,
            claim_lease: cfg.dlr.claim_lease,
            multipart_expiry: cfg.sms.multipart_expiry,
            max_age: cfg.sms.max_age,
            destinations,
            accepting: true,
            callback_targets: callback_targets(cfg),
        }
    }
}

/// The routing table the Router plans with, replaced by a reload: units planned after
/// the swap follow the new table; routes already recorded stay as they were.
#[derive(Clone)]
pub struct LiveRoutes(Arc<parking_lot::RwLock<Arc<RouteTable>>>);

impl LiveRoutes {
    pub fn new(table: RouteTable) -> Self {
        LiveRoutes(Arc::new(parking_lot::RwLock::new(Arc::new(table))))
    }

    pub fn current(&self) -> Arc<RouteTable> {
        self.0.read().clone()
    }

    pub fn replace(&self, table: RouteTable) {
        *self.0.write() = Arc::new(table);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receipt_url_is_under_the_public_url_when_set() {
        let mut cfg = Config::default();
        assert_eq!(receipt_url(&cfg, "any"), "", "no HTTP listener: no receipt URL");
        let mut http = sendium_profiles::HttpConfig {
            listen: "0.0.0.0:8080".parse().unwrap(),
            ..Default::default()
        };
        cfg.http = Some(http.clone());
        assert_eq!(
            receipt_url(&cfg, "acme sms"),
            "http://127.0.0.1:8080/v1/providers/acme%20sms/receipts"
        );
        http.public_url = Some("https://sms.example.com/gw/".to_owned());
        cfg.http = Some(http);
        assert_eq!(
            receipt_url(&cfg, "acme"),
            "https://sms.example.com/gw/v1/providers/acme/receipts"
        );
    }
}
