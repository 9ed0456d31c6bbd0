//! Shared by the load examples: a process's resident memory, and one keep-alive request.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The resident memory of process `pid`, in MiB (0 if it cannot be read).
#[allow(dead_code)] // not every load example samples memory
pub(crate) fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Sends `head` (a bodyless request) on `stream` and reads the response, its body by its
/// length; returns its status, or `None` if the connection failed.
pub(crate) async fn request(
    stream: &mut TcpStream,
    head: &[u8],
    buffer: &mut Vec<u8>,
) -> Option<u16> {
    stream.write_all(head).await.ok()?;
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let count = stream.read(&mut chunk).await.ok()?;
        if count == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..count]);
        let Some(end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or(0);
        if buffer.len() >= end + 4 + length {
            return head.get(9..12).and_then(|status| status.parse().ok());
        }
    }
}
