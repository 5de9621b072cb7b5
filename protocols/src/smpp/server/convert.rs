//! Pure conversions of the server's hot path: a decoded submit_sm or data_sm into an
//! [`InboundSubmit`] (or the status refusing it), an [`OutboundDeliver`] into a deliver_sm,
//! and a submit_sm_resp written straight into the output buffer.

use bytes::{BufMut, BytesMut};
use rusmpp::pdus::{DataSm, DataSmResp, SubmitSm};
use rusmpp::tlvs::{Tlv, TlvValue};
use rusmpp::types::COctetString;
use rusmpp::{Command, CommandId, CommandStatus};

use super::{InboundSubmit, OutboundDeliver};
use crate::multipart::{self, MultipartError};
use crate::smpp::SmppAddress;
use crate::smpp::build::{self, Address, BuildError, ReceiptTlvs, ShortMessage};
use crate::smpp::frame::HEADER_LEN;
use crate::smpp::time;

/// The most octets `short_message` carries.
const MAX_SHORT_MESSAGE: usize = 254;

/// esm_class bit 6: the short message starts with a User Data Header.
const UDHI: u8 = 0x40;

/// Validates a submit_sm and turns it into what the pipeline sees; a relative
/// validity_period counts from now.
///
/// See the module documentation of [`super`] for the statuses.
pub(super) fn inbound_submit(sm: &SubmitSm) -> Result<InboundSubmit, CommandStatus> {
    inbound_submit_at(sm, time::now_ms)
}

/// [`inbound_submit`] with the clock passed in; it is only read when the submit has a
/// validity_period or a schedule_delivery_time, which keeps it off the common path.
fn inbound_submit_at(sm: &SubmitSm, now_ms: impl Fn() -> u64) -> Result<InboundSubmit, CommandStatus> {
    inbound(
        Fields {
            service_type: sm.service_type.value().as_str(),
            source: SmppAddress {
                ton: u8::from(sm.source_addr_ton),
                npi: u8::from(sm.source_addr_npi),
                addr: sm.source_addr.as_str().to_owned(),
            },
            destination: (
                u8::from(sm.dest_addr_ton),
                u8::from(sm.dest_addr_npi),
                sm.destination_addr.as_str(),
            ),
            esm_class: u8::from(sm.esm_class),
            protocol_id: sm.protocol_id,
            priority_flag: u8::from(sm.priority_flag),
            registered_delivery: u8::from(sm.registered_delivery),
            data_coding: u8::from(sm.data_coding),
            short_message: sm.short_message().as_ref(),
            tlvs: sm.tlvs(),
            validity_period: sm.validity_period.as_str(),
            schedule_delivery_time: sm.schedule_delivery_time.as_str(),
        },
        now_ms,
    )
}

/// A data_sm (§4.7.1) as a submission: its user data is in message_payload (a data_sm
/// has no short_message), and it has no protocol_id, priority or validity_period.
pub(super) fn inbound_data_sm(dsm: &DataSm) -> Result<InboundSubmit, CommandStatus> {
    inbound(
        Fields {
            service_type: dsm.service_type.value().as_str(),
            source: SmppAddress {
                ton: u8::from(dsm.source_addr_ton),
                npi: u8::from(dsm.source_addr_npi),
                addr: dsm.source_addr.as_str().to_owned(),
            },
            destination: (
                u8::from(dsm.dest_addr_ton),
                u8::from(dsm.dest_addr_npi),
                dsm.destination_addr.as_str(),
            ),
            esm_class: u8::from(dsm.esm_class),
            protocol_id: 0,
            priority_flag: 0,
            registered_delivery: u8::from(dsm.registered_delivery),
            data_coding: u8::from(dsm.data_coding),
            short_message: &[],
            tlvs: dsm.tlvs(),
            validity_period: "",
            schedule_delivery_time: "",
        },
        time::now_ms,
    )
}

