//! Receipts HTTP providers post to `POST /v1/providers/{destination}/receipts`: checked
//! against the destination's `receipt-secret`, read with its pointers, mapped by its
//! `receipt-status` table, and handed to the DlrCorrelator like SMPP receipts; the HTTP
//! answer waits for the DLR store exactly as a `deliver_sm_resp` does.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;

use axum::http::{HeaderMap, StatusCode};
use sendium_profiles::{Config, DestinationKind, ReceiptSignature, ReceiptState};
use sendium_protocols::http_provider::receipts::{self, Signature};
use sendium_protocols::receipt::{IdFormat, resp_key};
use sendium_storage::{DlrState, IntermediateReceipt, ProviderReceipt, ReceiptOutcome, Timestamp};

use crate::context::Shared;
use crate::dlr_correlator::{DlrMsg, ReceiptAcks, ReceiptBatch};

/// One HTTP destination's receipt settings.
struct ReceiptSettings {
    secret: sendium_profiles::Secret,
    signature: Signature,
    status: Vec<(String, ReceiptState)>,
    id_pointer: String,
    status_pointer: String,
    error_pointer: Option<String>,
    id_format: IdFormat,
}

/// The receipt settings of every HTTP destination that has a `receipt-secret`, swapped
/// whole by a reload.
pub struct ProviderReceipts {
    by_destination: RwLock<Arc<HashMap<String, ReceiptSettings>>>,
}

impl ProviderReceipts {
    pub fn new(cfg: &Config) -> Self {
        Self {
            by_destination: RwLock::new(Arc::new(settings(cfg))),
        }
    }

    /// A reload's destinations: receipts posted from now on are checked against them.
    pub fn replace(&self, cfg: &Config) {
        *self.by_destination.write() = Arc::new(settings(cfg));
    }
}

fn settings(cfg: &Config) -> HashMap<String, ReceiptSettings> {
    cfg.destinations
        .iter()
        .filter(|d| d.kind == DestinationKind::Http && !d.receipt_key.is_empty())
        .map(|d| {
            let settings = ReceiptSettings {
                secret: d.receipt_key.clone(),
                signature: match d.receipt_signature {
                    ReceiptSignature::Token => Signature::Token,
                    ReceiptSignature::HmacSha256 => Signature::HmacSha256,
                },
                status: d.receipt_status.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                id_pointer: d.receipt_id_pointer.clone().unwrap_or_default(),
                status_pointer: d.receipt_status_pointer.clone().unwrap_or_default(),
                error_pointer: d.receipt_error_pointer.clone(),
                id_format: crate::spec::wire_id_format(d.id_format),
            };
            (d.name.clone(), settings)
        })
        .collect()
}

impl ProviderReceipts {
    /// The answer to one posted body (see the module docs): 404 for a destination that
    /// takes no receipts, 401 without valid proof, 400 for a body that cannot be read or
    /// a status word the table does not list, 503 when the store refused, else 200.
    pub async fn handle(
        &self,
        shared: &Arc<Shared>,
        destination: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> StatusCode {
        let all = self.by_destination.read().clone();
        let Some(s) = all.get(destination) else {
            return StatusCode::NOT_FOUND;
        };
        let header = match s.signature {
            Signature::Token => receipts::TOKEN_HEADER,
            Signature::HmacSha256 => receipts::SIGNATURE_HEADER,
        };
        let proof = headers.get(header).map(|v| v.as_bytes());
        if !receipts::authentic(s.signature, s.secret.expose().as_bytes(), proof, body) {
            metrics::counter!("sendium_provider_receipts_refused_total", "destination" => destination.to_owned())
                .increment(1);
            tracing::warn!(
                destination,
                "posted receipts refused: missing or wrong receipt-secret proof"
            );
            return StatusCode::UNAUTHORIZED;
        }
        let at = receipts::ReceiptPointers {
            id: &s.id_pointer,
            status: &s.status_pointer,
            error: s.error_pointer.as_deref(),
        };
        let posted = match receipts::parse_receipts(body, at) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(destination, error = %e, "posted receipts cannot be read");
                return StatusCode::BAD_REQUEST;
            }
        };
        let mut batch = Vec::with_capacity(posted.len());
        let mut intermediate = Vec::new();
        for r in posted {
            let Some(state) = receipts::map_status(&s.status, &r.status) else {
                tracing::warn!(
                    destination,
                    "posted receipt has a status word receipt-status does not list"
                );
                return StatusCode::BAD_REQUEST;
            };
            let Some(state) = dlr_state(state) else {
                intermediate.push(IntermediateReceipt {
                    destination: destination.to_owned(),
                    keys: vec![resp_key(s.id_format, &r.id)],
                    text: format!("stat:{}", r.status),
                    at: Timestamp::now(),
                });
                continue;
            };
            batch.push(ProviderReceipt {
                destination: destination.to_owned(),
                keys: vec![resp_key(s.id_format, &r.id)],
                outcome: ReceiptOutcome {
                    state,
                    error: r
                        .error
                        .unwrap_or_else(|| if state.is_success() { "000" } else { "001" }.to_owned()),
                    done_at: Timestamp::now(),
                },
            });
        }
        // Acknowledged with the answer, whatever becomes of them: stored as type 4 reports
        // when a Kannel dlr-url asks for them.
        if !intermediate.is_empty() && shared.dlr_enabled {
            shared.dir.dlr.send(DlrMsg::Intermediate(intermediate));
        }
        if batch.is_empty() {
            return StatusCode::OK;
        }
        metrics::counter!("sendium_provider_receipts_total", "destination" => destination.to_owned())
            .increment(batch.len() as u64);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sent = shared.send_receipts(ReceiptBatch {
            destination: destination.to_owned(),
            receipts: batch,
            acks: Some(ReceiptAcks::http(tx)),
        });
        if !sent {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        match rx.await {
            Ok(true) => StatusCode::OK,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// The stored state of a final receipt; `None` for intermediate ones (acknowledged, and
/// reported only to Kannel dlr-urls that ask for type 4, as for SMPP).
fn dlr_state(s: ReceiptState) -> Option<DlrState> {
    Some(match s {
        ReceiptState::Delivrd => DlrState::Delivered,
        ReceiptState::Undeliv => DlrState::Undeliverable,
        ReceiptState::Expired => DlrState::Expired,
        ReceiptState::Rejectd => DlrState::Rejected,
        ReceiptState::Deleted => DlrState::Deleted,
        ReceiptState::Unknown => DlrState::Unknown,
        ReceiptState::Acceptd | ReceiptState::Enroute => return None,
    })
}
