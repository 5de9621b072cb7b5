//! Server tests (test-only: compiled under `#[cfg(test)]`).

use super::*;
use rusmpp::tlvs::TlvValue;

fn receipt(id: &str) -> OutboundDeliver {
    OutboundDeliver {
        source: SmppAddress::new(1, 1, "447700900123"),
        destination: SmppAddress::new(5, 0, "Sendium"),
        esm_class: 0x04,
        data_coding: 0,
        short_message: format!("id:{id} sub:001 dlvrd:001 stat:DELIVRD err:000").into_bytes(),
        receipted_message_id: Some(id.to_owned()),
        message_state: Some(2),
    }
}

/// Starts a deliver in the background (the ESME answers in the foreground).
fn deliver(server: &TestServer, batch: Vec<OutboundDeliver>) -> JoinHandle<Vec<DeliverOutcome>> {
    let registry = server.registry.clone();
    tokio::spawn(async move { registry.deliver("esme1", batch).await })
}

async fn outcomes(task: JoinHandle<Vec<DeliverOutcome>>) -> Vec<DeliverOutcome> {
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap()
}

/// Receives one deliver_sm; returns its sequence number and receipted_message_id.
async fn recv_deliver(esme: &mut Esme) -> (u32, String) {
    let command = esme.recv().await;
    assert_eq!(command.id(), CommandId::DeliverSm);
    let Some(Pdu::DeliverSm(sm)) = command.pdu() else {
        panic!("no body");
    };
    assert_eq!(u8::from(sm.esm_class), 0x04);
    let id = sm
        .tlvs()
        .iter()
        .find_map(|tlv| match tlv.value() {
            Some(TlvValue::ReceiptedMessageId(id)) => Some(id.as_str().to_owned()),
            _ => None,
        })
        .expect("receipted_message_id");
    assert!(
        sm.tlvs()
            .iter()
            .any(|tlv| matches!(tlv.value(), Some(TlvValue::MessageState(state)) if u8::from(*state) == 2))
    );
    (command.sequence_number(), id)
}

#[tokio::test]
async fn acked_and_refused() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;

    let task = deliver(&server, vec![receipt("a1"), receipt("a2")]);
    let (seq1, id1) = recv_deliver(&mut esme).await;
    let (seq2, id2) = recv_deliver(&mut esme).await;
    assert_eq!((id1.as_str(), id2.as_str()), ("a1", "a2"));
    assert_ne!(seq1, seq2);
    // Answered out of order, one refused.
    esme.send_all(&[
        build::deliver_sm_resp(seq2, CommandStatus::EsmeRok),
        build::deliver_sm_resp(seq1, CommandStatus::EsmeRsyserr),
    ])
    .await;
    assert_eq!(
        outcomes(task).await,
        vec![DeliverOutcome::Refused(0x08), DeliverOutcome::Acked]
    );

    // A generic_nack settles a deliver_sm too.
    let task = deliver(&server, vec![receipt("a3")]);
    let (seq, _) = recv_deliver(&mut esme).await;
    esme.send(&build::generic_nack(seq, CommandStatus::EsmeRinvcmdlen))
        .await;
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Refused(0x02)]);
}

#[tokio::test]
async fn receivers_get_deliveries_too() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Receiver).await;
    let task = deliver(&server, vec![receipt("r1")]);
    let (seq, id) = recv_deliver(&mut esme).await;
    assert_eq!(id, "r1");
    esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Acked]);
}

#[tokio::test]
async fn unanswered_deliveries_time_out() {
    let mut config = config();
    config.deliver_timeout = Duration::from_millis(150);
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let started = Instant::now();
    let task = deliver(&server, vec![receipt("t1")]);
    let (seq, _) = recv_deliver(&mut esme).await;
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Timeout]);
    assert!(started.elapsed() >= Duration::from_millis(140));
    // A late answer is ignored; the session is fine.
    esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
    esme.enquire_link_works().await;
}

