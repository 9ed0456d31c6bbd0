//! Log lines as replay reads them: tollgate's JSON access log, or the nginx/Apache "combined"
//! format, from files (gzip-compressed or not) or standard input. A line is borrowed from the
//! reader's buffer, not copied: replay reads a million of them a second.

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Read};
use std::net::IpAddr;

use super::errors::{FormatError, LineError, OpenError};
use super::log_line::LoggedCosts;
use super::log_line::{origin_path, query_of, text};
pub use super::log_line::{LogLine, LoggedField, LoggedKeys};
use super::nginx_format::NginxFormat;
use super::time::{CombinedTime, JsonTime};
use super::{flat_json, proxy_json};
use crate::geoip::{self, Country, Origin};

/// The log format a file is read as.
#[derive(Debug, Clone, PartialEq)]
pub enum Format {
    /// Told by each file's first line: `{` starts a JSON line.
    Auto,
    /// tollgate's JSON access log.
    Json,
    /// nginx's and Apache's "combined" format, optionally followed by `"$http_x_forwarded_for"`.
    Combined,
    /// Caddy's JSON access log.
    Caddy,
    /// Traefik's JSON access log.
    Traefik,
    /// nginx with the operator's own `log_format` (`nginx:'…'`).
    Nginx(std::sync::Arc<NginxFormat>),
}

impl Format {
    /// `auto`, `json`, `combined`, `caddy`, `traefik`, or `nginx:FORMAT` with the
    /// `log_format` string as nginx.conf has it: what `--format` takes.
    pub fn parse(text: &str) -> Result<Format, FormatError> {
        if let Some(format) = text.strip_prefix("nginx:") {
            return NginxFormat::compile(format).map(|format| Format::Nginx(format.into()));
        }
        Ok(match text {
            "auto" => Format::Auto,
            "json" => Format::Json,
            "combined" => Format::Combined,
            "caddy" => Format::Caddy,
            "traefik" => Format::Traefik,
            _ => return Err(FormatError::Unknown(text.to_owned())),
        })
    }

