//! A legitimate client at a fixed pace: `RATE` requests a second for `SECONDS`, each under a
//! key of its own (`X-User-Id: legit-N`), over a few keep-alive connections. Each request's
//! latency counts from the moment it was queued, not from when a busy connection got to it,
//! so a stalled proxy shows in the figures instead of slowing the pace. Prints one line: requests,
//! errors (any answer but 200, or a failed connection), p50, p99 and the worst, in µs.
//! Bounded in time and requests; loopback only. Run by `bench/flood.sh`.
//!
//! Usage: paced_client ADDRESS RATE SECONDS
#![allow(clippy::disallowed_methods)] // a load generator measures real time

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex};

#[path = "support/load.rs"]
mod load;
use load::request;

/// Connections the paced requests are spread over (a request waits only if all are busy).
const CONNECTIONS: usize = 8;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: paced_client ADDRESS RATE SECONDS";
    let [_, address, rate, seconds] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let address: SocketAddr = address.parse().expect(usage);
    let rate: u64 = rate.parse().expect(usage);
    let seconds: u64 = seconds.parse().expect(usage);
    assert!(
        (1..=10_000).contains(&rate) && (1..=600).contains(&seconds),
        "{usage}: RATE 1..10000, SECONDS 1..600"
    );
    let total = rate * seconds;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);

    // Requests wait in one queue, each with the moment it was due; idle connections take
    // turns at it (tokio's channel has one receiver: shared behind a lock, it serves many).
    let (queue, receiver) = mpsc::channel::<(u64, Instant)>(total as usize);
    let receiver = Arc::new(Mutex::new(receiver));
    let mut workers = Vec::new();
    for _ in 0..CONNECTIONS {
        let receiver = receiver.clone();
        workers.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await.ok();
            let mut buffer = Vec::with_capacity(4096);
            let mut results = Vec::new();
            loop {
                let next = receiver.lock().await.recv().await;
                let Some((index, due)) = next else { break };
                let head = format!(
                    "GET /legit HTTP/1.1\r\nHost: bench\r\nX-User-Id: legit-{index}\r\n\r\n"
                );
                if stream.is_none() {
                    stream = TcpStream::connect(address).await.ok();
                }
                let status = match stream.as_mut() {
                    Some(stream) => request(stream, head.as_bytes(), &mut buffer).await,
                    None => None,
                };
                if status.is_none() {
                    stream = None;
                }
                let latency = Instant::now().duration_since(due);
                results.push((status == Some(200), latency));
            }
            results
        }));
    }
    drop(receiver);
    let started = Instant::now();
    for index in 0..total {
        tokio::time::sleep_until((started + interval * index as u32).into()).await;
        // From when it was sent on its way: the timer's own lateness (up to a millisecond in
        // tokio) is not the proxy's.
        let due = Instant::now();
        if queue.send((index, due)).await.is_err() {
            break;
        }
    }
    drop(queue);
    let mut latencies = Vec::with_capacity(total as usize);
    let mut errors = 0u64;
    for worker in workers {
        for (ok, latency) in worker.await.expect("a worker") {
            errors += u64::from(!ok);
            latencies.push(latency.as_micros() as u64);
        }
    }
    latencies.sort_unstable();
    let at = |share: f64| {
        let index = ((latencies.len() as f64 * share).ceil() as usize).saturating_sub(1);
        latencies.get(index).copied().unwrap_or(0)
    };
    println!(
        "requests {} errors {} p50_us {} p99_us {} max_us {}",
        latencies.len(),
        errors,
        at(0.50),
        at(0.99),
        latencies.last().copied().unwrap_or(0)
    );
}
