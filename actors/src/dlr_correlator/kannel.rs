//! Reports to a Kannel `dlr-url`: a GET of the URL with its escape codes filled in (see
//! [`sendium_protocols::kannel::dlr_url`]), for the report types the message's
//! `dlr-mask` asks for.
//!
//! Final reports (1 delivered, 2 undelivered, 16 refused by the provider) are the
//! message's receipt deliveries: stored, claimed, retried with backoff and given up after
//! retention like every receipt callback. A report the mask does not ask for finishes
//! its delivery without a request. Type 8 (the provider accepted the message) is sent
//! once the handoff recording the provider's ids is stored; it is not a stored delivery:
//! it is tried a few times while the process runs and is lost if the process stops.

use std::sync::Arc;
use std::time::Duration;

use sendium_protocols::kannel::dlr_url::{self, Report, kind};
use sendium_storage::{
    Delivery, DeliveryContent, DeliveryFinish, DlrState, Handoff, HandoffOutcome, ReceiptTarget, ReplyPath, Timestamp,
};

use super::deliver::{self, CallbackClient};

/// The Kannel report type of a receipt and whether `mask` asks for it. A refusal by the
/// provider is type 16, sent when the mask has 16 or 2, as Kannel does.
pub fn report_kind(state: DlrState, mask: u8) -> Option<u8> {
    let (kind, wanted) = match state {
        DlrState::Delivered => (kind::DELIVERED, kind::DELIVERED),
        DlrState::Rejected => (kind::SMSC_REJECT, kind::SMSC_REJECT | kind::UNDELIVERED),
        _ => (kind::UNDELIVERED, kind::UNDELIVERED),
    };
    (mask & wanted != 0).then_some(kind)
}

/// The values of a report about `target`'s message.
fn report<'a>(target: &'a ReceiptTarget, url: &'a str, id: &'a str, kind: u8, text: &'a str, time: i64) -> Report<'a> {
    Report {
        kind,
        text,
        time: u64::try_from(time).unwrap_or_default(),
        sender: &target.source.addr,
        receiver: &target.destination.addr,
        message_id: id,
        service: &target.account,
        account: &target.account,
        dlr_url: url,
        ..Report::default()
    }
}

/// Deliver one receipt to its dlr-url.
pub async fn receipt(client: &CallbackClient, url: &str, mask: u8, d: &Delivery) -> DeliveryFinish {
    let DeliveryContent::Receipt(outcome) = &d.content else {
        // Only receipts are owed to a dlr-url.
        return deliver::finish(d, "kannel", Ok(true));
    };
    let Some(kind) = report_kind(outcome.state, mask) else {
        // Not in the mask: nothing to send, and nothing left to owe.
        metrics::counter!("sendium_kannel_reports_skipped_total").increment(1);
        return deliver::finish(d, "kannel", Ok(true));
    };
    let text = if kind == kind::SMSC_REJECT {
        format!("NACK/{}/Rejected", outcome.error)
    } else {
        deliver::receipt_text(d, outcome)
    };
    let id = d.target.submit_id.to_string();
    let report = report(&d.target, url, &id, kind, &text, outcome.done_at.as_unix_seconds());
    metrics::counter!("sendium_receipt_delivery_attempts_total", "channel" => "kannel").increment(1);
    let sent = deliver::get(client, &dlr_url::fill(url, &report)).await;
    deliver::finish(d, "kannel", sent)
}

/// A type 8 report owed once a handoff is stored.
#[derive(Debug, Clone)]
pub struct Accepted {
    url: String,
    target: ReceiptTarget,
    destination: String,
    provider_id: String,
}

/// The type 8 reports the submitted handoffs of a step owe.
pub fn accepted_reports(handoffs: &[Handoff]) -> Vec<Accepted> {
    let mut out = Vec::new();
    for h in handoffs {
        let HandoffOutcome::Submitted { provider_keys } = &h.outcome else {
            continue;
        };
        for t in &h.targets {
            if let ReplyPath::Kannel { url, mask } = &t.reply
                && mask & kind::SMSC_SUCCESS != 0
            {
                out.push(Accepted {
                    url: url.clone(),
                    target: t.clone(),
                    destination: h.destination.clone(),
                    provider_id: provider_keys.first().cloned().unwrap_or_default(),
                });
            }
        }
    }
    out
}

/// Attempts of one type 8 report, a second apart at first, doubling.
const ACCEPTED_ATTEMPTS: u32 = 5;

/// Send type 8 reports, each retried a few times, at most `slots` callbacks at once.
pub async fn send_accepted(client: CallbackClient, slots: Arc<tokio::sync::Semaphore>, reports: Vec<Accepted>) {
    let time = Timestamp::now().as_unix_seconds();
    let tasks = reports.into_iter().map(|a| {
        let client = client.clone();
        let slots = slots.clone();
        async move {
            let id = a.target.submit_id.to_string();
            let mut r = report(&a.target, &a.url, &id, kind::SMSC_SUCCESS, "ACK/", time);
            r.smsc_id = &a.destination;
            r.foreign_id = &a.provider_id;
            let url = dlr_url::fill(&a.url, &r);
            for attempt in 1..=ACCEPTED_ATTEMPTS {
                let sent = {
                    let _slot = slots.acquire().await;
                    metrics::counter!("sendium_receipt_delivery_attempts_total", "channel" => "kannel").increment(1);
                    deliver::get(&client, &url).await
                };
                match sent {
                    Ok(true) => return,
                    Err(true) => break,
                    _ if attempt < ACCEPTED_ATTEMPTS => {
                        tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
                    }
                    _ => {}
                }
            }
            metrics::counter!("sendium_receipt_delivery_failures_total", "channel" => "kannel", "reason" => "accepted")
                .increment(1);
            tracing::warn!("a dlr-url type 8 report was given up");
        }
    });
    futures::future::join_all(tasks).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_decides_which_receipts_are_reported() {
        assert_eq!(report_kind(DlrState::Delivered, 31), Some(1));
        assert_eq!(report_kind(DlrState::Delivered, 2), None);
        assert_eq!(report_kind(DlrState::Expired, 3), Some(2));
        assert_eq!(report_kind(DlrState::Undeliverable, 1), None);
        assert_eq!(report_kind(DlrState::Rejected, 16), Some(16));
        assert_eq!(
            report_kind(DlrState::Rejected, 2),
            Some(16),
            "Kannel reports a refusal to a mask of 2 too"
        );
        assert_eq!(report_kind(DlrState::Rejected, 1), None);
    }
}
