//! `[limits.NAME.refusal]`: the status, headers and body a limit's refusals are answered with.
//! A body file is read here, at start and on each reload, so that serving never reads a file.

use std::path::Path;

use toml::Spanned;

use super::{resolve, Errors};
use crate::config::raw::RawRefusal;
use crate::config::Refusal;

/// The largest refusal body: it goes out with every refusal of a flood.
const MAX_BODY: u64 = 64 * 1024;

pub(super) fn compile_refusal(
    raw: Spanned<RawRefusal>,
    key: &str,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<Refusal> {
    let raw = raw.into_inner();
    let key = format!("{key}.refusal");
    let status = match &raw.status {
        None => http::StatusCode::TOO_MANY_REQUESTS,
        Some(status) => match u16::try_from(*status.get_ref())
            .ok()
            .filter(|code| (400..=599).contains(code))
            .and_then(|code| http::StatusCode::from_u16(code).ok())
        {
            Some(status) => status,
            None => {
                let message = format!(
                    "{} is not a refusal: expected a status from 400 to 599",
                    status.get_ref()
                );
                errors.at(Some(status.span()), format!("{key}.status"), message);
                return None;
            }
        },
    };
    let body = match (&raw.body_file, &raw.content_type) {
        (Some(file), content_type) => Some((
            read_body(file, &key, base, errors)?,
            content_type_of(file.get_ref(), content_type.as_ref(), &key, errors)?,
        )),
        (None, Some(content_type)) => {
            errors.at(
                Some(content_type.span()),
                format!("{key}.content_type"),
                "content_type goes with body_file: the usual JSON body has its own",
            );
            return None;
        }
        (None, None) => None,
    };
    Some(Refusal {
        status,
        headers: raw.headers,
        retry_after: raw.retry_after.unwrap_or(true),
        body,
    })
}

/// The body file's bytes: at most 64 KiB, read now.
fn read_body(
    file: &Spanned<String>,
    key: &str,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<bytes::Bytes> {
    let path = resolve(base, file.get_ref());
    let refused = |errors: &mut Errors<'_>, why: String| {
        errors.at(Some(file.span()), format!("{key}.body_file"), why);
        None
    };
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.len() > MAX_BODY => {
            let why = format!(
                "{} is {} bytes: a refusal body is at most 64 KiB",
                path.display(),
                metadata.len()
            );
            return refused(errors, why);
        }
        Ok(_) => {}
        Err(error) => return refused(errors, format!("cannot read {}: {error}", path.display())),
    }
    match std::fs::read(&path) {
        Ok(bytes) => Some(bytes::Bytes::from(bytes)),
        Err(error) => refused(errors, format!("cannot read {}: {error}", path.display())),
    }
}

/// The body's content type: as written, else told by the file's extension.
fn content_type_of(
    file: &str,
    written: Option<&Spanned<String>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<std::sync::Arc<str>> {
    if let Some(written) = written {
        let text = written.get_ref().trim();
        let visible = text
            .bytes()
            .all(|byte| byte == b' ' || byte.is_ascii_graphic());
        return match (text.is_empty(), visible) {
            (false, true) => Some(std::sync::Arc::from(text)),
            _ => {
                errors.at(
                    Some(written.span()),
                    format!("{key}.content_type"),
                    "not a header value: write one such as \"text/html; charset=utf-8\"",
                );
                None
            }
        };
    }
    let extension = Path::new(file)
        .extension()
        .and_then(|extension| extension.to_str())
        .map(str::to_ascii_lowercase);
    Some(std::sync::Arc::from(match extension.as_deref() {
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("json") => "application/json",
        Some("txt") => "text/plain; charset=utf-8",
        Some("xml") => "application/xml",
        _ => "application/octet-stream",
    }))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, policy};

    const LIMIT: &str = "[limits.flood]\nkey = \"client_network\"\ncapacity = 5\nrate = \"1/s\"\n";

    #[test]
    fn a_refusal_takes_its_status_headers_and_retry_after() {
        let policy = policy(&format!(
            "{LIMIT}[limits.flood.refusal]\nstatus = 503\nheaders = \"none\"\nretry_after = false\n"
        ));
        let refusal = policy.limits[0].refusal.as_ref().unwrap();
        assert_eq!(refusal.status, 503);
        assert_eq!(refusal.headers, Some(crate::config::HeaderMode::None));
        assert!(!refusal.retry_after);
        assert!(refusal.body.is_none());
        let plain = policy_without_refusal();
        assert!(plain.limits[0].refusal.is_none());
    }

    fn policy_without_refusal() -> crate::config::Policy {
        policy(LIMIT)
    }

    #[test]
    fn a_bad_refusal_is_an_error_naming_its_key() {
        let refusal = |body: &str| format!("{LIMIT}[limits.flood.refusal]\n{body}");
        for (body, key) in [
            ("status = 200\n", "limits.flood.refusal.status"),
            ("status = 600\n", "limits.flood.refusal.status"),
            ("headers = \"loud\"\n", "limits.flood.refusal.headers"),
            (
                "content_type = \"text/html\"\n",
                "limits.flood.refusal.content_type",
            ),
            (
                "body_file = \"/nonexistent/busy.html\"\n",
                "limits.flood.refusal.body_file",
            ),
            ("colour = \"red\"\n", "limits.flood.refusal.colour"),
        ] {
            assert_eq!(error(&refusal(body)).0, key, "{body}");
        }
    }
}
