//! Server tests (test-only: compiled under `#[cfg(test)]`).

use super::*;

/// A submit_sm whose body is cut inside short_message (command_length fixed up).
fn truncated_submit(seq: u32) -> Vec<u8> {
    let mut buf = BytesMut::new();
    frame::encode(
        &build::submit_sm(seq, &text("447700900123", b"hello")).unwrap(),
        &mut buf,
    );
    let mut bytes = buf.to_vec();
    bytes.truncate(bytes.len() - 2);
    let len = u32::try_from(bytes.len()).unwrap().to_be_bytes();
    bytes[..4].copy_from_slice(&len);
    bytes
}

#[tokio::test]
async fn malformed_body_gets_generic_nack_and_the_session_continues() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    // The bad PDU and a good one in the same write (and likely the same read).
    let bad_seq = esme.next_seq();
    let good_seq = esme.next_seq();
    let mut wire = truncated_submit(bad_seq);
    let mut good = BytesMut::new();
    frame::encode(&build::submit_sm(good_seq, &text("1", b"ok")).unwrap(), &mut good);
    wire.extend_from_slice(&good);
    esme.send_raw(&wire).await;

    let nack = esme.recv().await;
    assert_eq!(
        (nack.id(), nack.sequence_number(), nack.status()),
        (CommandId::GenericNack, bad_seq, CommandStatus::EsmeRinvmsglen)
    );
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.sequence_number(), resp.status()),
        (CommandId::SubmitSmResp, good_seq, CommandStatus::EsmeRok)
    );
    // And later PDUs too.
    assert_eq!(esme.submit(&text("1", b"again")).await.status(), CommandStatus::EsmeRok);
    assert_eq!(server.handler.submits().len(), 2);
}

#[tokio::test]
async fn unknown_and_unsupported_commands_get_rinvcmdid() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    let seq = esme.next_seq();
    esme.send_raw(&raw_pdu(0x0000_0777, 0, seq, b"whatever")).await;
    let nack = esme.recv().await;
    assert_eq!(
        (nack.id(), nack.sequence_number(), nack.status()),
        (CommandId::GenericNack, seq, CommandStatus::EsmeRinvcmdid)
    );

    // query_sm decodes but is not supported.
    let seq = esme.next_seq();
    let query = rusmpp::pdus::QuerySm::builder()
        .message_id(rusmpp::types::COctetString::from_static_slice(b"abc\0").unwrap())
        .source_addr(rusmpp::types::COctetString::from_static_slice(b"1\0").unwrap())
        .build();
    esme.send(&Command::new(CommandStatus::EsmeRok, seq, query)).await;
    let nack = esme.recv().await;
    assert_eq!(
        (nack.id(), nack.sequence_number(), nack.status()),
        (CommandId::GenericNack, seq, CommandStatus::EsmeRinvcmdid)
    );

    // The other SMPP requests Sendium does not implement, and MC-only ones.
    let others: Vec<Pdu> = vec![
        rusmpp::pdus::CancelSm::default().into(),
        rusmpp::pdus::ReplaceSm::default().into(),
        rusmpp::pdus::SubmitMulti::default().into(),
        rusmpp::pdus::DeliverSm::default().into(),
    ];
    for pdu in others {
        let seq = esme.next_seq();
        let command = Command::new(CommandStatus::EsmeRok, seq, pdu);
        let id = command.id();
        esme.send(&command).await;
        let nack = esme.recv().await;
        assert_eq!(
            (nack.id(), nack.sequence_number(), nack.status()),
            (CommandId::GenericNack, seq, CommandStatus::EsmeRinvcmdid),
            "{id:?}"
        );
    }

    // A response we never asked for is not answered; a generic_nack from the ESME is
    // ignored.
    esme.send_raw(&raw_pdu(0x8000_0004, 0, 4242, b"id\0")).await;
    esme.send(&build::generic_nack(4343, CommandStatus::EsmeRsyserr)).await;
    esme.enquire_link_works().await;
}

#[tokio::test]
async fn command_length_above_the_maximum_is_nacked_and_closed() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    // 0x7FFFFFFF: the server must neither wait for 2 GiB nor allocate them.
    let mut header = raw_pdu(0x04, 0, 99, b"");
    header[..4].copy_from_slice(&0x7FFF_FFFFu32.to_be_bytes());
    esme.send_raw(&header).await;
    let nack = esme.recv().await;
    assert_eq!(
        (nack.id(), nack.sequence_number(), nack.status()),
        (CommandId::GenericNack, 99, CommandStatus::EsmeRinvcmdlen)
    );
    esme.expect_closed().await;
    eventually("the session to leave the registry", || {
        server.registry.sessions().is_empty()
    })
    .await;
}

#[tokio::test]
async fn command_length_just_above_a_small_maximum_closes() {
    let mut config = config();
    config.max_command_length = 64;
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let mut pdu = raw_pdu(0x04, 0, 5, &[0u8; 49]);
    assert_eq!(pdu.len(), 65);
    pdu.truncate(20);
    esme.send_raw(&pdu).await;
    let nack = esme.recv().await;
    assert_eq!(
        (nack.sequence_number(), nack.status()),
        (5, CommandStatus::EsmeRinvcmdlen)
    );
    esme.expect_closed().await;
}

#[tokio::test]
async fn command_length_below_the_header_closes() {
    let server = start(config(), FakeHandler::new()).await;
    for declared in [0u32, 8, 15] {
        let mut esme = server.bound(BindKind::Transceiver).await;
        let mut pdu = raw_pdu(0x15, 0, 7, b"");
        pdu[..4].copy_from_slice(&declared.to_be_bytes());
        esme.send_raw(&pdu).await;
        // A generic_nack may precede the close; nothing else may.
        match esme.recv_or_closed().await {
            None => {}
            Some(nack) => {
                assert_eq!(nack.id(), CommandId::GenericNack, "{declared}");
                assert_eq!(nack.status(), CommandStatus::EsmeRinvcmdlen);
                esme.expect_closed().await;
            }
        }
    }
    eventually("the sessions to leave the registry", || {
        server.registry.sessions().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_frame_split_over_many_writes_is_reassembled() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let seq = esme.next_seq();
    let mut buf = BytesMut::new();
    frame::encode(
        &build::submit_sm(seq, &text("447700900123", b"dribbled")).unwrap(),
        &mut buf,
    );
    for byte in buf.iter() {
        esme.send_raw(&[*byte]).await;
    }
    let resp = esme.recv().await;
    assert_eq!((resp.sequence_number(), resp.status()), (seq, CommandStatus::EsmeRok));
    assert_eq!(server.handler.submits()[0].user_data, b"dribbled");
}
