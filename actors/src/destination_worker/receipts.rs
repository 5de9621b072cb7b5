//! Reading a provider's deliver_sm as a delivery receipt.
//!
//! Receipts carry the provider id twice in many networks: in the Appendix B text
//! (`id:… stat:… err:…`) and in the receipted_message_id / message_state TLVs. Both are
//! used: the TLV id first (it is in submit_sm_resp format by definition), then the text
//! id normalised per the destination's `id-format`. The state comes from the text's
//! `stat:` or, failing that, from message_state.

use sendium_protocols::receipt::{IdFormat, ReceiptFields, ReceiptState, add_receipt_keys, parse_date, receipt_octets};
use sendium_protocols::smpp::client::InboundDeliver;
use sendium_storage::{DlrState, IntermediateReceipt, ProviderReceipt, ReceiptOutcome, Timestamp};

/// What a provider's deliver_sm turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// A final receipt to correlate.
    Final(ProviderReceipt),
    /// An intermediate state (ENROUTE, ACCEPTD, BUFFRED): acknowledged at once, and
    /// reported to the Kannel dlr-urls that ask for type 4.
    Intermediate(IntermediateReceipt),
    /// Not a receipt (a mobile-originated message): acknowledged and counted.
    MobileOriginated,
    /// Claims to be a receipt but has neither an id nor a state we can read.
    Unreadable,
}

pub fn dlr_state(s: ReceiptState) -> Option<DlrState> {
    Some(match s {
        ReceiptState::Delivered => DlrState::Delivered,
        ReceiptState::Expired => DlrState::Expired,
        ReceiptState::Deleted => DlrState::Deleted,
        ReceiptState::Undeliverable => DlrState::Undeliverable,
        ReceiptState::Unknown => DlrState::Unknown,
        ReceiptState::Rejected => DlrState::Rejected,
        ReceiptState::Accepted | ReceiptState::Enroute => return None,
    })
}

pub fn receipt_state(s: DlrState) -> ReceiptState {
    match s {
        DlrState::Delivered => ReceiptState::Delivered,
        DlrState::Expired => ReceiptState::Expired,
        DlrState::Deleted => ReceiptState::Deleted,
        DlrState::Undeliverable => ReceiptState::Undeliverable,
        DlrState::Unknown => ReceiptState::Unknown,
        DlrState::Rejected | DlrState::Refused => ReceiptState::Rejected,
    }
}

/// Classify one deliver_sm from `destination`.
pub fn classify(destination: &str, fmt: IdFormat, d: &InboundDeliver) -> Inbound {
    let is_receipt = d.esm_class & 0x3C == 0x04 || d.esm_class & 0x3C == 0x08 || d.receipted_message_id.is_some();
    if !is_receipt {
        return Inbound::MobileOriginated;
    }
    let body = d.message_payload.as_deref().unwrap_or(&d.short_message);
    let octets = receipt_octets(body);
    let text = ReceiptFields::parse(&octets).ok();
    // The TLV's key first, then the text id's not already among them: at most four.
    let mut keys = Vec::with_capacity(4);
    if let Some(tlv) = d.receipted_message_id.as_deref().filter(|s| !s.is_empty()) {
        add_receipt_keys(fmt, tlv, true, &mut keys);
    }
    if let Some(t) = &text {
        add_receipt_keys(fmt, t.id, false, &mut keys);
    }
    let state = text
        .as_ref()
        .map(|t| t.stat)
        .or_else(|| d.message_state.and_then(ReceiptState::from_message_state));
    let (Some(state), false) = (state, keys.is_empty()) else {
        return Inbound::Unreadable;
    };
    let Some(final_state) = dlr_state(state) else {
        let text = octets.trim().to_string();
        return Inbound::Intermediate(IntermediateReceipt {
            destination: destination.to_string(),
            keys,
            // A receipt with TLVs only has no text; its state stands in.
            text: if text.is_empty() {
                format!("stat:{}", state.stat_text())
            } else {
                text
            },
            at: Timestamp::now(),
        });
    };
    let state = final_state;
    let error = text
        .map(|t| t.err)
        .filter(|e| !e.is_empty())
        .unwrap_or("000")
        .to_string();
    let done_at = text
        .and_then(|t| t.done_date)
        .and_then(parse_date)
        .and_then(|secs| u64::try_from(secs).ok())
        .map(|s| Timestamp(s * 1000))
        .unwrap_or_else(Timestamp::now);
    Inbound::Final(ProviderReceipt {
        destination: destination.to_string(),
        keys,
        outcome: ReceiptOutcome { state, error, done_at },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendium_protocols::receipt::resp_key;
    use sendium_protocols::smpp::SmppAddress;

    fn deliver(esm: u8, text: &str, tlv_id: Option<&str>, state: Option<u8>) -> InboundDeliver {
        InboundDeliver {
            source: SmppAddress::default(),
            destination: SmppAddress::default(),
            esm_class: esm,
            data_coding: 0,
            short_message: text.as_bytes().to_vec(),
            message_payload: None,
            receipted_message_id: tlv_id.map(str::to_string),
            message_state: state,
            sar: None,
        }
    }

    #[test]
    fn text_receipt_with_decimal_id_matches_hex_resp() {
        let d = deliver(
            0x04,
            "id:1715004 sub:001 dlvrd:001 submit date:2612011200 done date:2612011201 stat:DELIVRD err:000 text:",
            None,
            None,
        );
        let Inbound::Final(r) = classify("up", IdFormat::Hex, &d) else {
            panic!("expected a final receipt");
        };
        assert!(r.keys.contains(&resp_key(IdFormat::Hex, "1A2B3C")));
        assert_eq!(r.outcome.state, DlrState::Delivered);
    }

    #[test]
    fn tlv_only_receipt() {
        let d = deliver(0x04, "", Some("abc123"), Some(5));
        let Inbound::Final(r) = classify("up", IdFormat::Exact, &d) else {
            panic!("expected a final receipt");
        };
        assert_eq!(r.keys[0], resp_key(IdFormat::Exact, "abc123"));
        assert_eq!(r.outcome.state, DlrState::Undeliverable);
    }

    #[test]
    fn intermediate_mo_and_garbage() {
        let Inbound::Intermediate(r) = classify(
            "up",
            IdFormat::Auto,
            &deliver(0x04, "id:1 stat:ENROUTE err:000", None, None),
        ) else {
            panic!("expected an intermediate receipt");
        };
        assert_eq!(
            (r.destination.as_str(), r.text.as_str()),
            ("up", "id:1 stat:ENROUTE err:000")
        );
        assert!(!r.keys.is_empty());
        let Inbound::Intermediate(r) = classify("up", IdFormat::Exact, &deliver(0x04, "", Some("abc"), Some(1))) else {
            panic!("an intermediate message_state is an intermediate receipt");
        };
        assert_eq!(r.text, "stat:ENROUTE");
        assert!(matches!(
            classify(
                "up",
                IdFormat::Auto,
                &deliver(0x04, "id:2 stat:BUFFRED err:000", None, None)
            ),
            Inbound::Intermediate(_)
        ));
        assert_eq!(
            classify("up", IdFormat::Auto, &deliver(0x00, "hi", None, None)),
            Inbound::MobileOriginated
        );
        assert_eq!(
            classify("up", IdFormat::Auto, &deliver(0x04, "garbage", None, None)),
            Inbound::Unreadable
        );
    }
}
