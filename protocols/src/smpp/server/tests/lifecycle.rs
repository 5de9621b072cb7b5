//! Server tests (test-only: compiled under `#[cfg(test)]`).

use super::*;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn enquire_link_is_answered() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transmitter).await;
    for _ in 0..3 {
        esme.enquire_link_works().await;
    }
}

#[tokio::test]
async fn unbind_is_answered_then_the_connection_closes() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    assert_eq!(server.registry.receivers("esme1"), 1);
    let seq = esme.next_seq();
    esme.send(&build::unbind(seq)).await;
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.sequence_number(), resp.status()),
        (CommandId::UnbindResp, seq, CommandStatus::EsmeRok)
    );
    esme.expect_closed().await;
    assert_eq!(server.registry.receivers("esme1"), 0);
}

#[tokio::test]
async fn unbind_waits_for_submits_in_flight() {
    let (handler, gate) = FakeHandler::gated();
    let server = start(config(), handler).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let submit_seq = esme.next_seq();
    esme.send(&build::submit_sm(submit_seq, &text("1", b"a")).unwrap())
        .await;
    eventually("the handler to get the submit", || server.handler.calls() == 1).await;
    let unbind_seq = esme.next_seq();
    let late_seq = esme.next_seq();
    esme.send_all(&[
        build::unbind(unbind_seq),
        build::submit_sm(late_seq, &text("1", b"late")).unwrap(),
    ])
    .await;
    // A submit after unbind is refused at once; the one in flight is still answered,
    // before the unbind_resp.
    let late = esme.recv().await;
    assert_eq!(
        (late.sequence_number(), late.status()),
        (late_seq, CommandStatus::EsmeRinvbndsts)
    );
    gate.add_permits(1);
    let resp = esme.recv().await;
    assert_eq!(
        (resp.id(), resp.sequence_number(), resp.status()),
        (CommandId::SubmitSmResp, submit_seq, CommandStatus::EsmeRok)
    );
    let resp = esme.recv().await;
    assert_eq!((resp.id(), resp.sequence_number()), (CommandId::UnbindResp, unbind_seq));
    esme.expect_closed().await;
    assert_eq!(server.handler.submits().len(), 1);
}

#[tokio::test]
async fn unbind_before_bind_is_answered_and_closed() {
    let server = start(config(), FakeHandler::new()).await;
    let mut esme = server.esme().await;
    esme.send(&build::unbind(1)).await;
    let resp = esme.recv().await;
    assert_eq!(resp.id(), CommandId::UnbindResp);
    esme.expect_closed().await;
}

#[tokio::test]
async fn idle_session_is_probed_then_closed() {
    let mut config = config();
    config.idle_timeout = Duration::from_millis(150);
    let server = start(config, FakeHandler::new()).await;
    // Before the bind: the server's idle clock starts when it reads the bind, later.
    let started = Instant::now();
    let mut esme = server.bound(BindKind::Transceiver).await;
    let probe = esme.recv().await;
    assert_eq!(probe.id(), CommandId::EnquireLink);
    assert!(started.elapsed() >= Duration::from_millis(150));
    // Not answered: closed after another idle_timeout.
    esme.expect_closed().await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    eventually("the session to leave the registry", || {
        server.registry.sessions().is_empty()
    })
    .await;
}

#[tokio::test]
async fn answered_probes_keep_the_session_open() {
    let mut config = config();
    config.idle_timeout = Duration::from_millis(100);
    let server = start(config, FakeHandler::new()).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    for _ in 0..3 {
        let probe = esme.recv().await;
        assert_eq!(probe.id(), CommandId::EnquireLink);
        esme.send(&build::enquire_link_resp(probe.sequence_number())).await;
    }
    esme.enquire_link_works().await;
    assert_eq!(server.registry.sessions().len(), 1);
}

