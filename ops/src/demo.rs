//! `sendium demo`: the quickstart gateway, with one SMS sent through it over SMPP (and
//! one over HTTP) so a newcomer sees the whole path: submit, acknowledgement, the
//! simulated destination, and the delivery receipt coming back.

use std::sync::Arc;
use std::time::Duration;

use sendium_profiles::Config;
use sendium_protocols::receipt::ReceiptText;
use sendium_protocols::smpp::SmppAddress;
use sendium_protocols::smpp::client::{BindMode, ClientConfig, ClientEvent, ClientEvents, OutboundSubmit, SmppClient};
use sendium_protocols::text::{self, Alphabet};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Serve(#[from] crate::serve::ServeError),
    #[error("the demo configuration has no {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Step(String),
}

struct Events(mpsc::UnboundedSender<ClientEvent>);

impl ClientEvents for Events {
    fn on_events(&self, events: Vec<ClientEvent>) {
        for e in events {
            let _ = self.0.send(e);
        }
    }
}

const STEP_TIMEOUT: Duration = Duration::from_secs(15);

async fn next_event<T>(
    rx: &mut mpsc::UnboundedReceiver<ClientEvent>,
    what: &str,
    mut pick: impl FnMut(ClientEvent) -> Option<T>,
) -> Result<T, DemoError> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(e)) => {
                if let Some(t) = pick(e) {
                    return Ok(t);
                }
            }
            _ => return Err(DemoError::Step(format!("timed out waiting for {what}"))),
        }
    }
}

async fn smpp_round_trip(cfg: &Config, port: u16) -> Result<(), DemoError> {
    let account = cfg
        .smpp
        .as_ref()
        .and_then(|s| s.accounts.first())
        .ok_or(DemoError::Missing("[[smpp.accounts]]"))?;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let client = SmppClient::start(
        ClientConfig {
            name: "demo-esme".into(),
            host: "127.0.0.1".into(),
            port,
            system_id: account.system_id.clone(),
            password: account.password.expose().to_string(),
            system_type: String::new(),
            bind: BindMode::Transceiver,
            window: 10,
            max_tps: 0,
            enquire_link_interval: Duration::from_secs(30),
            response_timeout: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(2),
            max_command_length: 65_536,
            tls: None,
        },
        Arc::new(Events(tx)),
    );
    next_event(&mut rx, "the SMPP bind", |e| matches!(e, ClientEvent::Up).then_some(())).await?;
    println!(
        "demo: bound to the gateway over SMPP as {:?} (transceiver)",
        account.system_id
    );
    let body = "Hello from the Sendium demo";
    let short_message =
        text::encode(Alphabet::Gsm7, body).map_err(|e| DemoError::Step(format!("encoding the demo text: {e}")))?;
    client.submit(vec![(
        1,
        OutboundSubmit {
            service_type: String::new(),
            source: SmppAddress::new(5, 0, "Sendium"),
            destination: SmppAddress::new(1, 1, "447700900123"),
            esm_class: 0x00,
            protocol_id: 0,
            priority_flag: 0,
            registered_delivery: 0x01,
            data_coding: 0x00,
            short_message,
            schedule_delivery_time: None,
        },
    )]);
    let id = next_event(&mut rx, "submit_sm_resp", |e| match e {
        ClientEvent::SubmitResult { token: 1, result } => Some(result),
        _ => None,
    })
    .await?
    .map_err(|f| DemoError::Step(format!("the gateway refused the demo SMS: {f:?}")))?;
    println!("demo: submit_sm to 447700900123 acknowledged, message id {id}");
    let (receipt, ack) = next_event(&mut rx, "the delivery receipt", |e| match e {
        ClientEvent::Deliver { pdu, ack } => Some((pdu, ack)),
        _ => None,
    })
    .await?;
    client.ack(vec![(ack, 0)]);
    let text = String::from_utf8_lossy(&receipt.short_message).to_string();
    match ReceiptText::parse(&text) {
        Ok(r) => println!(
            "demo: delivery receipt for {} — stat:{} err:{}",
            r.id,
            r.stat.stat_text(),
            r.err
        ),
        Err(_) => println!("demo: deliver_sm received: {text}"),
    }
    println!("demo: receipt text: {text}");
    client.stop();
    Ok(())
}

/// POST one message to the HTTP ingress with a callback to a listener of our own, and
/// wait for its receipt.
async fn http_round_trip(cfg: &Config, http: std::net::SocketAddr) -> Result<(), DemoError> {
    let key = cfg
        .http
        .as_ref()
        .and_then(|h| h.api_keys.first())
        .ok_or(DemoError::Missing("[[http.api-keys]]"))?;
    let (tx, mut rx) = mpsc::unbounded_channel::<serde_json::Value>();
    let app = axum::Router::new().route(
        "/receipt",
        axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(body);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| DemoError::Step(format!("cannot open the demo callback listener: {e}")))?;
    let callback = listener
        .local_addr()
        .map_err(|e| DemoError::Step(format!("callback listener address: {e}")))?;
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let body = serde_json::json!({
        "from": "Sendium",
        "to": "447700900124",
        "text": "Hello over HTTP from the Sendium demo",
        "callback_url": format!("http://{callback}/receipt"),
    });
    let resp = reqwest::Client::new()
        .post(format!("http://{http}/v1/messages"))
        .bearer_auth(key.key.expose())
        .json(&body)
        .send()
        .await
        .map_err(|e| DemoError::Step(format!("POST /v1/messages: {e}")))?;
    let status = resp.status();
    let answer: serde_json::Value = resp.json().await.unwrap_or_default();
    if status != reqwest::StatusCode::ACCEPTED {
        return Err(DemoError::Step(format!(
            "POST /v1/messages answered {status}: {answer}"
        )));
    }
    println!("demo: POST /v1/messages answered {status} with id {}", answer["id"]);
    let receipt = tokio::time::timeout(STEP_TIMEOUT, rx.recv())
        .await
        .ok()
        .flatten()
        .ok_or_else(|| DemoError::Step("timed out waiting for the HTTP receipt callback".into()))?;
    println!("demo: receipt callback received: {receipt}");
    server.abort();
    Ok(())
}

pub async fn run(cfg: Config) -> Result<(), DemoError> {
    let running = crate::serve::start(&cfg).await?;
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    while running.gateway.readiness().is_err() {
        if tokio::time::Instant::now() > deadline {
            return Err(DemoError::Step("the gateway did not become ready".into()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let port = running
        .gateway
        .smpp_addr()
        .map(|a| a.port())
        .ok_or(DemoError::Missing("[smpp] section"))?;
    smpp_round_trip(&cfg, port).await?;
    if let Some(http) = running.gateway.http_addr() {
        http_round_trip(&cfg, http).await?;
    }
    println!(
        "\nThe gateway keeps running (Ctrl-C stops it). Try:\n  \
         curl -s http://{}/readyz\n  \
         curl -s http://{}/admin/actors\n  \
         curl -s http://{}/metrics | grep sendium_",
        running.admin_addr, running.admin_addr, running.admin_addr
    );
    crate::serve::wait_for_signal().await;
    running.gateway.shutdown().await;
    Ok(())
}
