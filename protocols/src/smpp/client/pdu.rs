//! Converting between the client's plain types and rusmpp PDUs.

use rusmpp::pdus::{DataSm, DataSmResp, DeliverSm};
use rusmpp::tlvs::{Tlv, TlvValue};
use rusmpp::types::{COctetString, EmptyOrFullCOctetString};
use rusmpp::values::{PriorityFlag, ServiceType};
use rusmpp::{Command, CommandStatus, Pdu};

use super::{InboundDeliver, OutboundSubmit};
use crate::smpp::SmppAddress;
use crate::smpp::build::{self, Address, BuildError, ShortMessage};

/// The most octets `short_message` can carry; more go into message_payload.
pub(crate) const MAX_SHORT_MESSAGE: usize = 255;

/// The `submit_sm` for one outbound part.
///
/// [`build::submit_sm`] validates and fills the addresses, esm_class, registered_delivery,
/// data_coding and the user data (in message_payload when longer than 255 octets); the
/// fields it leaves at their NULL value — service_type, protocol_id, priority_flag,
/// schedule_delivery_time — are set here from the part, so every field on the wire is the
/// one the part means. A schedule that is not in the future any more is left out: the
/// provider delivers at once, as it would at that time.
pub(crate) fn submit_sm(seq: u32, part: &OutboundSubmit) -> Result<Command, BuildError> {
    let long = part.short_message.len() > MAX_SHORT_MESSAGE;
    let sm = ShortMessage {
        source: address(&part.source),
        destination: address(&part.destination),
        esm_class: part.esm_class,
        registered_delivery: part.registered_delivery,
        data_coding: part.data_coding,
        short_message: if long { &[] } else { &part.short_message },
        message_payload: long.then_some(part.short_message.as_slice()),
        sar: None,
    };
    let command = build::submit_sm(seq, &sm)?;
    let schedule = match part.schedule_delivery_time {
        Some(at) if at > crate::smpp::time::now_ms() => {
            // Never dropped: a time the format cannot hold fails the part (ingress
            // refuses those, so only an old record could carry one).
            Some(crate::smpp::time::format_absolute(at).ok_or_else(|| BuildError {
                field: "schedule_delivery_time",
                reason: "later than an SMPP time can name (2099)".into(),
            })?)
        }
        _ => None,
    };
    if part.service_type.is_empty() && part.protocol_id == 0 && part.priority_flag == 0 && schedule.is_none() {
        return Ok(command);
    }
    let schedule = match schedule {
        Some(at) => EmptyOrFullCOctetString::from_string(at).map_err(|err| BuildError {
            field: "schedule_delivery_time",
            reason: err.to_string(),
        })?,
        None => EmptyOrFullCOctetString::empty(),
    };
    let service_type =
        ServiceType::new(
            COctetString::from_string(part.service_type.clone()).map_err(|err| BuildError {
                field: "service_type",
                reason: err.to_string(),
            })?,
        );
    let mut parts = command.into_parts();
    if let Some(Pdu::SubmitSm(pdu)) = parts.pdu.as_mut() {
        pdu.service_type = service_type;
        pdu.protocol_id = part.protocol_id;
        pdu.priority_flag = PriorityFlag::from(part.priority_flag);
        pdu.schedule_delivery_time = schedule;
    }
    Ok(Command::from_parts(parts))
}

fn address(a: &SmppAddress) -> Address<'_> {
    Address {
        ton: a.ton,
        npi: a.npi,
        addr: &a.addr,
    }
}

/// The command_status an SMSC would have answered a submit that we cannot even encode.
/// All of them are permanent ([`super::SubmitFailure::is_transient`] is false): the same
/// part would fail the same way again.
pub(crate) fn build_error_status(err: &BuildError) -> u32 {
    let status = match err.field {
        "source_addr" => CommandStatus::EsmeRinvsrcadr,
        "destination_addr" => CommandStatus::EsmeRinvdstadr,
        "short_message" | "message_payload" => CommandStatus::EsmeRinvmsglen,
        "service_type" => CommandStatus::EsmeRinvsertyp,
        "schedule_delivery_time" => CommandStatus::EsmeRinvsched,
        _ => CommandStatus::EsmeRsubmitfail,
    };
    u32::from(status)
}

/// `data_sm_resp` (§4.7.2) with an empty message_id.
pub(crate) fn data_sm_resp(seq: u32, status: CommandStatus) -> Command {
    Command::new(status, seq, DataSmResp::builder().build())
}

