//! Memory of the in-process store: RSS after 1,000,000 distinct client networks have each made
//! one request, and after their buckets have refilled (and been swept).
//! Usage: cargo run --release --example memory_footprint [-- KEYS]

use std::time::Duration;

use tollgate::limit::{BucketKey, BucketRequest, Charge, Clock, KeyPart, MemoryStore};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| {
            value
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

fn main() {
    let keys: u32 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let clock = Clock::manual();
    let store = MemoryStore::new(2_000_000, clock.clone());
    let limit = "per_network";
    let baseline = rss_bytes();
    for index in 0..keys {
        // Distinct /24 networks: 1.0.0.0/24, 1.0.1.0/24, ...
        let address = std::net::Ipv4Addr::from(0x0100_0000u32 + (index << 8));
        let request = BucketRequest {
            key: BucketKey {
                limit,
                fingerprint: 1,
                parts: [KeyPart::Network(ipnet::IpNet::from(
                    ipnet::Ipv4Net::new(address, 24).unwrap(),
                ))]
                .into_iter()
                .collect(),
            },
            charge: Charge {
                capacity: 20.0,
                rate: 1.0,
                cost: 1.0,
                enforce: true,
                period: None,
                debt: 0.0,
            },
            adaptive: None,
            lease: None,
            ban: None,
        };
        store.decide(&[request]);
    }
    let loaded = rss_bytes();
    let held = store.len();
    clock.advance(Duration::from_secs(60));
    store.sweep();
    let swept = rss_bytes();
    let per_key = (loaded.saturating_sub(baseline)) as f64 / f64::from(keys);
    println!("keys: {keys}, buckets held: {held}");
    println!("RSS baseline {:.1} MiB, after one request per key {:.1} MiB ({per_key:.0} bytes per active key)", baseline as f64 / 1048576.0, loaded as f64 / 1048576.0);
    println!(
        "RSS after refill and sweep {:.1} MiB ({} buckets held): {:.1} MiB above baseline",
        swept as f64 / 1048576.0,
        store.len(),
        swept.saturating_sub(baseline) as f64 / 1048576.0
    );
}
