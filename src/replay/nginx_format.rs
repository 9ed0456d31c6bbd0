//! nginx logs in the operator's own `log_format`: the format string as written in nginx.conf
//! (one or several quoted pieces, or the bare text) is compiled once into literals and
//! variables, and each line is read against it, every variable's value running to the
//! literal that follows it.

use std::borrow::Cow;
use std::net::IpAddr;

use super::errors::{FormatError, LineError};
use super::log_line::{origin_path, query_of, LogLine, LoggedField};
use super::time::{CombinedTime, JsonTime};

/// A compiled `log_format`.
#[derive(Debug, Clone, PartialEq)]
pub struct NginxFormat {
    pieces: Vec<Piece>,
}

#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Literal(String),
    Variable(Variable),
}

/// The variables replay reads; every other one is read and passed over.
#[derive(Debug, Clone, PartialEq)]
enum Variable {
    RemoteAddr,
    TimeLocal,
    TimeIso8601,
    Msec,
    Request,
    RequestMethod,
    RequestUri,
    Uri,
    Status,
    ForwardedFor,
    Host,
    /// `$http_NAME`, `$cookie_NAME`, `$arg_NAME`: values a limit may be keyed by.
    Logged(LoggedField),
    Other,
}

impl Variable {
    fn named(name: &str) -> Variable {
        match name {
            "remote_addr" => Variable::RemoteAddr,
            "time_local" => Variable::TimeLocal,
            "time_iso8601" => Variable::TimeIso8601,
            "msec" => Variable::Msec,
            "request" => Variable::Request,
            "request_method" => Variable::RequestMethod,
            "request_uri" => Variable::RequestUri,
            "uri" => Variable::Uri,
            "status" => Variable::Status,
            "http_x_forwarded_for" => Variable::ForwardedFor,
            "args" | "query_string" => Variable::Logged(LoggedField::Query),
            "host" => Variable::Host,
            _ => {
                let logged = if let Some(header) = name.strip_prefix("http_") {
                    LoggedField::Header(header.replace('_', "-"))
                } else if let Some(cookie) = name.strip_prefix("cookie_") {
                    LoggedField::Cookie(cookie.to_owned())
                } else if let Some(arg) = name.strip_prefix("arg_") {
                    LoggedField::Arg(arg.to_owned())
                } else {
                    return Variable::Other;
                };
                Variable::Logged(logged)
            }
        }
    }
}

impl NginxFormat {
    /// Compiles `text`: `log_format`'s value as nginx.conf has it (`'$remote_addr - …'
    /// '"$request" …'`, the quoted pieces joined) or the bare format.
    pub fn compile(text: &str) -> Result<NginxFormat, FormatError> {
        let format = unquoted(text.trim())?;
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = format.as_str();
        while let Some(dollar) = rest.find('$') {
            literal.push_str(&rest[..dollar]);
            rest = &rest[dollar + 1..];
            let (name, after) = if let Some(braced) = rest.strip_prefix('{') {
                let close = braced.find('}').ok_or(FormatError::UnclosedBrace)?;
                (&braced[..close], &braced[close + 1..])
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                (&rest[..end], &rest[end..])
            };
            if name.is_empty() {
                literal.push('$');
                continue;
            }
            if !literal.is_empty() {
                pieces.push(Piece::Literal(std::mem::take(&mut literal)));
            } else if matches!(pieces.last(), Some(Piece::Variable(_))) {
                return Err(FormatError::Adjacent(name.to_owned()));
            }
            pieces.push(Piece::Variable(Variable::named(&name.to_ascii_lowercase())));
            rest = after;
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        let has = |wanted: &[Variable]| {
            pieces.iter().any(
                |piece| matches!(piece, Piece::Variable(variable) if wanted.contains(variable)),
            )
        };
        if !has(&[Variable::TimeLocal, Variable::TimeIso8601, Variable::Msec]) {
            return Err(FormatError::NoTime);
        }
        let method = has(&[Variable::Request, Variable::RequestMethod]);
        let path = has(&[Variable::Request, Variable::RequestUri, Variable::Uri]);
        if !(method && path) {
            return Err(FormatError::NoRequest);
        }
        Ok(NginxFormat { pieces })
    }

    /// Reads one line.
    pub(super) fn parse<'a>(
        &self,
        line: &'a str,
        local: &mut CombinedTime,
        iso: &mut JsonTime,
    ) -> Result<LogLine<'a>, LineError> {
        let mut fields = Fields::default();
        let mut rest = line;
        let mut pieces = self.pieces.iter().peekable();
        while let Some(piece) = pieces.next() {
            match piece {
                Piece::Literal(text) => {
                    rest = rest
                        .strip_prefix(text.as_str())
                        .ok_or_else(|| LineError::Mismatch(text.clone()))?;
                }
                Piece::Variable(variable) => {
                    let end = match pieces.peek() {
                        Some(Piece::Literal(next)) => rest
                            .find(next.as_str())
                            .ok_or_else(|| LineError::Mismatch(next.clone()))?,
                        _ => rest.len(),
                    };
                    fields.set(variable, &rest[..end]);
                    rest = &rest[end..];
                }
            }
        }
        fields.line(local, iso)
    }
}

