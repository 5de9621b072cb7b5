//! Turning a unit into the submit_sm PDUs a destination receives.
//!
//! The unit's user data (multipart parts already concatenated) is split again for the
//! provider, on encoded bytes so the text arrives exactly as the client sent it: GSM
//! 7-bit 160/153 septets, 8-bit and UCS2 140/134 octets, never splitting an escape
//! sequence or a surrogate pair. Every part carries an 8-bit concatenation UDH, and every
//! part asks for a receipt when the message wants one, because the message's state is
//! derived from every provider part.

use crate::address::to_wire;
use sendium_protocols::smpp::client::OutboundSubmit;
use sendium_protocols::text::{self, Alphabet};
use sendium_storage::{BranchFailure, Unit};

/// esm_class bit: the short_message starts with a user data header.
const UDHI: u8 = 0x40;
/// registered_delivery bit: intermediate notifications (SMPP 3.4, 5.2.17).
const INTERMEDIATE_NOTIFICATION: u8 = 0x10;

/// The provider's registered_delivery for a unit: a receipt on the final outcome when
/// asked, and intermediate notifications when a Kannel `dlr-mask` of any submission in
/// it asks for buffered reports (type 4), as Kannel's SMPP client asks.
fn registered_delivery(unit: &Unit, request_receipt: bool) -> u8 {
    let intermediate = unit.parts.iter().any(|p| {
        p.dlr_mask
            .is_some_and(|m| m & sendium_protocols::kannel::dlr_url::kind::BUFFERED != 0)
    });
    u8::from(request_receipt) | if intermediate { INTERMEDIATE_NOTIFICATION } else { 0 }
}

/// Build the provider parts of a unit. `reference` is the concatenation reference for a
/// message that needs several parts.
pub fn build_parts(unit: &Unit, request_receipt: bool, reference: u8) -> Result<Vec<OutboundSubmit>, BranchFailure> {
    let first = unit.parts.first().ok_or(BranchFailure::Unencodable)?;
    let alphabet = Alphabet::from_data_coding(first.data_coding);
    let payload = unit.payload();
    let segments = text::split(alphabet, &payload);
    let total = u8::try_from(segments.len()).map_err(|_| BranchFailure::Unencodable)?;
    // Messaging mode (bits 1..0) is kept; message type is "default"; UDHI only when split.
    let mode = first.esm_class & 0x03;
    let registered_delivery = registered_delivery(unit, request_receipt);
    let mut out = Vec::with_capacity(segments.len());
    for (i, seg) in segments.iter().enumerate() {
        let (esm_class, short_message) = if total > 1 {
            let seq = u8::try_from(i + 1).map_err(|_| BranchFailure::Unencodable)?;
            let mut sm = text::concat_udh_8bit(reference, total, seq).to_vec();
            sm.extend_from_slice(seg);
            (mode | UDHI, sm)
        } else {
            (mode, seg.to_vec())
        };
        out.push(OutboundSubmit {
            service_type: first.service_type.clone(),
            source: to_wire(&first.source),
            destination: to_wire(&first.destination),
            esm_class,
            protocol_id: first.protocol_id,
            priority_flag: first.priority,
            registered_delivery,
            data_coding: first.data_coding,
            short_message,
            schedule_delivery_time: first.deliver_at.map(|t| t.as_millis()),
        });
    }
    if out.is_empty() {
        return Err(BranchFailure::Unencodable);
    }
    Ok(out)
}

/// One part holding the unit's whole user data, unsplit and without a UDH: for HTTP
/// providers that take the whole text and split it themselves.
pub fn build_whole(unit: &Unit, request_receipt: bool) -> Result<Vec<OutboundSubmit>, BranchFailure> {
    let first = unit.parts.first().ok_or(BranchFailure::Unencodable)?;
    Ok(vec![OutboundSubmit {
        service_type: first.service_type.clone(),
        source: to_wire(&first.source),
        destination: to_wire(&first.destination),
        esm_class: first.esm_class & 0x03,
        protocol_id: first.protocol_id,
        priority_flag: first.priority,
        registered_delivery: registered_delivery(unit, request_receipt),
        data_coding: first.data_coding,
        short_message: unit.payload(),
        schedule_delivery_time: first.deliver_at.map(|t| t.as_millis()),
    }])
}

