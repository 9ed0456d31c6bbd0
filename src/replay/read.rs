//! Log lines as replay reads them: tollgate's JSON access log, from files (gzip-compressed or
//! not) or standard input.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;

/// What replay needs of one logged request.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    /// Unix seconds.
    pub time: f64,
    pub method: String,
    pub path: String,
    pub client: Option<IpAddr>,
    /// Each applied limit's store key, as the gateway logged it.
    pub keys: HashMap<String, String>,
    /// The gateway took a decision on it (not a bad request, not an unrouted one).
    pub decided: bool,
}

/// Opens `path` (`-`: standard input), decompressing gzip (told by its first bytes).
fn open(path: &str) -> std::io::Result<Box<dyn BufRead>> {
    let raw: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(std::fs::File::open(path)?)
    };
    let mut reader = BufReader::with_capacity(1 << 16, raw);
    let gzip = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(BufReader::with_capacity(
            1 << 16,
            flate2::bufread::MultiGzDecoder::new(reader),
        ))
    } else {
        Box::new(reader)
    })
}

/// Calls `each` with every line of the logs, numbered from 1 per file: `Ok` with a request,
/// `Err` with why the line is not one. Lines of the log that are not access lines (other log
/// events) are passed over. Fails only when a file cannot be opened.
pub fn read_lines(
    paths: &[String],
    mut each: impl FnMut(u64, Result<LogLine, String>),
) -> Result<(), String> {
    for path in paths {
        let reader = open(path).map_err(|error| format!("cannot read {path}: {error}"))?;
        for (index, line) in reader.split(b'\n').enumerate() {
            let number = index as u64 + 1;
            let line = match line {
                Ok(line) => line,
                Err(error) => {
                    each(number, Err(format!("{path}: {error}")));
                    break;
                }
            };
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            match parse_json_line(&line) {
                Ok(Some(request)) => each(number, Ok(request)),
                Ok(None) => {}
                Err(why) => each(number, Err(why)),
            }
        }
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct JsonLine<'a> {
    timestamp: Option<&'a str>,
    target: Option<&'a str>,
    method: Option<&'a str>,
    path: Option<String>,
    client: Option<&'a str>,
    outcome: Option<&'a str>,
    keys: Option<&'a str>,
}

/// One line of tollgate's JSON log: `Ok(None)` for a line that is not an access line.
pub(super) fn parse_json_line(line: &[u8]) -> Result<Option<LogLine>, String> {
    let json: JsonLine<'_> =
        serde_json::from_slice(line).map_err(|error| format!("not a JSON log line: {error}"))?;
    if json.target != Some("tollgate::access") {
        return Ok(None);
    }
    let time = json
        .timestamp
        .ok_or("no timestamp")?
        .parse::<jiff::Timestamp>()
        .map_err(|error| format!("bad timestamp: {error}"))?;
    let time = time.as_second() as f64 + f64::from(time.subsec_nanosecond()) / 1e9;
    let keys = json
        .keys
        .unwrap_or_default()
        .split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(limit, key)| (limit.to_owned(), key.to_owned()))
        .collect();
    Ok(Some(LogLine {
        time,
        method: json.method.ok_or("no method")?.to_owned(),
        path: json.path.ok_or("no path")?,
        client: json.client.and_then(|client| client.parse().ok()),
        keys,
        decided: matches!(
            json.outcome,
            Some(
                "allowed" | "limited" | "shadow_limited" | "degraded_allowed" | "store_unavailable"
            )
        ),
    }))
}
