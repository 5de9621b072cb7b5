//! The callback server with the kit's HTTP client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sendium_integration_tests::callback::CallbackServer;
use sendium_integration_tests::http;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn records_callbacks_and_fails_on_demand() {
    let server = CallbackServer::start().await;
    assert!(server.url("/dlr").starts_with("http://127.0.0.1:"));
    let body = r#"{"id":"0190c3e2-0000-7000-8000-000000000001","status":"DELIVRD","error_code":"000","done_at":"2024-01-01T12:01:00Z"}"#;
    let resp = http::post_json(server.addr(), "/dlr", &[], body).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.json(), serde_json::json!({}));

    server.fail_next(2);
    for _ in 0..2 {
        assert_eq!(
            http::post_json(server.addr(), "/dlr", &[], body).await.unwrap().status,
            500
        );
    }
    assert_eq!(
        http::post_json(server.addr(), "/dlr", &[], body).await.unwrap().status,
        200
    );

    server.fail_for(Duration::from_millis(200));
    assert_eq!(
        http::post_json(server.addr(), "/dlr", &[], body).await.unwrap().status,
        500
    );
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        http::post_json(server.addr(), "/dlr", &[], body).await.unwrap().status,
        200
    );

    server.set_status(Some(503));
    assert_eq!(http::get(server.addr(), "/x").await.unwrap().status, 503);
    server.heal();

    assert!(server.wait_requests(7, WAIT).await);
    assert!(server.wait_accepted(3, WAIT).await);
    let requests = server.requests();
    let answered: Vec<u16> = requests.iter().map(|r| r.answered).collect();
    assert_eq!(answered, [200, 500, 500, 200, 500, 200, 503]);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/dlr");
    assert_eq!(
        requests[0]
            .headers
            .iter()
            .find(|(n, _)| n == "content-type")
            .map(|(_, v)| v.as_str()),
        Some("application/json")
    );
    let receipts = server.receipts();
    assert_eq!(receipts.len(), 3);
    assert_eq!(receipts[0].status, "DELIVRD");
    assert_eq!(receipts[0].error_code, serde_json::json!("000"));
    assert_eq!(receipts[0].id, "0190c3e2-0000-7000-8000-000000000001");
}

#[tokio::test]
async fn keep_alive_and_chunked_requests() {
    let server = CallbackServer::start().await;
    let mut stream = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    let two = "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}\
               POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
    stream.write_all(two.as_bytes()).await.unwrap();
    assert!(server.wait_requests(2, WAIT).await);
    let requests = server.requests();
    assert_eq!(requests[1].path, "/b");
    assert_eq!(requests[1].json, Some(serde_json::json!({"a": 1})));
    let mut buf = vec![0u8; 4096];
    let mut got = Vec::new();
    while got.windows(8).filter(|w| w == b"HTTP/1.1").count() < 2 {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(server.connections(), 1);
}

#[tokio::test]
async fn http_client_reads_chunked_and_close_delimited_responses() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for reply in [
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
            "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\r\n{\"ready\":false}",
        ] {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(reply.as_bytes()).await.unwrap();
        }
    });
    let resp = http::get(addr, "/metrics").await.unwrap();
    assert_eq!((resp.status, resp.text().as_str()), (200, "hello world"));
    let resp = http::get(addr, "/readyz").await.unwrap();
    assert_eq!(resp.status, 503);
    assert_eq!(resp.json()["ready"], serde_json::json!(false));
}
