//! gRPC's view of the gateway's own answers. A gRPC client reads its call's outcome from
//! `grpc-status`, not from the HTTP status: a 429 reaches it as UNAVAILABLE, which its library
//! retries at once. So a request with `content-type: application/grpc…` that the gateway
//! answers itself gets HTTP 200 with the status in the headers and no body (a trailers-only
//! response), and a refusal by a limit says how long to wait in the way gRPC clients read it:
//! a `google.rpc.Status` carrying a `google.rpc.RetryInfo`.

use base64::Engine as _;
use http::StatusCode;

/// The gRPC status codes the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    ResourceExhausted = 8,
    Unavailable = 14,
    Unauthenticated = 16,
    Unimplemented = 12,
}

impl Code {
    /// The code of an answer the gateway would give with this HTTP status: a refusal by a
    /// limit is RESOURCE_EXHAUSTED, a token refused UNAUTHENTICATED, another client error
    /// INVALID_ARGUMENT, and the gateway's and upstream's failures UNAVAILABLE.
    pub fn for_status(status: StatusCode) -> Code {
        match status {
            StatusCode::TOO_MANY_REQUESTS => Code::ResourceExhausted,
            StatusCode::UNAUTHORIZED => Code::Unauthenticated,
            status if status.is_client_error() => Code::InvalidArgument,
            _ => Code::Unavailable,
        }
    }

    /// As `grpc-status` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Ok => "0",
            Code::InvalidArgument => "3",
            Code::ResourceExhausted => "8",
            Code::Unavailable => "14",
            Code::Unauthenticated => "16",
            Code::Unimplemented => "12",
        }
    }
}

/// Whether a `content-type` names gRPC (`application/grpc`, `application/grpc+proto`, …).
pub fn is_grpc(content_type: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type.len() >= GRPC.len()
        && content_type[..GRPC.len()].eq_ignore_ascii_case(GRPC)
        && matches!(content_type.get(GRPC.len()), None | Some(b'+' | b';'))
}

/// Why a unary call's request body holds no message to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the request is not one length-prefixed gRPC message")]
    Malformed,
    #[error("compressed messages are not accepted: send them with grpc-encoding identity")]
    Compressed,
}

/// The one message of a unary call's request body: a flag byte (0: not compressed), a
/// big-endian length, the message, and nothing after it.
pub fn unary_message(body: &[u8]) -> Result<&[u8], FrameError> {
    let (&flag, rest) = body.split_first().ok_or(FrameError::Malformed)?;
    let (length, message) = rest.split_first_chunk::<4>().ok_or(FrameError::Malformed)?;
    if usize::try_from(u32::from_be_bytes(*length)).ok() != Some(message.len()) {
        return Err(FrameError::Malformed);
    }
    match flag {
        0 => Ok(message),
        1 => Err(FrameError::Compressed),
        _ => Err(FrameError::Malformed),
    }
}

/// A unary call's message framed for the response body.
pub fn framed(message: &[u8]) -> bytes::Bytes {
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    framed.extend_from_slice(message);
    framed.into()
}

/// `grpc-message`: percent-encoded as gRPC asks (every byte outside printable ASCII, and `%`).
pub fn message_field(message: &str) -> String {
    let mut field = String::with_capacity(message.len());
    for byte in message.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            field.push(char::from(byte));
        } else {
            field.push_str(&format!("%{byte:02X}"));
        }
    }
    field
}