/// The values a line gave the variables replay reads (`-` is none).
#[derive(Default)]
struct Fields<'a> {
    remote_addr: Option<&'a str>,
    time_local: Option<&'a str>,
    time_iso8601: Option<&'a str>,
    msec: Option<&'a str>,
    request: Option<&'a str>,
    method: Option<&'a str>,
    request_uri: Option<&'a str>,
    uri: Option<&'a str>,
    status: Option<&'a str>,
    forwarded_for: Option<&'a str>,
    host: Option<&'a str>,
    logged: Vec<(LoggedField, Cow<'a, str>)>,
}

impl<'a> Fields<'a> {
    fn set(&mut self, variable: &Variable, value: &'a str) {
        let value = (value != "-" && !value.is_empty()).then_some(value);
        let slot = match variable {
            Variable::RemoteAddr => &mut self.remote_addr,
            Variable::TimeLocal => &mut self.time_local,
            Variable::TimeIso8601 => &mut self.time_iso8601,
            Variable::Msec => &mut self.msec,
            Variable::Request => &mut self.request,
            Variable::RequestMethod => &mut self.method,
            Variable::RequestUri => &mut self.request_uri,
            Variable::Uri => &mut self.uri,
            Variable::Status => &mut self.status,
            Variable::ForwardedFor => &mut self.forwarded_for,
            Variable::Host => &mut self.host,
            Variable::Logged(field) => {
                if let Some(value) = value {
                    self.logged.push((field.clone(), Cow::Borrowed(value)));
                }
                return;
            }
            Variable::Other => return,
        };
        *slot = value;
    }

    fn line(self, local: &mut CombinedTime, iso: &mut JsonTime) -> Result<LogLine<'a>, LineError> {
        let time = if let Some(msec) = self.msec {
            msec.parse::<f64>()
                .ok()
                .filter(|seconds| seconds.is_finite())
                .ok_or_else(|| LineError::Msec(msec.to_owned()))?
        } else if let Some(text) = self.time_iso8601 {
            iso.parse(text)?
        } else {
            local.parse(self.time_local.ok_or(LineError::Missing("time"))?)?
        };
        let mut request = self.request.unwrap_or("").split(' ');
        let method = self.method.unwrap_or_else(|| request.next().unwrap_or(""));
        let target = self
            .request_uri
            .or(self.uri)
            .unwrap_or_else(|| request.next().unwrap_or(""));
        let path = origin_path(target);
        let status = self.status.and_then(|status| status.parse::<u16>().ok());
        let mut logged = self.logged;
        if !logged.iter().any(|(field, _)| *field == LoggedField::Query) {
            if let Some(query) = query_of(target) {
                logged.push((LoggedField::Query, Cow::Borrowed(query)));
            }
        }
        Ok(LogLine {
            time,
            method,
            path: Cow::Borrowed(path.unwrap_or("")),
            client: self
                .remote_addr
                .and_then(|address| address.parse::<IpAddr>().ok()),
            forwarded_for: self.forwarded_for.map(Cow::Borrowed),
            host: self.host.map(Cow::Borrowed),
            keys: None,
            // A request the server could not read reached no limit.
            decided: path.is_some() && !method.is_empty() && status != Some(400),
            logged,
            costs: None,
            origin: Default::default(),
            ja4: None,
            user_agent: None,
        })
    }
}

/// The format without nginx.conf's quoting: quoted pieces (`'…'` or `"…"`, `\` escaping the
/// next character) joined, or the text as it is when it starts with no quote.
fn unquoted(text: &str) -> Result<String, FormatError> {
    if !text.starts_with(['\'', '"']) {
        return Ok(text.to_owned());
    }
    let mut joined = String::new();
    let mut chars = text.chars();
    loop {
        let quote = match chars.by_ref().find(|c| !c.is_whitespace()) {
            None => return Ok(joined),
            Some(quote @ ('\'' | '"')) => quote,
            Some(other) => return Err(FormatError::OutsideQuotes(other)),
        };
        loop {
            match chars.next() {
                None => return Err(FormatError::Unbalanced(quote)),
                Some('\\') => joined.extend(chars.next()),
                Some(c) if c == quote => break,
                Some(c) => joined.push(c),
            }
        }
    }
}
