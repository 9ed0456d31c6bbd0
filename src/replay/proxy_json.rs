//! The JSON access logs of the proxies teams already run: Caddy's (`logger` `http.log.access…`,
//! the request under `request`) and Traefik's (flat `Request…` fields, headers as
//! `request_<Name>` when it keeps them). What replay needs of a line is read with serde, borrowed
//! from the line where the JSON has no escapes.

use std::borrow::Cow;
use std::collections::HashMap;

use super::errors::LineError;
use super::log_line::{origin_path, query_of, text, LogLine, LoggedField};
use super::time::JsonTime;

#[derive(serde::Deserialize)]
struct CaddyLine<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    logger: Option<Cow<'a, str>>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(borrow, default)]
    request: Option<CaddyRequest<'a>>,
    #[serde(default)]
    status: Option<u16>,
}

#[derive(serde::Deserialize)]
struct CaddyRequest<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    remote_ip: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    uri: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    host: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    headers: HashMap<Cow<'a, str>, Vec<Cow<'a, str>>>,
}

/// A Caddy access line; `Ok(None)` for another logger's line.
pub(super) fn caddy(line: &str) -> Result<Option<LogLine<'_>>, LineError> {
    let parsed: CaddyLine<'_> =
        serde_json::from_str(line).map_err(|error| LineError::NotOfFormat {
            format: "Caddy",
            reason: error.to_string(),
        })?;
    if !parsed
        .logger
        .as_deref()
        .is_some_and(|logger| logger.starts_with("http.log.access"))
    {
        return Ok(None);
    }
    let request = parsed.request.ok_or(LineError::Missing("request"))?;
    let method = borrowed_method(request.method.ok_or(LineError::Missing("request.method"))?)?;
    let uri = request.uri.ok_or(LineError::Missing("request.uri"))?;
    let query = query_of(&uri).map(|query| Cow::Owned(query.to_owned()));
    // The header's lines, as the gateway reads them: one chain.
    let forwarded_for = request
        .headers
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("x-forwarded-for"))
        .map(|(_, values)| match values.as_slice() {
            [one] => one.clone(),
            many => Cow::Owned(many.join(", ")),
        });
    let status = parsed.status.unwrap_or(0);
    let logged = request
        .headers
        .into_iter()
        .flat_map(|(name, values)| {
            let field = LoggedField::Header(name.to_ascii_lowercase());
            values.into_iter().map(move |value| (field.clone(), value))
        })
        .chain(query.map(|query| (LoggedField::Query, query)))
        .collect();
    Ok(Some(LogLine {
        time: parsed.ts.ok_or(LineError::Missing("ts"))?,
        method,
        path: path_of(uri)?,
        client: request.remote_ip.and_then(|address| address.parse().ok()),
        forwarded_for,
        host: request.host,
        keys: None,
        decided: status != 400,
        logged,
        costs: None,
        origin: Default::default(),
        ja4: None,
        user_agent: None,
    }))
}

#[derive(serde::Deserialize)]
struct TraefikLine<'a> {
    #[serde(rename = "ClientHost", borrow, default, deserialize_with = "text")]
    client_host: Option<Cow<'a, str>>,
    #[serde(rename = "RequestMethod", borrow, default, deserialize_with = "text")]
    method: Option<Cow<'a, str>>,
    #[serde(rename = "RequestPath", borrow, default, deserialize_with = "text")]
    path: Option<Cow<'a, str>>,
    #[serde(rename = "RequestHost", borrow, default, deserialize_with = "text")]
    host: Option<Cow<'a, str>>,
    #[serde(rename = "StartUTC", borrow, default, deserialize_with = "text")]
    start: Option<Cow<'a, str>>,
    #[serde(rename = "DownstreamStatus", default)]
    status: Option<u16>,
    #[serde(
        rename = "request_X-Forwarded-For",
        borrow,
        default,
        deserialize_with = "text"
    )]
    forwarded_for: Option<Cow<'a, str>>,
    /// The other fields, among them the headers Traefik keeps (`request_<Name>`).
    #[serde(flatten)]
    other: HashMap<String, serde_json::Value>,
}

/// A Traefik access line; `Ok(None)` for a line without a request (another log event).
pub(super) fn traefik<'a>(
    line: &'a str,
    time: &mut JsonTime,
) -> Result<Option<LogLine<'a>>, LineError> {
    let parsed: TraefikLine<'a> =
        serde_json::from_str(line).map_err(|error| LineError::NotOfFormat {
            format: "Traefik",
            reason: error.to_string(),
        })?;
    let Some(method) = parsed.method else {
        return Ok(None);
    };
    let path = parsed.path.ok_or(LineError::Missing("RequestPath"))?;
    let status = parsed.status.unwrap_or(0);
    let query = query_of(&path).map(|query| Cow::Owned(query.to_owned()));
    let logged = parsed
        .other
        .into_iter()
        .filter_map(|(name, value)| {
            let header = name.strip_prefix("request_")?.to_ascii_lowercase();
            let serde_json::Value::String(value) = value else {
                return None;
            };
            Some((LoggedField::Header(header), Cow::Owned(value)))
        })
        .chain(query.map(|query| (LoggedField::Query, query)))
        .collect();
    Ok(Some(LogLine {
        time: time.parse(&parsed.start.ok_or(LineError::Missing("StartUTC"))?)?,
        method: borrowed_method(method)?,
        path: path_of(path)?,
        client: parsed.client_host.and_then(|host| host.parse().ok()),
        forwarded_for: parsed.forwarded_for.filter(|chain| chain != "-"),
        host: parsed.host,
        keys: None,
        decided: status != 400,
        logged,
        costs: None,
        origin: Default::default(),
        ja4: None,
        user_agent: None,
    }))
}

/// A method as the line holds it: methods have nothing JSON escapes.
fn borrowed_method(method: Cow<'_, str>) -> Result<&str, LineError> {
    match method {
        Cow::Borrowed(method) if !method.is_empty() => Ok(method),
        _ => Err(LineError::Method),
    }
}

/// The path of a logged request target, without its query.
fn path_of(target: Cow<'_, str>) -> Result<Cow<'_, str>, LineError> {
    match target {
        Cow::Borrowed(target) => origin_path(target)
            .map(Cow::Borrowed)
            .ok_or_else(|| LineError::Target(target.to_string())),
        Cow::Owned(target) => origin_path(&target)
            .map(|path| Cow::Owned(path.to_owned()))
            .ok_or_else(|| LineError::Target(target.to_string())),
    }
}