/// What a submit_sm and a data_sm share.
struct Fields<'a> {
    service_type: &'a str,
    source: SmppAddress,
    /// ton, npi, address.
    destination: (u8, u8, &'a str),
    esm_class: u8,
    protocol_id: u8,
    priority_flag: u8,
    registered_delivery: u8,
    data_coding: u8,
    short_message: &'a [u8],
    tlvs: &'a [Tlv],
    validity_period: &'a str,
    schedule_delivery_time: &'a str,
}

fn inbound(f: Fields<'_>, now_ms: impl Fn() -> u64) -> Result<InboundSubmit, CommandStatus> {
    let (dest_ton, dest_npi, destination) = f.destination;
    if destination.is_empty() {
        return Err(CommandStatus::EsmeRinvdstadr);
    }

    let mut payload = None;
    let (mut sar_ref, mut sar_total, mut sar_seq) = (None, None, None);
    for tlv in f.tlvs {
        match tlv.value() {
            Some(TlvValue::MessagePayload(value)) => payload = Some(value.value.as_ref()),
            Some(TlvValue::SarMsgRefNum(value)) => sar_ref = Some(*value),
            Some(TlvValue::SarTotalSegments(value)) => sar_total = Some(*value),
            Some(TlvValue::SarSegmentSeqnum(value)) => sar_seq = Some(*value),
            _ => {}
        }
    }

    let short_message = f.short_message;
    let data = match payload {
        Some(_) if !short_message.is_empty() => return Err(CommandStatus::EsmeRinvmsglen),
        Some(payload) => payload,
        None => short_message,
    };

    let esm_class = f.esm_class;
    let (udh_concat, user_data) = if esm_class & UDHI != 0 {
        let (concat, _udh, user_data) = multipart::parse_udh(data).map_err(udh_status)?;
        (concat, user_data)
    } else {
        (None, data)
    };

    let sar_concat = match (sar_ref, sar_total, sar_seq) {
        (None, None, None) => None,
        (Some(reference), Some(total), Some(seq)) => {
            Some(multipart::from_sar(reference, total, seq).map_err(|_| CommandStatus::EsmeRinvtlvval)?)
        }
        _ => return Err(CommandStatus::EsmeRinvtlvval),
    };

    let validity_period = f.validity_period;
    let validity = if validity_period.is_empty() {
        None
    } else {
        time::parse(validity_period, now_ms()).map_err(|_| CommandStatus::EsmeRinvexpiry)?
    };
    let schedule = if f.schedule_delivery_time.is_empty() {
        None
    } else {
        time::parse(f.schedule_delivery_time, now_ms()).map_err(|_| CommandStatus::EsmeRinvsched)?
    };

    Ok(InboundSubmit {
        service_type: f.service_type.to_owned(),
        source: f.source,
        destination: SmppAddress {
            ton: dest_ton,
            npi: dest_npi,
            addr: destination.to_owned(),
        },
        esm_class: esm_class & !UDHI,
        protocol_id: f.protocol_id,
        priority_flag: f.priority_flag,
        registered_delivery: f.registered_delivery,
        data_coding: f.data_coding,
        user_data: user_data.to_vec(),
        // A concatenation element in the UDH describes the octets actually sent; it wins
        // over SAR TLVs (which are still validated above).
        concat: udh_concat.or(sar_concat),
        validity,
        schedule,
    })
}

/// UDHI on an empty message: the esm_class is what is wrong. Anything else: the octets of
/// the short message do not form a valid header.
fn udh_status(err: MultipartError) -> CommandStatus {
    match err {
        MultipartError::MissingUdh => CommandStatus::EsmeRinvesmclass,
        MultipartError::UdhTooLong { .. }
        | MultipartError::TruncatedElement { .. }
        | MultipartError::BadConcatLength { .. }
        | MultipartError::ZeroTotal
        | MultipartError::ZeroSeq
        | MultipartError::SeqBeyondTotal { .. } => CommandStatus::EsmeRinvmsglen,
    }
}

/// True when `id` fits a submit_sm_resp message_id: at most 64 ASCII octets, no NUL.
fn valid_message_id(id: &str) -> bool {
    id.len() <= 64 && id.bytes().all(|b| b.is_ascii() && b != 0)
}