/// The TLVs a receipt is read from.
#[derive(Default)]
struct InboundTlvs {
    message_payload: Option<Vec<u8>>,
    receipted_message_id: Option<String>,
    message_state: Option<u8>,
    sar_ref: Option<u16>,
    sar_total: Option<u8>,
    sar_seq: Option<u8>,
}

impl InboundTlvs {
    fn sar(&self) -> Option<(u16, u8, u8)> {
        Some((self.sar_ref?, self.sar_total?, self.sar_seq?))
    }
}

fn inbound_tlvs(tlvs: &[Tlv]) -> InboundTlvs {
    let mut out = InboundTlvs::default();
    for tlv in tlvs {
        match tlv.value() {
            Some(TlvValue::MessagePayload(payload)) => out.message_payload = Some(payload.value.to_vec()),
            Some(TlvValue::ReceiptedMessageId(id)) => out.receipted_message_id = Some(id.as_str().to_owned()),
            Some(TlvValue::MessageState(state)) => out.message_state = Some(u8::from(*state)),
            Some(TlvValue::SarMsgRefNum(value)) => out.sar_ref = Some(*value),
            Some(TlvValue::SarTotalSegments(value)) => out.sar_total = Some(*value),
            Some(TlvValue::SarSegmentSeqnum(value)) => out.sar_seq = Some(*value),
            _ => {}
        }
    }
    out
}

fn smpp_address<T: Into<u8>, N: Into<u8>, const MIN: usize, const MAX: usize>(
    ton: T,
    npi: N,
    addr: &COctetString<MIN, MAX>,
) -> SmppAddress {
    SmppAddress::new(ton.into(), npi.into(), addr.as_str())
}

/// What the owner needs from a deliver_sm.
pub fn inbound_deliver(pdu: &DeliverSm) -> InboundDeliver {
    let tlvs = inbound_tlvs(pdu.tlvs());
    InboundDeliver {
        source: smpp_address(pdu.source_addr_ton, pdu.source_addr_npi, &pdu.source_addr),
        destination: smpp_address(pdu.dest_addr_ton, pdu.dest_addr_npi, &pdu.destination_addr),
        esm_class: u8::from(pdu.esm_class),
        data_coding: u8::from(pdu.data_coding),
        short_message: pdu.short_message().to_vec(),
        sar: tlvs.sar(),
        message_payload: tlvs.message_payload,
        receipted_message_id: tlvs.receipted_message_id,
        message_state: tlvs.message_state,
    }
}

