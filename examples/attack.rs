//! Memory under attack: drives a running gateway with a new key on every request (a rotating
//! IPv6 /64 in `X-Forwarded-For` and a rotating `X-User-Id`), at up to `KEYS_PER_MINUTE`, while
//! one legitimate client keeps asking under its own key; samples the gateway's RSS. Bounded in
//! time and requests; loopback only. Run by `bench/attack.sh`, which starts the gateway.
//!
//! Usage: attack GATEWAY_ADDRESS GATEWAY_PID SECONDS KEYS_PER_MINUTE CAPACITY RATE_PER_SECOND
#![allow(clippy::disallowed_methods)] // a load generator measures real time

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

#[path = "support/load.rs"]
mod load;
use load::{request, rss_mib};

/// Connections the attacker spreads its requests over.
const CONNECTIONS: u64 = 64;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: attack GATEWAY_ADDRESS GATEWAY_PID SECONDS KEYS_PER_MINUTE CAPACITY RATE_PER_SECOND";
    let [_, address, pid, seconds, keys_per_minute, capacity, rate] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let address: SocketAddr = address.parse().expect(usage);
    let pid: u32 = pid.parse().expect(usage);
    let run = Duration::from_secs(seconds.parse().expect(usage));
    let keys_per_minute: u64 = keys_per_minute.parse().expect(usage);
    let capacity: f64 = capacity.parse().expect(usage);
    let rate: f64 = rate.parse().expect(usage);

    let started = Instant::now();
    let baseline = rss_mib(pid);
    let next_key = Arc::new(AtomicU64::new(0));
    let statuses: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let interval = Duration::from_secs_f64(60.0 * CONNECTIONS as f64 / keys_per_minute as f64);
    let mut attackers = Vec::new();
    for _ in 0..CONNECTIONS {
        let (next_key, statuses) = (next_key.clone(), statuses.clone());
        attackers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut stream = TcpStream::connect(address).await.ok();
            let mut buffer = Vec::with_capacity(4096);
            while started.elapsed() < run {
                ticks.tick().await;
                let key = next_key.fetch_add(1, Ordering::Relaxed);
                let head = format!(
                    "GET /attack HTTP/1.1\r\nHost: target\r\nX-Forwarded-For: 2001:db8:{:x}:{:x}::1\r\nX-User-Id: attacker-{key}\r\n\r\n",
                    key >> 16,
                    key & 0xffff
                );
                let status = match stream.as_mut() {
                    Some(stream) => request(stream, head.as_bytes(), &mut buffer).await,
                    None => None,
                };
                let slot = match status {
                    Some(200) => 0,
                    Some(429) => 1,
                    Some(_) => 2,
                    None => {
                        stream = TcpStream::connect(address).await.ok();
                        3
                    }
                };
                statuses[slot].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    // The legitimate client: 20 requests a second under one key.
    let legitimate = tokio::spawn(async move {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let mut buffer = Vec::new();
        let mut ticks = tokio::time::interval(Duration::from_millis(50));
        let (mut admitted, mut sent) = (0u64, 0u64);
        let head = b"GET /legit HTTP/1.1\r\nHost: target\r\nX-Forwarded-For: 198.51.100.7\r\nX-User-Id: legitimate\r\n\r\n";
        while started.elapsed() < run {
            ticks.tick().await;
            sent += 1;
            match request(&mut stream, head, &mut buffer).await {
                Some(200) => admitted += 1,
                Some(_) => {}
                None => stream = TcpStream::connect(address).await.expect("reconnect"),
            }
        }
        (admitted, sent, started.elapsed())
    });

    let mut peak = baseline;
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = rss_mib(pid);
        peak = peak.max(now);
        let keys = next_key.load(Ordering::Relaxed);
        println!(
            "{:>4.0} s  {keys:>9} keys sent  RSS {now:>7.1} MiB",
            started.elapsed().as_secs_f64()
        );
    }
    for attacker in attackers {
        let _ = attacker.await;
    }
    let (admitted, sent, elapsed) = legitimate.await.expect("legitimate client");
    let keys = next_key.load(Ordering::Relaxed);
    let [ok, limited, other, failed] = statuses
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .collect::<Vec<_>>()[..]
    else {
        unreachable!()
    };
    let allowed = capacity + rate * elapsed.as_secs_f64();
    println!("attack: {keys} distinct keys in {:.0} s ({:.0} per minute): {ok} admitted, {limited} refused, {other} other, {failed} failed",
        elapsed.as_secs_f64(), keys as f64 * 60.0 / elapsed.as_secs_f64());
    println!("legitimate client: {admitted} of {sent} admitted; its limit allows {allowed:.0}");
    println!(
        "gateway RSS: {baseline:.1} MiB at the start, peak {peak:.1} MiB, {:.1} MiB at the end",
        rss_mib(pid)
    );
    if admitted as f64 > allowed + 1.0 {
        println!("FAIL: the legitimate client's limit did not hold");
        std::process::exit(1);
    }
}
