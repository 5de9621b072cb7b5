//! Reports to a Kannel `dlr-url`: a GET of the URL with its escape codes filled in (see
//! [`sendium_protocols::kannel::dlr_url`]), for the report types the message's
//! `dlr-mask` asks for.
//!
//! Every report is one of the message's stored deliveries: claimed, retried with backoff
//! and given up after retention like every receipt callback, and as durable as the DLR
//! store. Final reports (1 delivered, 2 undelivered, 16 refused by the provider in its
//! submit_sm_resp) are the message's receipt deliveries. Type 8 (the provider accepted
//! the message) is created in the write that stores the provider's id, type 4 in the
//! write that stores an intermediate receipt matching a message still awaiting its final
//! one (see [`sendium_storage::ProgressReport`]). A report the mask does not ask for
//! finishes its delivery without a request.

use sendium_protocols::kannel::dlr_url::{self, Report, kind};
use sendium_storage::{
    Delivery, DeliveryContent, DeliveryFinish, DlrState, Handoff, HandoffOutcome, ProgressReport, ReceiptTarget,
    ReplyPath,
};

use super::deliver::{self, CallbackClient};

/// The Kannel report type of a receipt and whether `mask` asks for it, as Kannel's SMPP
/// module decides it: a submission the provider refused in its submit_sm_resp is type
/// 16, sent when the mask has 16 or 2; every final failure the provider's receipt
/// reports (REJECTD included) is type 2.
pub fn report_kind(state: DlrState, mask: u8) -> Option<u8> {
    let (kind, wanted) = match state {
        DlrState::Delivered => (kind::DELIVERED, kind::DELIVERED),
        DlrState::Refused => (kind::SMSC_REJECT, kind::SMSC_REJECT | kind::UNDELIVERED),
        DlrState::Expired | DlrState::Deleted | DlrState::Undeliverable | DlrState::Unknown | DlrState::Rejected => {
            (kind::UNDELIVERED, kind::UNDELIVERED)
        }
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

/// Deliver one receipt or progress report to its dlr-url.
pub async fn receipt(client: &CallbackClient, url: &str, mask: u8, d: &Delivery) -> DeliveryFinish {
    let outcome = match &d.content {
        DeliveryContent::Receipt(outcome) => outcome,
        DeliveryContent::Progress(p) => return progress(client, url, mask, d, p).await,
        // Only receipts and progress reports are owed to a dlr-url.
        DeliveryContent::Inbound(_) => return deliver::finish(d, "kannel", Ok(true)),
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

/// Deliver a progress report (type 8 or 4), the mask permitting.
async fn progress(client: &CallbackClient, url: &str, mask: u8, d: &Delivery, p: &ProgressReport) -> DeliveryFinish {
    if mask & p.kind == 0 {
        metrics::counter!("sendium_kannel_reports_skipped_total").increment(1);
        return deliver::finish(d, "kannel", Ok(true));
    }
    let id = d.target.submit_id.to_string();
    let mut r = report(&d.target, url, &id, p.kind, &p.text, p.at.as_unix_seconds());
    r.smsc_id = &p.smsc;
    r.foreign_id = &p.foreign_id;
    metrics::counter!("sendium_receipt_delivery_attempts_total", "channel" => "kannel").increment(1);
    let sent = deliver::get(client, &dlr_url::fill(url, &r)).await;
    deliver::finish(d, "kannel", sent)
}

/// Whether a handoff creates a type 8 report (see [`sendium_storage::accepted_reports`]).
pub fn owes_accepted(h: &Handoff) -> bool {
    matches!(h.outcome, HandoffOutcome::Submitted { .. })
        && h.targets
            .iter()
            .any(|t| matches!(t.reply, ReplyPath::Kannel { mask, .. } if mask & kind::SMSC_SUCCESS != 0))
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
        assert_eq!(report_kind(DlrState::Refused, 16), Some(16));
        assert_eq!(
            report_kind(DlrState::Refused, 2),
            Some(16),
            "Kannel reports a refusal to a mask of 2 too"
        );
        assert_eq!(report_kind(DlrState::Refused, 1), None);
        assert_eq!(
            report_kind(DlrState::Rejected, 31),
            Some(2),
            "a provider's REJECTD receipt is undelivered"
        );
        assert_eq!(report_kind(DlrState::Rejected, 16), None);
    }
}