    /// The format a file's first line is in: JSON lines are tollgate's, Caddy's or
    /// Traefik's, told by their fields; anything else is taken for combined.
    pub(super) fn of_first_line(line: &[u8]) -> Format {
        if !line.starts_with(b"{") {
            return Format::Combined;
        }
        let has = |field: &[u8]| memchr::memmem::find(line, field).is_some();
        if has(b"\"logger\":\"http.log.access") {
            Format::Caddy
        } else if has(b"\"RequestMethod\"") {
            Format::Traefik
        } else {
            Format::Json
        }
    }
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

/// Reads one line after another in `format`, keeping what repeats between lines (the day of
/// a JSON timestamp, the second of a combined one).
#[derive(Default)]
pub struct LineParser {
    json_time: JsonTime,
    combined_time: CombinedTime,
}

impl LineParser {
    /// One line: `Ok(None)` for a line that is not a request (another log event).
    pub fn parse<'a>(
        &mut self,
        format: &Format,
        line: &'a [u8],
    ) -> Result<Option<LogLine<'a>>, LineError> {
        match format {
            Format::Combined => self.parse_combined(line).map(Some),
            Format::Json | Format::Auto => self.parse_json(line),
            Format::Caddy => proxy_json::caddy(utf8(line)?),
            Format::Traefik => proxy_json::traefik(utf8(line)?, &mut self.json_time),
            Format::Nginx(nginx) => {
                let line = std::str::from_utf8(line).map_err(|_| LineError::NotUtf8)?;
                nginx
                    .parse(line, &mut self.combined_time, &mut self.json_time)
                    .map(Some)
            }
        }
    }

    fn parse_json<'a>(&mut self, line: &'a [u8]) -> Result<Option<LogLine<'a>>, LineError> {
        let line = utf8(line)?;
        let json = AccessFields::scan(line).map_or_else(|| AccessFields::deserialize(line), Ok)?;
        if json.target.as_deref() != Some("tollgate::access") {
            return Ok(None);
        }
        let time = self
            .json_time
            .parse(&json.timestamp.ok_or(LineError::Missing("timestamp"))?)?;
        let Cow::Borrowed(method) = json.method.ok_or(LineError::Missing("method"))? else {
            return Err(LineError::Method);
        };
        Ok(Some(LogLine {
            time,
            method,
            path: json.path.ok_or(LineError::Missing("path"))?,
            client: json.client.and_then(|client| client.parse().ok()),
            forwarded_for: None,
            host: None,
            keys: Some(json.keys.unwrap_or_default()),
            decided: matches!(
                json.outcome.as_deref(),
                Some(
                    "allowed"
                        | "limited"
                        | "banned"
                        | "shadow_limited"
                        | "degraded_allowed"
                        | "store_unavailable"
                )
            ),
            logged: Vec::new(),
            origin: Origin {
                asn: json.asn.as_deref().and_then(geoip::parse_asn),
                country: json.country.as_deref().and_then(Country::parse),
            },
            ja4: json.ja4.filter(|ja4| !ja4.is_empty()),
            user_agent: None,
            costs: match (json.reserved, json.settled) {
                (Some(reserved), Some(settled)) if !settled.is_empty() => {
                    Some(LoggedCosts { reserved, settled })
                }
                _ => None,
            },
        }))
    }

    /// `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent
    /// "$http_referer" "$http_user_agent"`, and optionally `"$http_x_forwarded_for"`.
    fn parse_combined<'a>(&mut self, line: &'a [u8]) -> Result<LogLine<'a>, LineError> {
        let line = std::str::from_utf8(line)
            .map_err(|_| LineError::FormatNotUtf8("combined"))?
            .trim_end();
        let not_combined = LineError::NotCombined;
        let (remote, rest) = line
            .split_once(' ')
            .ok_or_else(|| not_combined("no fields"))?;
        let client = remote
            .parse::<IpAddr>()
            .map_err(|_| not_combined("the first field is not an address"))?;
        let (_, rest) = rest
            .split_once('[')
            .ok_or_else(|| not_combined("no [time]"))?;
        let (time, rest) = rest
            .split_once(']')
            .ok_or_else(|| not_combined("no [time]"))?;
        let time = self.combined_time.parse(time)?;
        let mut quoted = Quoted(rest);
        let request = quoted
            .next()
            .ok_or_else(|| not_combined("no \"request\""))?;
        let status = quoted
            .0
            .split_whitespace()
            .next()
            .and_then(|status| status.parse::<u16>().ok())
            .ok_or_else(|| not_combined("no status"))?;
        let (_referer, agent) = (quoted.next(), quoted.next());
        let forwarded_for = quoted
            .next()
            .filter(|value| *value != "-")
            .map(Cow::Borrowed);
        let mut parts = request.split(' ');
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let path = origin_path(target);
        let logged = query_of(target)
            .map(|query| vec![(LoggedField::Query, Cow::Borrowed(query))])
            .unwrap_or_default();
        Ok(LogLine {
            time,
            method,
            path: Cow::Borrowed(path.unwrap_or("")),
            client: Some(client),
            forwarded_for,
            host: None,
            keys: None,
            // A request line the server could not read (logged as "-", or a 400 for garbage)
            // reached no limit.
            decided: path.is_some() && !method.is_empty() && status != 400,
            logged,
            costs: None,
            origin: Default::default(),
            ja4: None,
            user_agent: agent.filter(|agent| *agent != "-").map(Cow::Borrowed),
        })
    }
}

fn utf8(line: &[u8]) -> Result<&str, LineError> {
    std::str::from_utf8(line).map_err(|_| LineError::FormatNotUtf8("JSON"))
}

/// The fields of a JSON access line that replay reads.
#[derive(Debug, Default, PartialEq, serde::Deserialize)]
pub(super) struct AccessFields<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    timestamp: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    target: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    client: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    outcome: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    keys: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    reserved: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    settled: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    asn: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    country: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    ja4: Option<Cow<'a, str>>,
}

