//! A raw SMPP client for testing the test SMSC: frame/build only, one PDU at a time.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use rusmpp::{Command, CommandId, CommandStatus, Pdu};
use sendium_integration_tests::esme::SubmitSpec;
use sendium_integration_tests::wire::encode_to_vec;
use sendium_protocols::smpp::build::{self, BindCredentials, BindKind};
use sendium_protocols::smpp::frame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

pub const WAIT: Duration = Duration::from_secs(5);

pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
    codec: LengthDelimitedCodec,
    seq: u32,
    pub closed: bool,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            codec: frame::codec(frame::DEFAULT_MAX_COMMAND_LENGTH),
            seq: 0,
            closed: false,
        }
    }

    pub fn next_seq(&mut self) -> u32 {
        self.seq += 1;
        self.seq
    }

    pub async fn send(&mut self, command: &Command) {
        self.stream.write_all(&encode_to_vec(command)).await.unwrap();
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// The next PDU, or None on timeout / EOF (sets `closed`).
    pub async fn recv(&mut self, timeout: Duration) -> Option<Command> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(frame) = self.codec.decode(&mut self.buf).unwrap() {
                return Some(frame::decode_frame(frame).unwrap());
            }
            self.buf.reserve(64 * 1024);
            match tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.closed = true;
                    return None;
                }
                Ok(Ok(_)) => {}
            }
        }
    }

    /// Waits for a PDU with this command id, answering deliver_sm OK on the way if `ack`.
    pub async fn recv_id(&mut self, id: CommandId, timeout: Duration) -> Option<Command> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let command = self.recv(left).await?;
            if command.id() == id {
                return Some(command);
            }
        }
    }

    pub async fn bind(&mut self, kind: BindKind, system_id: &str, password: &str) -> CommandStatus {
        let seq = self.next_seq();
        let creds = BindCredentials {
            system_id,
            password,
            system_type: "",
        };
        self.send(&build::bind(kind, seq, &creds).unwrap()).await;
        let resp = self.recv(WAIT).await.expect("bind_resp");
        assert_eq!(resp.sequence_number(), seq);
        assert_eq!(BindKind::from_command_id(resp.id()), Some(kind));
        resp.status()
    }

    pub async fn bound(addr: SocketAddr, kind: BindKind) -> Raw {
        let mut raw = Raw::connect(addr).await;
        assert_eq!(raw.bind(kind, "sendium", "pw").await, CommandStatus::EsmeRok);
        raw
    }

    /// Sends a submit; returns its sequence number.
    pub async fn send_submit(&mut self, spec: &SubmitSpec) -> u32 {
        let seq = self.next_seq();
        self.send(&spec.to_command(seq).unwrap()).await;
        seq
    }

    /// Submits and waits for the response: (status, message_id).
    pub async fn submit(&mut self, spec: &SubmitSpec) -> (CommandStatus, String) {
        let seq = self.send_submit(spec).await;
        let resp = self
            .recv_id(CommandId::SubmitSmResp, WAIT)
            .await
            .expect("submit_sm_resp");
        assert_eq!(resp.sequence_number(), seq);
        let id = match resp.pdu() {
            Some(Pdu::SubmitSmResp(r)) => r.message_id().as_str().to_owned(),
            _ => String::new(),
        };
        (resp.status(), id)
    }

    pub async fn ack(&mut self, deliver: &Command) {
        self.send(&build::deliver_sm_resp(
            deliver.sequence_number(),
            CommandStatus::EsmeRok,
        ))
        .await;
    }
}

/// (short_message text, receipted_message_id, message_state, esm_class) of a deliver_sm.
pub fn receipt_parts(command: &Command) -> (String, Option<String>, Option<u8>, u8) {
    let Some(Pdu::DeliverSm(sm)) = command.pdu() else {
        panic!("not a deliver_sm: {command:?}");
    };
    let tlvs = sendium_integration_tests::wire::KnownTlvs::read(sm.tlvs());
    (
        String::from_utf8_lossy(sm.short_message().as_ref()).into_owned(),
        tlvs.receipted_message_id,
        tlvs.message_state,
        u8::from(sm.esm_class),
    )
}