#[tokio::test]
async fn no_session_when_no_receiver_is_bound() {
    let server = start(config(), FakeHandler::new()).await;
    assert_eq!(
        server.registry.deliver("esme1", vec![receipt("n1")]).await,
        vec![DeliverOutcome::NoSession]
    );
    // A transmitter cannot receive.
    let _tx = server.bound(BindKind::Transmitter).await;
    assert_eq!(
        server
            .registry
            .deliver("esme1", vec![receipt("n2"), receipt("n3")])
            .await,
        vec![DeliverOutcome::NoSession; 2]
    );
}

#[tokio::test]
async fn disconnected_when_the_session_closes_before_answering() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let task = deliver(&server, vec![receipt("d1")]);
    recv_deliver(&mut esme).await;
    drop(esme);
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Disconnected]);
}

#[tokio::test]
async fn deliveries_are_spread_round_robin() {
    let server = start(config(), FakeHandler::new()).await;
    let mut a = server.bound(BindKind::Transceiver).await;
    let mut b = server.bound(BindKind::Receiver).await;
    let task = deliver(&server, (0..4).map(|i| receipt(&format!("rr{i}"))).collect());
    let mut ids = Vec::new();
    for esme in [&mut a, &mut b] {
        for _ in 0..2 {
            let (seq, id) = recv_deliver(esme).await;
            ids.push(id);
            esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
        }
    }
    ids.sort();
    assert_eq!(ids, vec!["rr0", "rr1", "rr2", "rr3"]);
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Acked; 4]);

    // One-item calls alternate between the sessions.
    let first = deliver(&server, vec![receipt("x")]);
    let second = deliver(&server, vec![receipt("y")]);
    for esme in [&mut a, &mut b] {
        let (seq, _) = recv_deliver(esme).await;
        esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
    }
    assert_eq!(outcomes(first).await, vec![DeliverOutcome::Acked]);
    assert_eq!(outcomes(second).await, vec![DeliverOutcome::Acked]);
}

#[tokio::test]
async fn at_most_window_deliveries_are_outstanding() {
    let mut config = config();
    config.window = 2;
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let task = deliver(&server, (0..5).map(|i| receipt(&format!("w{i}"))).collect());

    let mut outstanding = vec![recv_deliver(&mut esme).await.0, recv_deliver(&mut esme).await.0];
    // Everything the server had room for was written in one go, before this answer: the
    // next PDU is the enquire_link_resp, not a third deliver_sm.
    esme.enquire_link_works().await;
    let mut received = 2;
    while let Some(seq) = outstanding.pop() {
        esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
        if received < 5 {
            outstanding.push(recv_deliver(&mut esme).await.0);
            received += 1;
        }
    }
    assert_eq!(outcomes(task).await, vec![DeliverOutcome::Acked; 5]);
}

#[tokio::test]
async fn queued_deliveries_are_disconnected_when_the_esme_unbinds() {
    let mut config = config();
    config.window = 1;
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let task = deliver(&server, vec![receipt("q1"), receipt("q2")]);
    let (seq, _) = recv_deliver(&mut esme).await;
    // Unbind while q1 is outstanding and q2 queued; q1 is answered before unbind_resp.
    let unbind_seq = esme.next_seq();
    esme.send_all(&[
        build::unbind(unbind_seq),
        build::deliver_sm_resp(seq, CommandStatus::EsmeRok),
    ])
    .await;
    let resp = esme.recv().await;
    assert_eq!((resp.id(), resp.sequence_number()), (CommandId::UnbindResp, unbind_seq));
    esme.expect_closed().await;
    assert_eq!(
        outcomes(task).await,
        vec![DeliverOutcome::Acked, DeliverOutcome::Disconnected]
    );
}

#[tokio::test]
async fn a_deliver_that_cannot_be_built_is_refused_with_the_fields_status() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let bad = OutboundDeliver {
        destination: SmppAddress::new(1, 1, "x".repeat(40)),
        ..receipt("b1")
    };
    let task = deliver(&server, vec![bad, receipt("b2")]);
    let (seq, id) = recv_deliver(&mut esme).await;
    assert_eq!(id, "b2");
    esme.send(&build::deliver_sm_resp(seq, CommandStatus::EsmeRok)).await;
    assert_eq!(
        outcomes(task).await,
        vec![DeliverOutcome::Refused(0x0B), DeliverOutcome::Acked]
    );
}
