//! The client session's decoding of what a provider's SMSC sends: framing, PDU decoding,
//! and above all `deliver_sm` / `data_sm` delivery receipts with hostile text and TLVs.
//!
//! The client turns a deliver_sm into an `InboundDeliver` (`client::pdu`, private to the
//! client) and the destination worker classifies it as a receipt
//! (`sendium_actors::destination_worker::receipts::classify`); both are mirrored here
//! from the public pieces they call, so the protocols-level code they run is what is
//! fuzzed: `ReceiptText::parse`, `receipt_keys` for every `IdFormat`,
//! `ReceiptState::from_message_state`, `parse_date`, and the text decoder.
//!
//! Input, first byte:
//! - bit 7 clear: a PDU body. The low bits pick the command (deliver_sm, data_sm,
//!   submit_sm_resp, bind_transceiver_resp, …), the next four bytes are the
//!   command_status, the rest the body; the header is written for it, so every mutation
//!   lands in the body.
//! - bit 7 set: the rest is a raw byte stream from the SMSC, read as the client's
//!   `read_frames` reads it.
#![no_main]
#![forbid(unsafe_code)]

use bytes::{BufMut, BytesMut};
use libfuzzer_sys::fuzz_target;
use rusmpp::{Command, CommandId, Pdu};
use sendium_fuzz::Input;
use sendium_protocols::receipt::{IdFormat, ReceiptState, ReceiptText, parse_date, receipt_keys, resp_key};
use sendium_protocols::smpp::client::{InboundDeliver, inbound_data_sm, inbound_deliver};
use sendium_protocols::smpp::frame;
use sendium_protocols::text;
use tokio_util::codec::Decoder;

/// Commands an SMSC sends a client.
const COMMANDS: [u32; 10] = [
    0x0000_0005, // deliver_sm
    0x0000_0103, // data_sm
    0x8000_0004, // submit_sm_resp
    0x8000_0009, // bind_transceiver_resp
    0x8000_0000, // generic_nack
    0x0000_0015, // enquire_link
    0x8000_0015, // enquire_link_resp
    0x0000_0006, // unbind
    0x0000_0102, // alert_notification
    0x8000_0103, // data_sm_resp
];

const FORMATS: [IdFormat; 4] = [IdFormat::Auto, IdFormat::Hex, IdFormat::Dec, IdFormat::Exact];

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let mode = input.byte();
    let mut rbuf = BytesMut::new();
    if mode & 0x80 == 0 {
        let command_id = COMMANDS[usize::from(mode) % COMMANDS.len()];
        let status = input.u32();
        let body = input.rest();
        let Ok(length) = u32::try_from(frame::HEADER_LEN + body.len()) else {
            return;
        };
        rbuf.put_u32(length);
        rbuf.put_u32(command_id);
        rbuf.put_u32(status);
        rbuf.put_u32(7);
        rbuf.put_slice(body);
    } else {
        rbuf.extend_from_slice(input.rest());
    }

    // The client's `read_frames`.
    let mut codec = frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH);
    let mut wbuf = BytesMut::new();
    loop {
        let bytes = match codec.decode(&mut rbuf) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(err) => {
                assert!(frame::is_frame_too_long(&err), "{err}");
                let seq = frame::peek_header(&rbuf).map_or(0, |h| h.sequence_number);
                frame::encode(
                    &frame::generic_nack(seq, rusmpp::CommandStatus::EsmeRinvcmdlen),
                    &mut wbuf,
                );
                break;
            }
        };
        match frame::decode_frame(bytes) {
            Ok(command) => on_pdu(&command),
            Err(err) => {
                if let Some(reply) = err.reply() {
                    frame::encode(&reply, &mut wbuf);
                }
                if err.must_close() {
                    break;
                }
            }
        }
    }
});

/// The parts of the client's `on_pdu` that read the PDU.
fn on_pdu(command: &Command) {
    match (command.id(), command.pdu()) {
        (CommandId::SubmitSmResp, Some(Pdu::SubmitSmResp(resp))) => {
            // The provider id the receipts must find again.
            let id = resp.message_id().as_str();
            for fmt in FORMATS {
                let key = resp_key(fmt, id);
                assert_eq!(receipt_keys(fmt, id, true), vec![key]);
            }
        }
        (CommandId::DeliverSm, Some(Pdu::DeliverSm(pdu))) => classify(&inbound_deliver(pdu)),
        (CommandId::DataSm, Some(Pdu::DataSm(pdu))) => classify(&inbound_data_sm(pdu)),
        _ => {}
    }
}

/// `destination_worker::receipts::classify`, for every id format, with its invariants.
fn classify(d: &InboundDeliver) {
    let is_receipt = d.esm_class & 0x3C == 0x04 || d.esm_class & 0x3C == 0x08 || d.receipted_message_id.is_some();
    let body = d.message_payload.as_deref().unwrap_or(&d.short_message);
    if !is_receipt {
        // A mobile-originated message: its text is decoded for display.
        let _ = text::decode(d.data_coding, body);
        return;
    }
    let parsed = ReceiptText::parse(&String::from_utf8_lossy(body)).ok();
    for fmt in FORMATS {
        let mut keys = Vec::new();
        if let Some(tlv) = d.receipted_message_id.as_deref().filter(|s| !s.is_empty()) {
            keys.extend(receipt_keys(fmt, tlv, true));
        }
        if let Some(t) = &parsed {
            let from_text = receipt_keys(fmt, &t.id, false);
            assert!(!from_text.is_empty(), "no key for receipt id {:?} ({fmt:?})", t.id);
            for k in from_text {
                if !keys.contains(&k) {
                    keys.push(k);
                }
            }
        }
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "duplicate keys {keys:?}");
    }
    let state = parsed
        .as_ref()
        .map(|t| t.stat)
        .or_else(|| d.message_state.and_then(ReceiptState::from_message_state));
    if let Some(state) = state {
        assert_eq!(ReceiptState::from_message_state(state.message_state()), Some(state));
        assert_eq!(ReceiptState::from_stat_text(state.stat_text()), Some(state));
    }
    if let Some(t) = &parsed {
        for date in [&t.submit_date, &t.done_date].into_iter().flatten() {
            // Seconds since the epoch in milliseconds, as the worker stores them.
            if let Some(secs) = parse_date(date)
                && let Ok(secs) = u64::try_from(secs)
            {
                let _ = secs.checked_mul(1000).expect("a receipt date overflows milliseconds");
            }
        }
    }
}