impl<'a> AccessFields<'a> {
    /// The fast way: a flat line without escapes, as tollgate writes it. `None` for any
    /// other line, and for one that serde_json would not read the same (a field twice, or not
    /// a string).
    pub(super) fn scan(line: &'a str) -> Option<AccessFields<'a>> {
        let mut fields = AccessFields::default();
        let mut plain = true;
        flat_json::fields(line, |name, value| {
            let slot = match name {
                "timestamp" => &mut fields.timestamp,
                "target" => &mut fields.target,
                "method" => &mut fields.method,
                "path" => &mut fields.path,
                "client" => &mut fields.client,
                "outcome" => &mut fields.outcome,
                "keys" => &mut fields.keys,
                "reserved" => &mut fields.reserved,
                "settled" => &mut fields.settled,
                "asn" => &mut fields.asn,
                "country" => &mut fields.country,
                "ja4" => &mut fields.ja4,
                _ => return,
            };
            match value {
                flat_json::Value::Text(text) if slot.is_none() => *slot = Some(Cow::Borrowed(text)),
                _ => plain = false,
            }
        })?;
        plain.then_some(fields)
    }

    pub(super) fn deserialize(line: &'a str) -> Result<AccessFields<'a>, LineError> {
        serde_json::from_str(line).map_err(|error| LineError::NotOfFormat {
            format: "JSON",
            reason: error.to_string(),
        })
    }
}

/// The double-quoted fields of a combined line, in order (`\"` inside one is Apache's escape).
struct Quoted<'a>(&'a str);

impl<'a> Iterator for Quoted<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let start = self.0.find('"')? + 1;
        let bytes = self.0.as_bytes();
        let mut end = start;
        while end < bytes.len() && bytes[end] != b'"' {
            end += if bytes[end] == b'\\' { 2 } else { 1 };
        }
        let field = self.0.get(start..end.min(bytes.len()))?;
        self.0 = self.0.get(end + 1..).unwrap_or("");
        Some(field)
    }
}

/// The longest line read: an access line holds a path, keys and a few fields, far below this.
/// A longer one is skipped and counted as a bad line, and never held whole in memory.
pub(super) const MAX_LINE_BYTES: usize = 1 << 20;

/// Calls `each` with every line of the logs, numbered from 1 per file: `Ok` with a request,
/// `Err` with why the line is not one. Lines of the log that are not access lines (other log
/// events) are passed over. Fails only when a file cannot be opened.
pub fn read_lines(
    paths: &[String],
    format: &Format,
    mut each: impl FnMut(u64, Result<LogLine<'_>, LineError>),
) -> Result<(), OpenError> {
    let mut parser = LineParser::default();
    // A line split between two reads of the file, put together here; every other line is
    // read where it lies in the reader's buffer.
    let mut split_line = Vec::new();
    for path in paths {
        let mut reader = open(path).map_err(|error| OpenError {
            path: path.clone(),
            error,
        })?;
        let mut file_format = format.clone();
        let mut number = 0;
        let mut line = |line: &[u8]| {
            number += 1;
            if line.len() > MAX_LINE_BYTES {
                each(number, Err(LineError::TooLong(MAX_LINE_BYTES)));
                return;
            }
            let line = line.trim_ascii();
            if line.is_empty() {
                return;
            }
            if file_format == Format::Auto {
                file_format = Format::of_first_line(line);
            }
            match parser.parse(&file_format, line) {
                Ok(Some(request)) => each(number, Ok(request)),
                Ok(None) => {}
                Err(why) => each(number, Err(why)),
            }
        };
        loop {
            let buffer = match reader.fill_buf() {
                Ok(buffer) => buffer,
                Err(error) => {
                    let reason = error.to_string();
                    let path = path.clone();
                    each(number + 1, Err(LineError::Read { path, reason }));
                    break;
                }
            };
            if buffer.is_empty() {
                if !split_line.is_empty() {
                    line(&split_line);
                    split_line.clear();
                }
                break;
            }
            let mut start = 0;
            for end in memchr::memchr_iter(b'\n', buffer) {
                if split_line.is_empty() {
                    line(&buffer[start..end]);
                } else {
                    extend_bounded(&mut split_line, &buffer[start..end]);
                    line(&split_line);
                    split_line.clear();
                }
                start = end + 1;
            }
            extend_bounded(&mut split_line, &buffer[start..]);
            let read = buffer.len();
            reader.consume(read);
        }
    }
    Ok(())
}

/// Appends to a line split between reads, up to one byte past [`MAX_LINE_BYTES`]: enough to
/// tell it is too long, without holding all of it.
pub(super) fn extend_bounded(line: &mut Vec<u8>, more: &[u8]) {
    let room = (MAX_LINE_BYTES + 1).saturating_sub(line.len());
    line.extend_from_slice(&more[..more.len().min(room)]);
}
