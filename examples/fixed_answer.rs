//! The floor under a refusal on this stack: a tokio server (one thread, as the benches run the
//! gateway) that reads HTTP/1.1 request heads as the gateway's own path does and answers every
//! one with the same fixed 429 the gateway sends for one limit, deciding nothing. What it costs
//! per request is what any refusal served over tokio and epoll costs before a single rule runs;
//! bench/flood.sh runs it beside nginx and tollgate.
//!
//! Usage: cargo run --release --example fixed_answer -- 127.0.0.1:3000

use std::net::SocketAddr;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const REFUSAL: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\n\
content-type: application/json\r\n\
retry-after: 3600\r\n\
ratelimit-limit: 1\r\n\
ratelimit-remaining: 0\r\n\
ratelimit-reset: 3600\r\n\
x-request-id: 01a250ad-3673-7272-bfba-dc1f05644543\r\n\
date: Mon, 07 Dec 2026 13:24:18 GMT\r\n";
const BODY: &[u8] =
    b"content-length: 48\r\n\r\n{\"error\":\"too_many_requests\",\"retry_after\":3600}";
const CLOSING: &[u8] = b"connection: close\r\n";

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let address: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned())
        .parse()
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?;
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As the gateway does: set on the listener, inherited by each accepted socket.
    socket.set_reuseaddr(true)?;
    socket.set_nodelay(true)?;
    socket.bind(address)?;
    let listener = socket.listen(1024)?;
    eprintln!("fixed answer on http://{}", listener.local_addr()?);
    loop {
        let (stream, _) = listener.accept().await?;
        tokio::spawn(answer(stream));
    }
}

/// Answers each complete request head in the buffer, every answer of one read in one write,
/// until the client closes or asks to.
async fn answer(mut stream: TcpStream) {
    let mut buffer = BytesMut::with_capacity(4096);
    let mut out = Vec::with_capacity(1024);
    loop {
        match stream.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut close = false;
        loop {
            let (length, closing) = match request_head(&buffer) {
                Head::Complete { length, closing } => (length, closing),
                Head::Partial if buffer.len() < MAX_HEAD => break,
                Head::Partial | Head::Invalid => return,
            };
            buffer.advance(length);
            out.extend_from_slice(REFUSAL);
            if closing {
                out.extend_from_slice(CLOSING);
            }
            out.extend_from_slice(BODY);
            if closing {
                close = true;
                break;
            }
        }
        if stream.write_all(&out).await.is_err() || close {
            return;
        }
        out.clear();
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(4096);
        }
    }
}

/// A longer head, or one that does not parse, closes the connection unanswered.
const MAX_HEAD: usize = 16 * 1024;

enum Head {
    Complete { length: usize, closing: bool },
    Partial,
    Invalid,
}

/// The request head at the start of `bytes`: its length and whether it asks to close.
fn request_head(bytes: &[u8]) -> Head {
    let mut fields = [httparse::EMPTY_HEADER; 32];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(bytes) {
        Ok(httparse::Status::Complete(length)) => {
            let closing = request.headers.iter().any(|field| {
                field.name.eq_ignore_ascii_case("connection")
                    && field.value.eq_ignore_ascii_case(b"close")
            });
            Head::Complete { length, closing }
        }
        Ok(httparse::Status::Partial) => Head::Partial,
        Err(_) => Head::Invalid,
    }
}
