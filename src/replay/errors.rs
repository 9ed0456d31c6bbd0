//! Why replay refuses a `--format`, a log file or one line of a log. A line's error is counted
//! and shown with its number, and the run goes on; the others end it.

/// Why a line of a log is not a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not a log line: not UTF-8")]
    NotUtf8,
    #[error("not a {0} log line: not UTF-8")]
    FormatNotUtf8(&'static str),
    /// JSON that the format's reader could not read, with what serde_json said.
    #[error("not a {format} log line: {reason}")]
    NotOfFormat {
        format: &'static str,
        reason: String,
    },
    #[error("not a combined log line: {0}")]
    NotCombined(&'static str),
    /// A field the line must have.
    #[error("no {0}")]
    Missing(&'static str),
    #[error("not a method")]
    Method,
    #[error("not a request target: {0:?}")]
    Target(String),
    /// The text where an nginx `log_format`'s literal should have been.
    #[error("does not match the format at {0:?}")]
    Mismatch(String),
    #[error("bad $msec {0:?}")]
    Msec(String),
    #[error("bad timestamp: {0}")]
    Timestamp(String),
    #[error("bad time {text:?}: {reason}")]
    Time { text: String, reason: String },
    /// Longer than the longest line read (bytes).
    #[error("longer than {0} bytes: skipped")]
    TooLong(usize),
    /// The file broke off while being read.
    #[error("{path}: {reason}")]
    Read { path: String, reason: String },
}

/// Why `--format` names no format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "unknown format {0:?}: expected auto, json, combined, caddy, traefik or nginx:'LOG_FORMAT'"
    )]
    Unknown(String),
    #[error("a ${{ without its }} in the log_format string")]
    UnclosedBrace,
    #[error("${0} follows another variable with nothing between: where one ends is unknowable")]
    Adjacent(String),
    #[error("the format logs no time: $time_local, $time_iso8601 or $msec")]
    NoTime,
    #[error("the format logs no request: $request, or $request_method with $request_uri or $uri")]
    NoRequest,
    #[error("{0:?} outside the quoted pieces of the log_format string")]
    OutsideQuotes(char),
    #[error("unbalanced {0} in the log_format string")]
    Unbalanced(char),
}

/// A log that cannot be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot read {path}: {error}")]
pub struct OpenError {
    pub path: String,
    pub error: std::io::Error,
}