/// Tell the alphabet by name, for logs and tests.
pub fn alphabet_name(a: Alphabet) -> &'static str {
    match a {
        Alphabet::Gsm7 => "gsm7",
        Alphabet::Latin1 => "latin1",
        Alphabet::Ucs2 => "ucs2",
        Alphabet::Ia5 => "ia5",
        Alphabet::Binary => "binary",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sendium_storage::{Address, Channel, Disposition, MessageId, PartInfo, PendingRecord, Timestamp};

    fn record(dcs: u8, payload: Vec<u8>, part: Option<(u8, u8)>) -> PendingRecord {
        PendingRecord {
            id: MessageId::generate(),
            account: "esme1".into(),
            channel: Channel::Smpp,
            source: Address::new(5, 0, "Sendium"),
            destination: Address::new(1, 1, "447700900123"),
            service_type: String::new(),
            esm_class: 0x03,
            protocol_id: 0,
            priority: 0,
            data_coding: dcs,
            payload,
            part: part.map(|(total, seq)| PartInfo {
                reference: 1,
                total,
                seq,
                expires_at: Timestamp::now(),
            }),
            registered_delivery: 1,
            callback_url: None,
            idempotency_key: None,
            accepted_at: Timestamp::now(),
            valid_until: None,
            dlr_mask: None,
            route_priority: 0,
            destination_hint: None,
            deliver_at: None,
        }
    }

    fn unit(parts: Vec<PendingRecord>) -> Unit {
        Unit {
            id: parts[0].id,
            disposition: Disposition::Deliver,
            parts,
        }
    }

    #[test]
    fn short_gsm_message_is_one_part_without_udh() {
        let u = unit(vec![record(0, text::encode(Alphabet::Gsm7, "hello").unwrap(), None)]);
        let parts = build_parts(&u, true, 7).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].esm_class, 0x03, "mode kept, no UDHI");
        assert_eq!(parts[0].registered_delivery, 1);
        assert_eq!(text::decode(0, &parts[0].short_message).unwrap(), "hello");
    }

    #[test]
    fn a_kannel_mask_with_buffered_reports_asks_for_intermediate_notifications() {
        let asks = |mask: Option<u8>, request_receipt: bool| {
            let mut r = record(0, text::encode(Alphabet::Gsm7, "hello").unwrap(), None);
            r.dlr_mask = mask;
            let u = unit(vec![r]);
            let part = build_parts(&u, request_receipt, 7).unwrap()[0].registered_delivery;
            assert_eq!(part, build_whole(&u, request_receipt).unwrap()[0].registered_delivery);
            part
        };
        assert_eq!(asks(None, true), 0x01);
        assert_eq!(asks(Some(3), true), 0x01);
        assert_eq!(asks(Some(31), true), 0x11);
        assert_eq!(asks(Some(4), true), 0x11);
        assert_eq!(asks(Some(4), false), 0x10);
    }

    #[test]
    fn three_inbound_parts_are_resplit_with_udh_and_exact_text() {
        let full: String = "0123456789".repeat(40); // 400 GSM chars → 153+153+94
        let bytes = text::encode(Alphabet::Gsm7, &full).unwrap();
        let chunks: Vec<Vec<u8>> = bytes.chunks(153).map(|c| c.to_vec()).collect();
        let parts: Vec<_> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| record(0, c.clone(), Some((3, u8::try_from(i + 1).unwrap()))))
            .collect();
        let out = build_parts(&unit(parts), false, 9).unwrap();
        assert_eq!(out.len(), 3);
        let mut joined = Vec::new();
        for (i, p) in out.iter().enumerate() {
            assert_eq!(p.esm_class, 0x43);
            assert_eq!(p.registered_delivery, 0);
            assert_eq!(
                &p.short_message[..6],
                &[0x05, 0x00, 0x03, 9, 3, u8::try_from(i + 1).unwrap()]
            );
            joined.extend_from_slice(&p.short_message[6..]);
        }
        assert_eq!(text::decode(0, &joined).unwrap(), full);
    }

    #[test]
    fn ucs2_long_message_splits_on_code_units() {
        let full: String = "Привет, мир! ".repeat(10);
        let bytes = text::encode(Alphabet::Ucs2, &full).unwrap();
        let out = build_parts(&unit(vec![record(8, bytes, None)]), true, 1).unwrap();
        assert!(out.len() >= 2);
        let mut joined = Vec::new();
        for p in &out {
            assert!(p.short_message.len() <= 140);
            assert_eq!(p.data_coding, 8);
            joined.extend_from_slice(&p.short_message[6..]);
        }
        assert_eq!(text::decode(8, &joined).unwrap(), full);
    }
}
