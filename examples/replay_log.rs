//! Writes a generated access log, as tollgate's JSON log spells it, for `bench/replay.sh`:
//! LINES requests over one day from 5,000 clients in 500 /24 networks, each line carrying
//! the three limits' keys of `bench/replay.toml` (`per_user`, `per_network`, `global`). A few
//! busy users send bursts that the policy refuses. Deterministic: the same LINES, the same log.
//!
//! Usage: replay_log LINES [combined] > access.log

use std::io::Write;

/// A small deterministic generator (xorshift64*): the log must not change between runs.
struct Numbers(u64);

impl Numbers {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
}

const PATHS: [&str; 4] = ["/api/items", "/api/items/42", "/api/search", "/login"];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(lines) = args.get(1).and_then(|lines| lines.parse::<u64>().ok()) else {
        eprintln!("usage: replay_log LINES [combined] > access.log");
        std::process::exit(2);
    };
    let combined = args.get(2).is_some_and(|format| format == "combined");
    let mut numbers = Numbers(0x9e37_79b9_7f4a_7c15);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    // 2026-12-01T00:00:00Z, spread over one day.
    let start = 1_796_083_200_u64;
    let step_us = 86_400_000_000 / lines.max(1);
    for index in 0..lines {
        let micros = index * step_us;
        let (seconds, fraction) = (start + micros / 1_000_000, micros % 1_000_000);
        // One request in eight comes from one of ten busy users.
        let user = if numbers.below(8) == 0 {
            numbers.below(10)
        } else {
            10 + numbers.below(4_990)
        };
        let network = user % 500;
        let host = 1 + user / 500 % 250;
        let path = PATHS[numbers.below(PATHS.len() as u64) as usize];
        let day_seconds = seconds % 86_400;
        let (hour, minute, second) = (day_seconds / 3600, day_seconds / 60 % 60, day_seconds % 60);
        let client = format!("10.{}.{}.{host}", network / 250, network % 250);
        if combined {
            let _ = writeln!(
                out,
                "{client} - - [01/Dec/2026:{hour:02}:{minute:02}:{second:02} +0000] \"GET {path} HTTP/1.1\" 200 512 \"-\" \"bench/1.0\""
            );
            continue;
        }
        let _ = writeln!(
            out,
            concat!(
                r#"{{"timestamp":"2026-12-01T{:02}:{:02}:{:02}.{:06}Z","level":"INFO","client":"{}","#,
                r#""method":"GET","path":"{}","route":"api","status":200,"outcome":"allowed","cause":"","#,
                r#""limit":"","keys":"per_user=h:{:032x},per_network=v4:10.{}.{}.0/24,global=global","#,
                r#""duration_ms":0.412,"upstream_ms":0.301,"request_id":"{:016x}","target":"tollgate::access"}}"#
            ),
            hour,
            minute,
            second,
            fraction,
            client,
            path,
            u128::from(user) * 0x9e37_79b9_7f4a_7c15,
            network / 250,
            network % 250,
            index,
        );
    }
    let _ = out.flush();
}