#[tokio::test]
async fn binds_beyond_max_connections_are_refused_and_a_freed_slot_is_used_again() {
    let mut config = config();
    config.max_connections = 2;
    let server = start(config, FakeHandler::new()).await;
    let first = server.bound(BindKind::Transmitter).await;
    let _second = server.bound(BindKind::Transmitter).await;

    // A third connection is accepted (unbound connections have a budget of their own)
    // but cannot bind.
    let creds = BindCredentials {
        system_id: "esme1",
        password: "secret",
        system_type: "",
    };
    let mut third = server.esme().await;
    let seq = third.next_seq();
    third
        .send(&build::bind(BindKind::Transmitter, seq, &creds).unwrap())
        .await;
    let resp = third.recv_or_closed().await.expect("a bind_resp");
    assert_eq!(resp.status(), CommandStatus::EsmeRbindfail);
    third.expect_closed().await;

    // A freed slot is usable again.
    drop(first);
    let deadline = Instant::now() + WAIT;
    loop {
        let mut esme = server.esme().await;
        let seq = esme.next_seq();
        esme.send(&build::bind(BindKind::Transmitter, seq, &creds).unwrap())
            .await;
        if let Some(resp) = esme.recv_or_closed().await
            && resp.status() == CommandStatus::EsmeRok
        {
            break;
        }
        assert!(Instant::now() < deadline, "the connection slot was never freed");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn unbound_connections_have_their_own_budget_and_the_oldest_makes_room() {
    let mut config = config();
    config.max_unbound = 4;
    config.max_unbound_per_address = 3;
    let server = start(config, FakeHandler::new()).await;
    // Idle connections from other loopback addresses.
    let from = |last: u8| {
        let addr = server.addr;
        async move {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(std::net::SocketAddr::from(([127, 0, 0, last], 0))).unwrap();
            socket.connect(addr).await.unwrap()
        }
    };
    let mut oldest = from(2).await;
    let mut idle = vec![from(2).await, from(2).await, from(3).await];
    // Its address's share is taken: a fourth from 127.0.0.2 is closed at once.
    let mut fourth = from(2).await;
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(WAIT, fourth.read(&mut buf)).await.unwrap();
    assert!(matches!(closed, Ok(0) | Err(_)), "closed: {closed:?}");
    // The budget is full; an ESME from 127.0.0.1 still binds: the oldest idle
    // connection makes room.
    let _bound = server.bound(BindKind::Transceiver).await;
    let closed = tokio::time::timeout(WAIT, oldest.read(&mut buf)).await.unwrap();
    assert!(matches!(closed, Ok(0) | Err(_)), "the oldest was closed: {closed:?}");
    // The others stay open (nothing to read, not closed).
    for c in &mut idle {
        assert!(
            tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf))
                .await
                .is_err()
        );
    }
}

#[tokio::test]
async fn shutdown_unbinds_every_session_and_serve_returns() {
    let server = start(config(), FakeHandler::new()).await;
    let mut a = server.bound(BindKind::Transceiver).await;
    let mut b = server.bound(BindKind::Transmitter).await;
    let mut unbound = server.esme().await;
    unbound.enquire_link_works().await;

    server.shutdown.cancel();
    for esme in [&mut a, &mut b] {
        let unbind = esme.recv().await;
        assert_eq!(unbind.id(), CommandId::Unbind);
        esme.send(&build::unbind_resp(unbind.sequence_number())).await;
        esme.expect_closed().await;
    }
    unbound.expect_closed().await;
    let result = tokio::time::timeout(WAIT, server.task).await.unwrap().unwrap();
    assert!(result.is_ok());
    assert!(server.registry.sessions().is_empty());
    // The listener is gone.
    assert!(TcpStream::connect(server.addr).await.is_err());
}

#[tokio::test]
async fn shutdown_answers_submits_in_flight_before_unbinding() {
    let (handler, gate) = FakeHandler::gated();
    let server = start(config(), handler).await;
    let mut esme = server.bound(BindKind::Transceiver).await;
    let seq = esme.next_seq();
    esme.send(&build::submit_sm(seq, &text("1", b"a")).unwrap()).await;
    eventually("the handler to get the submit", || server.handler.calls() == 1).await;
    server.shutdown.cancel();
    gate.add_permits(1);
    let resp = esme.recv().await;
    assert_eq!((resp.id(), resp.sequence_number()), (CommandId::SubmitSmResp, seq));
    let unbind = esme.recv().await;
    assert_eq!(unbind.id(), CommandId::Unbind);
    esme.send(&build::unbind_resp(unbind.sequence_number())).await;
    esme.expect_closed().await;
    tokio::time::timeout(WAIT, server.task).await.unwrap().unwrap().unwrap();
}
