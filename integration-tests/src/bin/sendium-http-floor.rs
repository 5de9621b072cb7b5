//! `sendium-http-floor`: what the HTTP stack alone costs per message, without the gateway.
//!
//! ```text
//! sendium-http-floor [--messages 200000] [--clients 50] [--rounds 3]
//! ```
//!
//! A server process (this binary, `serve`) takes `POST /v1/messages` the way the gateway's
//! HTTP ingress does — Sendium's listener (`sendium_protocols::http_listener`) and an axum
//! route, a bearer key, the JSON body parsed, `202` with a JSON id — and stops there: no
//! admission, no routing, no SMPP, no storage. When the body names a `callback_url` it POSTs
//! a receipt-sized JSON body there 20 ms later through the gateway's HTTP client
//! (`sendium_protocols::http_client`, at most 64 at once, as the receipt correlator sends
//! them). The load is the one `sendium-bench --http` drives the gateway with
//! (`sendium_integration_tests::http_load`): keep-alive clients, one message per request,
//! and a keep-alive sink answering callbacks `200`.
//!
//! Each row reports the server's utime and stime per message: the part of the HTTP rows of
//! `sendium-bench --http` that the HTTP exchanges themselves cost on this machine (the
//! kernel's loopback TCP work included), which no change to the pipeline or the storage
//! can take away.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header::AUTHORIZATION};
use axum::routing::post;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sendium_integration_tests::http_load::{Load, Sink, client, connect};
use sendium_protocols::http_client::{AnyAddress, Config, HttpClient, Request, Target};
use sendium_protocols::http_listener::{self, ListenerLimits};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The gateway's allocator: the server side is the gateway's HTTP stack.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

const USAGE: &str = "usage: sendium-http-floor [--messages N] [--clients N] [--rounds N]";
/// The bearer key the load sends and the server checks.
const KEY: &str = "floor-key";
/// The test SMSC's receipt delay in `sendium-bench --http`.
const CALLBACK_DELAY: Duration = Duration::from_millis(20);
/// Callbacks in flight at once (the receipt correlator's idle connections per host).
const CALLBACKS_IN_FLIGHT: usize = 64;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        serve();
        return;
    }
    let (mut messages, mut clients, mut rounds) = (200_000u64, 50u64, 3u64);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let target = match flag.as_str() {
            "--messages" => &mut messages,
            "--clients" => &mut clients,
            "--rounds" => &mut rounds,
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => fail(&format!("unknown argument {other}")),
        };
        *target = it
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| fail(&format!("{flag} needs a number")));
    }
    if messages == 0 || clients == 0 || rounds == 0 {
        fail("--messages, --clients and --rounds must be at least 1");
    }
    bench(messages, clients as usize, rounds as usize);
}

fn fail(why: &str) -> ! {
    eprintln!("sendium-http-floor: {why}\n{USAGE}");
    std::process::exit(2);
}

// ---------------------------------------------------------------------------------------
// the server

/// The fields the gateway's submission carries in the load's requests, parsed as it
/// parses them (only the callback URL is used here).
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Submission {
    from: String,
    to: String,
    text: String,
    callback_url: Option<String>,
}

#[derive(serde::Serialize)]
struct Accepted {
    id: String,
    parts: u32,
}

#[derive(Clone)]
struct Server {
    callbacks: mpsc::UnboundedSender<(String, String)>,
    next_id: Arc<AtomicU64>,
}

fn serve() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(send_callbacks(rx));
        let app = Router::new().route("/v1/messages", post(submit)).with_state(Server {
            callbacks: tx,
            next_id: Arc::new(AtomicU64::new(1)),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("port {}", listener.local_addr().unwrap().port());
        let limits = ListenerLimits {
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
        };
        http_listener::serve(listener, app, limits, tokio_util::sync::CancellationToken::new()).await;
    });
}

async fn submit(
    State(server): State<Server>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, axum::Json<Accepted>), StatusCode> {
    let key = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    if key != Some(KEY.as_bytes()) {
        return Err(StatusCode::UNAUTHORIZED);
    }
    let submission: Submission = serde_json::from_slice(&body).map_err(|_| StatusCode::BAD_REQUEST)?;
    let n = server.next_id.fetch_add(1, Ordering::Relaxed);
    // As long as the gateway's ids (UUIDs).
    let id = format!("00000000-0000-7000-8000-{n:012x}");
    if let Some(url) = submission.callback_url {
        let _ = server.callbacks.send((url, id.clone()));
    }
    Ok((StatusCode::ACCEPTED, axum::Json(Accepted { id, parts: 1 })))
}

#[derive(serde::Serialize)]
struct CallbackBody<'a> {
    id: &'a str,
    status: &'a str,
    error_code: &'a str,
    done_at: &'a str,
}

async fn send_one(client: HttpClient, target: Target, id: String) {
    let body = CallbackBody {
        id: &id,
        status: "DELIVRD",
        error_code: "000",
        done_at: "2026-12-06T00:00:00Z",
    };
    let body = Bytes::from(serde_json::to_vec(&body).unwrap());
    if let Err(e) = client.send(&Request::new(http::Method::POST, &target, body)).await {
        eprintln!("callback failed: {e}");
    }
}

