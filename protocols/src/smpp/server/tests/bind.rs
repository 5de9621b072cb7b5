//! Server tests (test-only: compiled under `#[cfg(test)]`).

use super::*;

#[tokio::test]
async fn each_bind_kind_succeeds_registers_and_reports_bound() {
    let server = start(config(), FakeHandler::new()).await;
    let mut sessions = Vec::new();
    for kind in [BindKind::Transmitter, BindKind::Receiver, BindKind::Transceiver] {
        let mut esme = server.esme().await;
        let resp = esme.bind(kind, "esme1", "secret").await;
        assert_eq!(resp.status(), CommandStatus::EsmeRok);
        let system_id = match resp.pdu() {
            Some(Pdu::BindTransmitterResp(r)) => r.system_id.as_str().to_owned(),
            Some(Pdu::BindReceiverResp(r)) => r.system_id.as_str().to_owned(),
            Some(Pdu::BindTransceiverResp(r)) => r.system_id.as_str().to_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!(system_id, "sendium");
        sessions.push(esme);
    }
    assert_eq!(
        server.handler.bound_calls(),
        vec![
            ("esme1".to_owned(), false),
            ("esme1".to_owned(), true),
            ("esme1".to_owned(), true)
        ]
    );
    assert_eq!(server.registry.receivers("esme1"), 2);
    let mut binds: Vec<_> = server
        .registry
        .sessions()
        .iter()
        .map(|s| (s.account.clone(), s.bind))
        .collect();
    binds.sort();
    assert_eq!(
        binds,
        vec![
            ("esme1".to_owned(), "receiver"),
            ("esme1".to_owned(), "transceiver"),
            ("esme1".to_owned(), "transmitter")
        ]
    );

    // Sessions leave the registry when they close.
    drop(sessions);
    eventually("sessions to leave the registry", || {
        server.registry.sessions().is_empty()
    })
    .await;
    assert_eq!(server.registry.receivers("esme1"), 0);
}

#[tokio::test]
async fn unknown_system_id_and_wrong_password_are_refused_and_closed() {
    let server = start(config(), FakeHandler::new()).await;

    let mut esme = server.esme().await;
    let resp = esme.bind(BindKind::Transceiver, "nobody", "secret").await;
    assert_eq!(resp.status(), CommandStatus::EsmeRinvsysid);
    esme.expect_closed().await;

    let mut esme = server.esme().await;
    let resp = esme.bind(BindKind::Transmitter, "esme1", "wrong").await;
    assert_eq!(resp.status(), CommandStatus::EsmeRinvpaswd);
    esme.expect_closed().await;

    // The right password differs only in length from a prefix.
    let mut esme = server.esme().await;
    let resp = esme.bind(BindKind::Receiver, "esme1", "secre").await;
    assert_eq!(resp.status(), CommandStatus::EsmeRinvpaswd);
    esme.expect_closed().await;

    assert!(server.handler.bound_calls().is_empty());
    assert!(server.registry.sessions().is_empty());
}

#[tokio::test]
async fn max_binds_is_per_account_and_freed_on_close() {
    let server = start(config(), FakeHandler::new()).await;
    let mut first = server.esme().await;
    assert_eq!(
        first.bind(BindKind::Transmitter, "esme2", "pw2").await.status(),
        CommandStatus::EsmeRok
    );
    let mut second = server.esme().await;
    assert_eq!(
        second.bind(BindKind::Receiver, "esme2", "pw2").await.status(),
        CommandStatus::EsmeRbindfail
    );
    second.expect_closed().await;
    // Another account is not affected.
    let _other = server.bound(BindKind::Transceiver).await;

    drop(first);
    eventually("esme2's slot to be freed", || {
        server.registry.sessions().iter().all(|s| s.account != "esme2")
    })
    .await;
    let mut third = server.esme().await;
    assert_eq!(
        third.bind(BindKind::Transceiver, "esme2", "pw2").await.status(),
        CommandStatus::EsmeRok
    );
}

#[tokio::test]
async fn second_bind_on_a_bound_session_is_already_bound() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transmitter).await;
    let resp = esme.bind(BindKind::Transceiver, "esme1", "secret").await;
    assert_eq!(resp.status(), CommandStatus::EsmeRalybnd);
    // Still bound as a transmitter.
    esme.enquire_link_works().await;
    let resp = esme.submit(&text("447700900123", b"hi")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRok);
    assert_eq!(server.registry.sessions().len(), 1);
}

#[tokio::test]
async fn requests_before_bind_get_invalid_bind_status() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.esme().await;
    // enquire_link is fine in any state.
    esme.enquire_link_works().await;

    let resp = esme.submit(&text("447700900123", b"hi")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRinvbndsts);
    assert_eq!(message_id(&resp), "");

    let seq = esme.next_seq();
    let query = rusmpp::pdus::QuerySm::builder()
        .message_id(rusmpp::types::COctetString::from_static_slice(b"abc\0").unwrap())
        .source_addr(rusmpp::types::COctetString::from_static_slice(b"1\0").unwrap())
        .build();
    esme.send(&Command::new(CommandStatus::EsmeRok, seq, query)).await;
    let nack = esme.recv().await;
    assert_eq!(
        (nack.id(), nack.status(), nack.sequence_number()),
        (CommandId::GenericNack, CommandStatus::EsmeRinvbndsts, seq)
    );
    assert_eq!(server.handler.calls(), 0);

    // And binding afterwards still works.
    let resp = esme.bind(BindKind::Transmitter, "esme1", "secret").await;
    assert_eq!(resp.status(), CommandStatus::EsmeRok);
}

#[tokio::test]
async fn receivers_cannot_submit() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Receiver).await;
    let resp = esme.submit(&text("447700900123", b"hi")).await;
    assert_eq!(resp.status(), CommandStatus::EsmeRinvbndsts);
    assert_eq!(server.handler.calls(), 0);
}

#[tokio::test]
async fn a_connection_that_never_binds_is_closed_after_bind_timeout() {
    let mut config = config();
    config.bind_timeout = Duration::from_millis(150);
    let server = start(config, FakeHandler::new()).await;
    let started = Instant::now();
    let mut esme = server.esme().await;
    esme.expect_closed().await;
    assert!(started.elapsed() >= Duration::from_millis(140));

    // A bound session is not affected by the bind timeout (it would have closed by now).
    let mut bound = server.bound(BindKind::Transceiver).await;
    let mut other = server.esme().await;
    other.expect_closed().await;
    bound.enquire_link_works().await;
}
