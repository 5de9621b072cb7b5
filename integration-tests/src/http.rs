//! A minimal HTTP/1.1 client (and the message reader the callback server shares).
//!
//! Enough for the admin API, `POST /v1/messages` and the callback server: one request per
//! connection (`Connection: close`), `Content-Length` or chunked bodies, 127.0.0.1 only.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Default time limit for one request.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

const MAX_HEAD: usize = 64 * 1024;

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// One parsed HTTP message (request or response).
#[derive(Debug, Clone)]
pub(crate) struct Message {
    pub start_line: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn bad(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_owned())
}

async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    let mut chunk = [0u8; 16 * 1024];
    let n = r.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

async fn read_line<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<String> {
    loop {
        if let Some(at) = find(buf, b"\r\n") {
            let line = String::from_utf8_lossy(&buf[..at]).into_owned();
            buf.drain(..at + 2);
            return Ok(line);
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("line too long"));
        }
        if fill(r, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
}

async fn read_exact_into<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>, n: usize) -> io::Result<Vec<u8>> {
    while buf.len() < n {
        if fill(r, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(buf.drain(..n).collect())
}

/// Reads one message from `r`; `buf` keeps bytes read past it (keep-alive). `Ok(None)`:
/// the peer closed before sending anything. Without a length, a response body runs to
/// EOF and a request has none.
pub(crate) async fn read_message<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    is_response: bool,
) -> io::Result<Option<Message>> {
    let head_end = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_HEAD {
            return Err(bad("header section too long"));
        }
        if fill(r, buf).await? == 0 {
            if buf.is_empty() {
                return Ok(None);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    let start_line = lines.next().unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = header(&headers, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let length = header(&headers, "content-length").and_then(|v| v.parse::<usize>().ok());
    let no_body = is_response
        && start_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .is_some_and(|s| s == 204 || s == 304 || (100..200).contains(&s));
    let body = if no_body {
        Vec::new()
    } else if chunked {
        let mut body = Vec::new();
        loop {
            let line = read_line(r, buf).await?;
            let size_text = line.split(';').next().unwrap_or("").trim();
            let size = usize::from_str_radix(size_text, 16).map_err(|_| bad("bad chunk size"))?;
            if size == 0 {
                // Trailers, then the empty line.
                while !read_line(r, buf).await?.is_empty() {}
                break;
            }
            body.extend(read_exact_into(r, buf, size).await?);
            read_exact_into(r, buf, 2).await?;
        }
        body
    } else if let Some(length) = length {
        read_exact_into(r, buf, length).await?
    } else if is_response {
        while fill(r, buf).await? > 0 {}
        std::mem::take(buf)
    } else {
        Vec::new()
    };
    Ok(Some(Message {
        start_line,
        headers,
        body,
    }))
}

/// Sends one request and reads the response, within [`DEFAULT_TIMEOUT`].
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<HttpResponse> {
    request_with_timeout(addr, method, path, headers, body, DEFAULT_TIMEOUT).await
}

pub async fn request_with_timeout(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
    timeout: Duration,
) -> io::Result<HttpResponse> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        exchange(&mut stream, addr, method, path, headers, body).await
    };
    within(timeout, method, path, exchange).await
}

async fn within(
    timeout: Duration,
    method: &str,
    path: &str,
    exchange: impl std::future::Future<Output = io::Result<HttpResponse>>,
) -> io::Result<HttpResponse> {
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("{method} {path} timed out")))?
}

/// [`request`] over HTTPS, trusting what `tls` trusts.
pub async fn request_tls(
    addr: SocketAddr,
    tls: &crate::tls::TlsClient,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<HttpResponse> {
    let exchange = async {
        let mut stream = tls.connect(addr).await?;
        exchange(&mut stream, addr, method, path, headers, body).await
    };
    within(DEFAULT_TIMEOUT, method, path, exchange).await
}

/// Writes one request on `stream` and reads its response.
async fn exchange<S: AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> io::Result<HttpResponse> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    stream.write_all(&bytes).await?;
    stream.flush().await?;
    let mut buf = Vec::new();
    let message = read_message(stream, &mut buf, true)
        .await?
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    let status = message
        .start_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad("bad status line"))?;
    Ok(HttpResponse {
        status,
        headers: message.headers,
        body: message.body,
    })
}

pub async fn get(addr: SocketAddr, path: &str) -> io::Result<HttpResponse> {
    request(addr, "GET", path, &[], None).await
}

/// POST with `Content-Type: application/json`.
pub async fn post_json(addr: SocketAddr, path: &str, headers: &[(&str, &str)], json: &str) -> io::Result<HttpResponse> {
    let mut all: Vec<(&str, &str)> = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request(addr, "POST", path, &all, Some(json.as_bytes())).await
}