/// Sends each callback [`CALLBACK_DELAY`] after its message was accepted, at most
/// [`CALLBACKS_IN_FLIGHT`] at once.
async fn send_callbacks(mut rx: mpsc::UnboundedReceiver<(String, String)>) {
    let config = Config {
        max_idle_per_origin: CALLBACKS_IN_FLIGHT,
        ..Config::default()
    };
    let client = HttpClient::new(config, Arc::new(AnyAddress)).unwrap();
    let mut target: Option<(String, Target)> = None;
    let mut waiting: VecDeque<(Instant, String)> = VecDeque::new();
    let mut sending = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    loop {
        tokio::select! {
            received = rx.recv() => {
                let Some((url, id)) = received else { return };
                if target.as_ref().is_none_or(|(u, _)| *u != url) {
                    target = Some((url.clone(), Target::parse(&url).unwrap()));
                }
                waiting.push_back((Instant::now() + CALLBACK_DELAY, id));
                continue;
            }
            _ = tick.tick() => {}
            Some(()) = sending.next(), if !sending.is_empty() => {}
        }
        let now = Instant::now();
        let room = CALLBACKS_IN_FLIGHT.saturating_sub(sending.len());
        let due = waiting.iter().take(room).take_while(|(at, _)| *at <= now).count();
        if let Some((_, t)) = &target {
            for (_, id) in waiting.drain(..due) {
                sending.push(send_one(client.clone(), t.clone(), id));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// the load

/// utime and stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    (fields[11].parse().unwrap(), fields[12].parse().unwrap())
}

struct Row {
    callback: bool,
    per_s: f64,
    user_us: f64,
    sys_us: f64,
}

/// The server process, killed when dropped (also when a row panics).
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server() -> (ServerProcess, u16) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe).arg("serve").stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port = line.trim().strip_prefix("port ").and_then(|p| p.parse().ok()).unwrap();
    (ServerProcess(child), port)
}

fn row(runtime: &tokio::runtime::Runtime, messages: u64, clients: usize, callback: bool, ticks: f64) -> Row {
    let (server, port) = start_server();
    let pid = server.0.id();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let row = runtime.block_on(async {
        let sink = match callback {
            true => Some(Sink::start().await.unwrap()),
            false => None,
        };
        let prefix = if callback { "4474" } else { "4475" };
        let load = Arc::new(Load::new(
            addr,
            messages,
            KEY,
            prefix,
            sink.as_ref().map(Sink::url).as_deref(),
        ));
        // Connections are open before the window starts: it measures messages.
        let mut streams = Vec::with_capacity(clients);
        for _ in 0..clients {
            streams.push(connect(addr).await.unwrap());
        }
        let before = cpu_ticks(pid);
        let started = Instant::now();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|s| tokio::spawn(client(load.clone(), s)))
            .collect();
        for task in tasks {
            let report = task.await.unwrap();
            assert_eq!(report.gave_up, None, "a client gave up");
            assert!(report.refused.is_empty(), "refused: {:?}", report.first_refusal);
        }
        assert_eq!(load.accepted.load(Ordering::Relaxed), messages);
        if let Some(sink) = &sink {
            while sink.distinct() < messages {
                assert!(started.elapsed() < Duration::from_secs(600), "callbacks missing");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        let elapsed = started.elapsed().as_secs_f64();
        let after = cpu_ticks(pid);
        let per_message = |b: u64, a: u64| (a - b) as f64 / ticks * 1e6 / messages as f64;
        Row {
            callback,
            per_s: messages as f64 / elapsed,
            user_us: per_message(before.0, after.0),
            sys_us: per_message(before.1, after.1),
        }
    });
    drop(server);
    row
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn bench(messages: u64, clients: usize, rounds: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ticks = sendium_integration_tests::util::clock_ticks_per_second() as f64;
    println!("{messages} messages per row, {clients} keep-alive clients; server CPU per message (utime + stime)");
    let mut rows = Vec::new();
    for round in 0..rounds {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for callback in order {
            let r = row(&runtime, messages, clients, callback, ticks);
            println!(
                "{:<21} {:>7.0} msgs/s  {:>5.1} µs/msg ({:.1} user + {:.1} system)",
                name(r.callback),
                r.per_s,
                r.user_us + r.sys_us,
                r.user_us,
                r.sys_us
            );
            rows.push(r);
        }
    }
    if rounds > 1 {
        for callback in [false, true] {
            let of: Vec<&Row> = rows.iter().filter(|r| r.callback == callback).collect();
            let total: Vec<f64> = of.iter().map(|r| r.user_us + r.sys_us).collect();
            let (lo, hi) = total
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &t| (l.min(t), h.max(t)));
            println!(
                "{:<21} median {:.1} µs/msg ({lo:.1}–{hi:.1}), system {:.0}%",
                name(callback),
                median(total.clone()),
                100.0 * median(of.iter().map(|r| r.sys_us / (r.user_us + r.sys_us)).collect())
            );
        }
    }
}

fn name(callback: bool) -> &'static str {
    if callback { "POST + callback_url" } else { "POST" }
}
