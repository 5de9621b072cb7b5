//! Test-only module: compiled under `#[cfg(test)]` (see its `mod` declaration).
//!
//! A throughput probe, not a regression test (ignored by default):
//!
//! ```text
//! cargo test --release -p sendium-protocols throughput -- --ignored --nocapture
//! ```
//!
//! Several pipelining ESMEs (window 1000 each) against the server with a handler that
//! accepts at once; prints submits per second and the process CPU time per submit (client
//! and server together, from /proc/self/stat).

use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const CONNECTIONS: usize = 4;
const PER_CONNECTION: usize = 100_000;
const CLIENT_WINDOW: usize = 1000;

struct AcceptAll;

#[async_trait]
impl SubmitHandler for AcceptAll {
    async fn submit(&self, _account: &str, batch: Vec<InboundSubmit>) -> Vec<SubmitReply> {
        batch
            .iter()
            .enumerate()
            .map(|(i, _)| SubmitReply::Accepted(format!("0190a3b2-0c4d-7000-8000-{i:012}")))
            .collect()
    }

    fn bound(&self, _account: &str, _can_receive: bool) {}
}

/// utime + stime of this process, in clock ticks (usually 10 ms).
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

async fn load(addr: SocketAddr) {
    let mut esme = Esme::connect(addr).await;
    assert_eq!(
        esme.bind(BindKind::Transmitter, "esme1", "secret").await.status(),
        CommandStatus::EsmeRok
    );
    let Esme { rd, mut wr, .. } = esme;
    let mut rd = rd.into_inner();
    let credits = Arc::new(Semaphore::new(CLIENT_WINDOW));

    let mut template = BytesMut::new();
    frame::encode(
        &build::submit_sm(0, &text("447700900123", b"a typical 30-character message")).unwrap(),
        &mut template,
    );
    let writer_credits = credits.clone();
    let writer = tokio::spawn(async move {
        let mut buf = BytesMut::new();
        let mut sent = 0usize;
        while sent < PER_CONNECTION {
            let permit = writer_credits.acquire().await.unwrap();
            permit.forget();
            let mut n = 1 + writer_credits.available_permits().min(PER_CONNECTION - sent - 1);
            if n > 1 {
                let extra = writer_credits.try_acquire_many(u32::try_from(n - 1).unwrap()).unwrap();
                extra.forget();
            } else {
                n = 1;
            }
            for _ in 0..n {
                sent += 1;
                let start = buf.len();
                buf.extend_from_slice(&template);
                buf[start + 12..start + 16].copy_from_slice(&u32::try_from(sent).unwrap().to_be_bytes());
            }
            wr.write_all(&buf).await.unwrap();
            buf.clear();
        }
        wr
    });

    let mut buf = BytesMut::with_capacity(256 * 1024);
    let mut received = 0usize;
    while received < PER_CONNECTION {
        buf.reserve(64 * 1024);
        assert!(rd.read_buf(&mut buf).await.unwrap() > 0);
        let mut answered = 0;
        while let Some(header) = frame::peek_header(&buf) {
            let len = header.command_length as usize;
            if buf.len() < len {
                break;
            }
            assert_eq!(header.command_status, 0);
            let _ = buf.split_to(len);
            answered += 1;
        }
        received += answered;
        credits.add_permits(answered);
    }
    let _wr = writer.await.unwrap();
}

#[test]
#[ignore = "throughput probe; run in release with --ignored --nocapture"]
fn throughput() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            Arc::new(config()),
            Arc::new(AcceptAll),
            SessionRegistry::new(),
            shutdown.clone(),
        ));
        let ticks_before = cpu_ticks();
        let started = Instant::now();
        let clients: Vec<_> = (0..CONNECTIONS).map(|_| tokio::spawn(load(addr))).collect();
        for client in clients {
            client.await.unwrap();
        }
        let elapsed = started.elapsed();
        let total = CONNECTIONS * PER_CONNECTION;
        let rate = total as f64 / elapsed.as_secs_f64();
        let cpu = match (ticks_before, cpu_ticks()) {
            (Some(before), Some(after)) => {
                let seconds = (after - before) as f64 / 100.0;
                format!(
                    "{:.2} µs CPU per submit (client + server)",
                    seconds * 1e6 / total as f64
                )
            }
            _ => "CPU time unavailable".to_owned(),
        };
        println!("{total} submits in {elapsed:?}: {rate:.0}/s; {cpu}");
        shutdown.cancel();
        server.await.unwrap().unwrap();
    });
}