/// Appends a submit_sm_resp to `out` without building a [`Command`]: it is the PDU the
/// server writes most, and this is the same bytes as
/// `frame::encode(&build::submit_sm_resp(seq, status, id)?)` with no allocation.
///
/// Returns false (and writes nothing) when `message_id` is not a valid message_id.
pub(super) fn put_submit_sm_resp(out: &mut BytesMut, seq: u32, status: CommandStatus, message_id: &str) -> bool {
    if !valid_message_id(message_id) {
        return false;
    }
    let length = HEADER_LEN + message_id.len() + 1;
    out.reserve(length);
    // At most 16 + 64 + 1 octets.
    out.put_u32(u32::try_from(length).unwrap_or(u32::MAX));
    out.put_u32(u32::from(CommandId::SubmitSmResp));
    out.put_u32(u32::from(status));
    out.put_u32(seq);
    out.put_slice(message_id.as_bytes());
    out.put_u8(0);
    true
}

/// Appends a data_sm_resp (§4.7.2) carrying `message_id` (empty when refused) to `out`.
/// Returns false (and writes nothing) when `message_id` is not a valid message_id.
pub(super) fn put_data_sm_resp(out: &mut BytesMut, seq: u32, status: CommandStatus, message_id: &str) -> bool {
    if !valid_message_id(message_id) {
        return false;
    }
    let mut resp = DataSmResp::builder();
    if !message_id.is_empty() {
        match <COctetString<1, 65> as std::str::FromStr>::from_str(message_id) {
            Ok(id) => resp = resp.message_id(id),
            Err(_) => return false,
        }
    }
    crate::smpp::frame::encode(&Command::new(status, seq, resp.build()), out);
    true
}

/// Builds the deliver_sm for `item`, or the status naming the field that cannot be sent.
pub(super) fn deliver_sm(seq: u32, item: &OutboundDeliver) -> Result<Command, CommandStatus> {
    let long = item.short_message.len() > MAX_SHORT_MESSAGE;
    let sm = ShortMessage {
        source: Address {
            ton: item.source.ton,
            npi: item.source.npi,
            addr: &item.source.addr,
        },
        destination: Address {
            ton: item.destination.ton,
            npi: item.destination.npi,
            addr: &item.destination.addr,
        },
        esm_class: item.esm_class,
        registered_delivery: 0,
        data_coding: item.data_coding,
        // short_message holds at most 254 octets (§5.2.21); a longer message (an
        // assembled inbound one) goes in message_payload.
        short_message: if long { &[] } else { &item.short_message },
        message_payload: long.then_some(item.short_message.as_slice()),
        sar: None,
    };
    let receipt = item.receipted_message_id.as_deref().map(|id| ReceiptTlvs {
        receipted_message_id: id,
        message_state: item.message_state.unwrap_or(0),
    });
    // build::deliver_sm writes both receipt TLVs together; a message_state without an id
    // (or the reverse) is completed rather than refused.
    build::deliver_sm(seq, &sm, receipt.as_ref()).map_err(|err| build_status(&err))
}