/// `grpc-status-details-bin`: a `google.rpc.Status` with `code` and `message` and, when a
/// wait is given, a `google.rpc.RetryInfo` holding it; base64 as gRPC's binary headers are.
pub fn status_details(code: Code, message: &str, retry_delay: Option<f64>) -> String {
    let mut status = Vec::with_capacity(96);
    varint_field(&mut status, 1, code as u64);
    bytes_field(&mut status, 2, message.as_bytes());
    if let Some(wait) = retry_delay {
        let wait = if wait.is_finite() { wait.max(0.0) } else { 0.0 };
        let seconds = wait.trunc();
        let nanos = ((wait - seconds) * 1e9).round().min(999_999_999.0);
        let mut duration = Vec::with_capacity(16);
        if seconds > 0.0 {
            varint_field(&mut duration, 1, seconds.min(i64::MAX as f64) as u64);
        }
        if nanos > 0.0 {
            varint_field(&mut duration, 2, nanos as u64);
        }
        let mut retry_info = Vec::with_capacity(20);
        bytes_field(&mut retry_info, 1, &duration);
        let mut any = Vec::with_capacity(64);
        bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
        bytes_field(&mut any, 2, &retry_info);
        bytes_field(&mut status, 3, &any);
    }
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(status)
}

/// Protocol Buffers' wire format, the two kinds of field a `google.rpc.Status` needs.
fn varint_field(out: &mut Vec<u8>, number: u32, value: u64) {
    varint(out, u64::from(number) << 3);
    varint(out, value);
}

fn bytes_field(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    varint(out, (u64::from(number) << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_content_types_are_told_from_lookalikes() {
        for grpc in [
            &b"application/grpc"[..],
            b"application/grpc+proto",
            b"application/grpc;charset=utf-8",
            b"Application/GRPC",
        ] {
            assert!(is_grpc(grpc), "{grpc:?}");
        }
        for other in [
            &b"application/grpc-web"[..],
            b"application/grpcx",
            b"application/json",
            b"application/grp",
            b"",
        ] {
            assert!(!is_grpc(other), "{other:?}");
        }
    }

    #[test]
    fn refusals_map_to_the_codes_grpc_clients_act_on() {
        assert_eq!(
            Code::for_status(StatusCode::TOO_MANY_REQUESTS),
            Code::ResourceExhausted
        );
        assert_eq!(
            Code::for_status(StatusCode::UNAUTHORIZED),
            Code::Unauthenticated
        );
        for client_error in [400, 404, 405, 413, 431] {
            let status = StatusCode::from_u16(client_error).unwrap();
            assert_eq!(Code::for_status(status), Code::InvalidArgument, "{status}");
        }
        for failure in [502, 503, 504] {
            let status = StatusCode::from_u16(failure).unwrap();
            assert_eq!(Code::for_status(status), Code::Unavailable, "{status}");
        }
    }

    #[test]
    fn messages_are_percent_encoded_outside_printable_ascii() {
        assert_eq!(message_field("limited"), "limited");
        assert_eq!(message_field("100% über\n"), "100%25 %C3%BCber%0A");
    }

    #[test]
    fn status_details_spell_a_status_with_its_retry_info() {
        let encoded = status_details(Code::ResourceExhausted, "limited", Some(2.5));
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(encoded)
            .unwrap();
        // code 8, message "limited", then one detail: an Any of a RetryInfo of 2.5 s.
        let mut expected = vec![0x08, 8, 0x12, 7];
        expected.extend_from_slice(b"limited");
        let type_url = b"type.googleapis.com/google.rpc.RetryInfo";
        // Duration { seconds: 2, nanos: 500_000_000 } = 08 02 10 80 ca b5 ee 01.
        let duration = [0x08, 0x02, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let retry_info_length = 2 + duration.len();
        let any_length = 2 + type_url.len() + 2 + retry_info_length;
        expected.extend_from_slice(&[0x1a, any_length as u8, 0x0a, type_url.len() as u8]);
        expected.extend_from_slice(type_url);
        expected.extend_from_slice(&[0x12, retry_info_length as u8, 0x0a, duration.len() as u8]);
        expected.extend_from_slice(&duration);
        assert_eq!(bytes, expected);
        // Without a wait: the code and message alone.
        let bare = status_details(Code::Unauthenticated, "", None);
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(bare)
            .unwrap();
        assert_eq!(bytes, [0x08, 16, 0x12, 0]);
    }
}