/// A data_sm as a deliver: it has no short_message, its user data is message_payload.
pub fn inbound_data_sm(pdu: &DataSm) -> InboundDeliver {
    let tlvs = inbound_tlvs(pdu.tlvs());
    InboundDeliver {
        source: smpp_address(pdu.source_addr_ton, pdu.source_addr_npi, &pdu.source_addr),
        destination: smpp_address(pdu.dest_addr_ton, pdu.dest_addr_npi, &pdu.destination_addr),
        esm_class: u8::from(pdu.esm_class),
        data_coding: u8::from(pdu.data_coding),
        short_message: Vec::new(),
        sar: tlvs.sar(),
        message_payload: tlvs.message_payload,
        receipted_message_id: tlvs.receipted_message_id,
        message_state: tlvs.message_state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::smpp::frame::{decode_frame, encode};
    use bytes::BytesMut;

    fn part(short_message: Vec<u8>) -> OutboundSubmit {
        OutboundSubmit {
            service_type: String::new(),
            source: SmppAddress::new(5, 0, "Sendium"),
            destination: SmppAddress::new(1, 1, "447700900123"),
            esm_class: 0x40,
            protocol_id: 0,
            priority_flag: 0,
            registered_delivery: 1,
            data_coding: 8,
            short_message,
            schedule_delivery_time: None,
        }
    }

    fn round_trip(command: &Command) -> rusmpp::pdus::SubmitSm {
        let mut buf = BytesMut::new();
        encode(command, &mut buf);
        match decode_frame(buf).unwrap().pdu() {
            Some(Pdu::SubmitSm(sm)) => sm.clone(),
            other => panic!("not a submit_sm: {other:?}"),
        }
    }

    #[test]
    fn a_future_schedule_goes_out_as_an_absolute_utc_time_and_a_past_one_not_at_all() {
        let now = crate::smpp::time::now_ms();
        let mut p = part(b"hi".to_vec());
        p.esm_class = 0;
        p.schedule_delivery_time = Some(now + 3_600_000);
        let sm = round_trip(&submit_sm(1, &p).unwrap());
        let sent = sm.schedule_delivery_time.as_str().to_owned();
        assert_eq!(sent.len(), 16, "{sent}");
        assert!(sent.ends_with("00+"), "UTC: {sent}");
        let at = crate::smpp::time::parse(&sent, 0).unwrap().unwrap();
        assert!(at.abs_diff(now + 3_600_000) < 100, "{sent}");
        p.schedule_delivery_time = Some(now.saturating_sub(1_000));
        let sm = round_trip(&submit_sm(2, &p).unwrap());
        assert_eq!(sm.schedule_delivery_time.as_str(), "");
        // Later than an SMPP time can name: the part fails, it is not sent for now.
        p.schedule_delivery_time = Some(u64::MAX);
        let err = submit_sm(3, &p).unwrap_err();
        assert_eq!(err.field, "schedule_delivery_time");
        assert_eq!(build_error_status(&err), u32::from(CommandStatus::EsmeRinvsched));
    }

    #[test]
    fn every_field_of_the_part_reaches_the_wire() {
        let mut p = part(b"\x05\x00\x03\x07\x02\x01hi".to_vec());
        p.service_type = "CMT".into();
        p.protocol_id = 0x7F;
        p.priority_flag = 2;
        let sm = round_trip(&submit_sm(9, &p).unwrap());
        assert_eq!(sm.service_type.value().as_str(), "CMT");
        assert_eq!(sm.protocol_id, 0x7F);
        assert_eq!(u8::from(sm.priority_flag), 2);
        assert_eq!(u8::from(sm.esm_class), 0x40);
        assert_eq!(u8::from(sm.registered_delivery), 1);
        assert_eq!(u8::from(sm.data_coding), 8);
        assert_eq!(u8::from(sm.source_addr_ton), 5);
        assert_eq!(sm.source_addr.as_str(), "Sendium");
        assert_eq!(sm.destination_addr.as_str(), "447700900123");
        assert_eq!(&sm.short_message()[..], &p.short_message[..]);
        assert!(sm.tlvs().is_empty());
    }

    #[test]
    fn plain_part_keeps_esm_class_zero() {
        let mut p = part(b"hello".to_vec());
        p.esm_class = 0;
        let sm = round_trip(&submit_sm(1, &p).unwrap());
        assert_eq!(u8::from(sm.esm_class), 0, "never rusmpp's default 0x08");
        assert_eq!(sm.service_type.value().as_str(), "");
    }

    #[test]
    fn more_than_255_octets_go_in_message_payload() {
        let body = vec![0x41; 300];
        let sm = round_trip(&submit_sm(2, &part(body.clone())).unwrap());
        assert!(sm.short_message().is_empty());
        assert_eq!(sm.sm_length(), 0);
        let payload = inbound_tlvs(sm.tlvs()).message_payload;
        assert_eq!(payload.as_deref(), Some(&body[..]));
        // Exactly 255 still fits in short_message.
        let sm = round_trip(&submit_sm(3, &part(vec![0x41; 255])).unwrap());
        assert_eq!(sm.short_message().len(), 255);
        assert!(sm.tlvs().is_empty());
    }

    #[test]
    fn unencodable_parts_map_to_permanent_statuses() {
        let mut p = part(b"x".to_vec());
        p.destination.addr = "1".repeat(30);
        let err = submit_sm(1, &p).unwrap_err();
        assert_eq!(build_error_status(&err), 0x0B);
        let mut p = part(b"x".to_vec());
        p.service_type = "TOOLONG".into();
        let err = submit_sm(1, &p).unwrap_err();
        assert_eq!(err.field, "service_type");
        assert_eq!(build_error_status(&err), 0x15);
        let mut p = part(b"x".to_vec());
        p.source.addr = "é".into();
        assert_eq!(build_error_status(&submit_sm(1, &p).unwrap_err()), 0x0A);
        let huge = part(vec![0; 70_000]);
        assert_eq!(build_error_status(&submit_sm(1, &huge).unwrap_err()), 0x01);
        for status in [0x0A, 0x0B, 0x01, 0x15, 0x45] {
            assert!(!super::super::SubmitFailure::Status(status).is_transient());
        }
    }
}