fn build_status(err: &BuildError) -> CommandStatus {
    match err.field {
        "source_addr" => CommandStatus::EsmeRinvsrcadr,
        "destination_addr" => CommandStatus::EsmeRinvdstadr,
        "short_message" | "message_payload" => CommandStatus::EsmeRinvmsglen,
        "receipted_message_id" => CommandStatus::EsmeRinvmsgid,
        _ => CommandStatus::EsmeRsyserr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::multipart::Concat;
    use crate::smpp::frame::{decode_frame, encode};
    use crate::text::{concat_udh_8bit, concat_udh_16bit};
    use rusmpp::Pdu;

    fn submit(esm_class: u8, short_message: &[u8], payload: Option<&[u8]>, sar: Option<(u16, u8, u8)>) -> SubmitSm {
        let sm = ShortMessage {
            source: Address {
                ton: 5,
                npi: 0,
                addr: "Sendium",
            },
            destination: Address {
                ton: 1,
                npi: 1,
                addr: "447700900123",
            },
            esm_class,
            registered_delivery: 1,
            data_coding: 8,
            short_message,
            message_payload: payload,
            sar,
        };
        let command = build::submit_sm(1, &sm).unwrap();
        // Through the wire, as the session sees it.
        let mut buf = BytesMut::new();
        encode(&command, &mut buf);
        match decode_frame(buf).unwrap().pdu() {
            Some(Pdu::SubmitSm(sm)) => sm.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn with_tlvs(mut sm: SubmitSm, tlvs: Vec<rusmpp::tlvs::MessageSubmissionRequestTlvValue>) -> SubmitSm {
        sm.set_tlvs(tlvs);
        sm
    }

    #[test]
    fn plain_submit_copies_fields() {
        let inbound = inbound_submit(&submit(0x03, b"\x00h\x00i", None, None)).unwrap();
        assert_eq!(inbound.source, SmppAddress::new(5, 0, "Sendium"));
        assert_eq!(inbound.destination, SmppAddress::new(1, 1, "447700900123"));
        assert_eq!(inbound.esm_class, 0x03);
        assert_eq!(inbound.registered_delivery, 1);
        assert_eq!(inbound.data_coding, 8);
        assert_eq!(inbound.user_data, b"\x00h\x00i");
        assert_eq!(inbound.concat, None);
        assert_eq!(inbound.service_type, "");
    }

    #[test]
    fn udh_8bit_and_16bit_are_stripped_and_read() {
        let mut sm = concat_udh_8bit(0xAB, 3, 2).to_vec();
        sm.extend_from_slice(b"part two");
        let inbound = inbound_submit(&submit(0x43, &sm, None, None)).unwrap();
        assert_eq!(inbound.esm_class, 0x03, "UDHI cleared");
        assert_eq!(inbound.user_data, b"part two");
        assert_eq!(
            inbound.concat,
            Some(Concat {
                reference: 0xAB,
                total: 3,
                seq: 2
            })
        );

        let mut sm = concat_udh_16bit(0xBEEF, 2, 1).to_vec();
        sm.extend_from_slice(b"x");
        let inbound = inbound_submit(&submit(0x40, &sm, None, None)).unwrap();
        assert_eq!(inbound.esm_class, 0x00);
        assert_eq!(inbound.user_data, b"x");
        assert_eq!(
            inbound.concat,
            Some(Concat {
                reference: 0xBEEF,
                total: 2,
                seq: 1
            })
        );

        // A UDH without concatenation: stripped, no concat.
        let inbound = inbound_submit(&submit(0x40, b"\x04\x05\x02\x0b\x84z", None, None)).unwrap();
        assert_eq!((inbound.user_data.as_slice(), inbound.concat), (&b"z"[..], None));
    }

    #[test]
    fn bad_udh_statuses() {
        assert_eq!(
            inbound_submit(&submit(0x40, b"", None, None)),
            Err(CommandStatus::EsmeRinvesmclass)
        );
        assert_eq!(
            inbound_submit(&submit(0x40, b"\x05\x00\x03", None, None)),
            Err(CommandStatus::EsmeRinvmsglen)
        );
        assert_eq!(
            inbound_submit(&submit(0x40, &concat_udh_8bit(1, 2, 3), None, None)),
            Err(CommandStatus::EsmeRinvmsglen)
        );
        // Without UDHI the same octets are just data.
        assert!(inbound_submit(&submit(0x00, b"\x05\x00\x03", None, None)).is_ok());
    }

    #[test]
    fn sar_tlvs() {
        let inbound = inbound_submit(&submit(0, b"abc", None, Some((0x1234, 4, 4)))).unwrap();
        assert_eq!(
            inbound.concat,
            Some(Concat {
                reference: 0x1234,
                total: 4,
                seq: 4
            })
        );
        assert_eq!(inbound.user_data, b"abc");
        assert_eq!(
            inbound_submit(&submit(0, b"abc", None, Some((1, 2, 0)))),
            Err(CommandStatus::EsmeRinvtlvval)
        );
        assert_eq!(
            inbound_submit(&submit(0, b"abc", None, Some((1, 0, 0)))),
            Err(CommandStatus::EsmeRinvtlvval)
        );
        use rusmpp::tlvs::MessageSubmissionRequestTlvValue as T;
        let partial = with_tlvs(
            submit(0, b"abc", None, None),
            vec![T::SarMsgRefNum(1), T::SarTotalSegments(2)],
        );
        assert_eq!(inbound_submit(&partial), Err(CommandStatus::EsmeRinvtlvval));
        // UDH concatenation wins over (valid) SAR TLVs.
        let mut sm = concat_udh_8bit(9, 2, 2).to_vec();
        sm.push(b'q');
        let both = inbound_submit(&submit(0x40, &sm, None, Some((7, 3, 1)))).unwrap();
        assert_eq!(both.concat.unwrap().reference, 9);
    }

    #[test]
    fn message_payload() {
        let long = vec![b'p'; 600];
        let inbound = inbound_submit(&submit(0, b"", Some(&long), None)).unwrap();
        assert_eq!(inbound.user_data, long);
        // A UDH inside message_payload is read too.
        let mut with_udh = concat_udh_8bit(3, 2, 1).to_vec();
        with_udh.extend_from_slice(&long);
        let inbound = inbound_submit(&submit(0x40, b"", Some(&with_udh), None)).unwrap();
        assert_eq!(inbound.user_data, long);
        assert_eq!(inbound.concat.unwrap().seq, 1);
        // Both a payload and a short message.
        let mut both = submit(0, b"", Some(b"x"), None);
        both.set_short_message(rusmpp::types::OctetString::from_static_slice(b"y").unwrap());
        assert_eq!(inbound_submit(&both), Err(CommandStatus::EsmeRinvmsglen));
    }

    #[test]
    fn validity_period() {
        let with_validity = |value: &str| {
            let mut sm = submit(0, b"x", None, None);
            sm.validity_period = rusmpp::types::EmptyOrFullCOctetString::from_string(value.to_owned()).unwrap();
            sm
        };
        let now = 1_700_000_000_000;
        // None given: the clock is not read.
        let inbound = inbound_submit_at(&submit(0, b"x", None, None), || panic!("clock read")).unwrap();
        assert_eq!(inbound.validity, None);
        assert_eq!(
            inbound_submit_at(&with_validity("000001000000000R"), || now).map(|s| s.validity),
            Ok(Some(now + 86_400_000))
        );
        assert_eq!(
            inbound_submit_at(&with_validity("250101000000004+"), || now).map(|s| s.validity),
            Ok(Some(1_735_689_600_000 - 3_600_000))
        );
        for bad in ["251301000000000+", "000001000000100R", "2023-10-01T12:00"] {
            assert_eq!(
                inbound_submit_at(&with_validity(bad), || now),
                Err(CommandStatus::EsmeRinvexpiry),
                "{bad}"
            );
        }
        // The real clock: a relative validity lands just after now.
        let before = time::now_ms();
        let validity = inbound_submit(&with_validity("000000000100000R"))
            .unwrap()
            .validity
            .unwrap();
        assert!((before + 60_000..=time::now_ms() + 60_000).contains(&validity));
    }

    #[test]
    fn schedule_delivery_time() {
        let scheduled = |value: &str| {
            let mut sm = submit(0, b"x", None, None);
            sm.schedule_delivery_time = rusmpp::types::EmptyOrFullCOctetString::from_string(value.to_owned()).unwrap();
            sm
        };
        let now = 1_700_000_000_000;
        assert_eq!(
            inbound_submit_at(&submit(0, b"x", None, None), || now).map(|s| s.schedule),
            Ok(None)
        );
        assert_eq!(
            inbound_submit_at(&scheduled("000000010000000R"), || now).map(|s| s.schedule),
            Ok(Some(now + 3_600_000))
        );
        assert_eq!(
            inbound_submit_at(&scheduled("250101090000000+"), || now).map(|s| s.schedule),
            Ok(Some(1_735_722_000_000))
        );
        for bad in ["251301000000000+", "000001000000100R", "2023-10-01T09:00"] {
            assert_eq!(
                inbound_submit_at(&scheduled(bad), || now),
                Err(CommandStatus::EsmeRinvsched),
                "{bad}"
            );
        }
    }

    #[test]
    fn empty_destination() {
        let mut sm = submit(0, b"x", None, None);
        sm.destination_addr = rusmpp::types::COctetString::empty();
        assert_eq!(inbound_submit(&sm), Err(CommandStatus::EsmeRinvdstadr));
    }

    #[test]
    fn fast_submit_sm_resp_matches_the_builder() {
        for (status, id) in [
            (CommandStatus::EsmeRok, "0190a3b2-0c4d-7000-8000-000000000001"),
            (CommandStatus::EsmeRthrottled, ""),
            (CommandStatus::EsmeRok, &*"x".repeat(64)),
        ] {
            let mut fast = BytesMut::new();
            assert!(put_submit_sm_resp(&mut fast, 77, status, id));
            let mut built = BytesMut::new();
            encode(&build::submit_sm_resp(77, status, id).unwrap(), &mut built);
            assert_eq!(fast, built);
        }
        let mut out = BytesMut::new();
        assert!(!put_submit_sm_resp(
            &mut out,
            1,
            CommandStatus::EsmeRok,
            &"x".repeat(65)
        ));
        assert!(!put_submit_sm_resp(&mut out, 1, CommandStatus::EsmeRok, "é"));
        assert!(!put_submit_sm_resp(&mut out, 1, CommandStatus::EsmeRok, "a\0b"));
        assert!(out.is_empty());
    }

    #[test]
    fn deliver_sm_carries_receipt_tlvs_and_refuses_bad_fields() {
        let item = OutboundDeliver {
            source: SmppAddress::new(1, 1, "447700900123"),
            destination: SmppAddress::new(5, 0, "Sendium"),
            esm_class: 0x04,
            data_coding: 0,
            short_message: b"id:abc stat:DELIVRD".to_vec(),
            receipted_message_id: Some("abc".into()),
            message_state: Some(2),
        };
        let command = deliver_sm(9, &item).unwrap();
        let Some(Pdu::DeliverSm(sm)) = command.pdu() else {
            panic!("not a deliver_sm");
        };
        assert_eq!(u8::from(sm.esm_class), 0x04);
        assert!(
            sm.tlvs()
                .iter()
                .any(|t| matches!(t.value(), Some(TlvValue::ReceiptedMessageId(id)) if id.as_str() == "abc"))
        );
        assert!(
            sm.tlvs()
                .iter()
                .any(|t| matches!(t.value(), Some(TlvValue::MessageState(s)) if u8::from(*s) == 2))
        );
        let plain = OutboundDeliver {
            receipted_message_id: None,
            message_state: None,
            ..item.clone()
        };
        let Some(Pdu::DeliverSm(sm)) = deliver_sm(10, &plain).unwrap().pdu().cloned() else {
            panic!("not a deliver_sm");
        };
        assert!(sm.tlvs().is_empty());
        let bad = OutboundDeliver {
            destination: SmppAddress::new(1, 1, "1".repeat(30)),
            ..item.clone()
        };
        assert_eq!(deliver_sm(11, &bad).err(), Some(CommandStatus::EsmeRinvdstadr));
        // Longer than short_message holds: sent in message_payload.
        let long = OutboundDeliver {
            short_message: vec![7; 300],
            ..item.clone()
        };
        let Some(Pdu::DeliverSm(sm)) = deliver_sm(12, &long).unwrap().pdu().cloned() else {
            panic!("not a deliver_sm");
        };
        assert!(sm.short_message().as_ref().is_empty());
        assert!(
            sm.tlvs()
                .iter()
                .any(|t| matches!(t.value(), Some(TlvValue::MessagePayload(p)) if p.value.as_ref() == [7u8; 300]))
        );
        let too_long = OutboundDeliver {
            short_message: vec![0; 70_000],
            ..item
        };
        assert_eq!(deliver_sm(13, &too_long).err(), Some(CommandStatus::EsmeRinvmsglen));
    }
}
