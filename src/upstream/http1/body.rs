//! Response bodies from an upstream: decoded by their framing as the bytes arrive, and read
//! from the connection as the client takes them.

use crate::upstream::Owner;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body::{Frame, SizeHint};

use super::{Connection, IdleConnections, COPY_AT_MOST, MAX_LINE_BYTES};
use crate::body::BoxError;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Takes a body out of the bytes read from the connection, as far as they go.
#[derive(Debug)]
pub(super) struct Decoder {
    pub(super) state: DecodeState,
    /// A chunked body's trailer fields, as they are read.
    trailers: Option<Box<HeaderMap>>,
}

/// A response with more trailer fields than this is refused.
const MAX_TRAILER_FIELDS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecodeState {
    Remaining(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd,
    Trailers,
    UntilClose,
    Done,
}

/// What decoding the buffered bytes gave.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    Data(Bytes),
    /// A chunked body's trailer fields, after its last chunk.
    Trailers(Box<HeaderMap>),
    NeedMore,
    Done,
}

impl Decoder {
    pub(super) fn new(framing: Framing) -> Decoder {
        let state = match framing {
            Framing::Empty => DecodeState::Done,
            Framing::Length(length) => DecodeState::Remaining(length),
            Framing::Chunked => DecodeState::ChunkSize,
            Framing::UntilClose => DecodeState::UntilClose,
        };
        Decoder {
            state,
            trailers: None,
        }
    }

    pub(super) fn is_done(&self) -> bool {
        matches!(self.state, DecodeState::Done | DecodeState::Remaining(0))
    }

    pub(super) fn remaining(&self) -> Option<u64> {
        match self.state {
            DecodeState::Remaining(remaining) => Some(remaining),
            DecodeState::Done => Some(0),
            _ => None,
        }
    }

    pub(super) fn decode(&mut self, buffer: &mut BytesMut) -> Result<Step, &'static str> {
        loop {
            match self.state {
                DecodeState::Done | DecodeState::Remaining(0) => {
                    self.state = DecodeState::Done;
                    return Ok(Step::Done);
                }
                DecodeState::ChunkData(0) => self.state = DecodeState::ChunkEnd,
                DecodeState::Remaining(_) | DecodeState::ChunkData(_) if buffer.is_empty() => {
                    return Ok(Step::NeedMore)
                }
                DecodeState::Remaining(remaining) => {
                    let length = remaining.min(buffer.len() as u64);
                    self.state = DecodeState::Remaining(remaining - length);
                    return Ok(Step::Data(take(buffer, length as usize)));
                }
                DecodeState::ChunkData(remaining) => {
                    let length = remaining.min(buffer.len() as u64);
                    self.state = DecodeState::ChunkData(remaining - length);
                    return Ok(Step::Data(take(buffer, length as usize)));
                }
                DecodeState::UntilClose if buffer.is_empty() => return Ok(Step::NeedMore),
                DecodeState::UntilClose => {
                    let length = buffer.len();
                    return Ok(Step::Data(take(buffer, length)));
                }
                DecodeState::ChunkSize => match httparse::parse_chunk_size(buffer) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        buffer.advance(used);
                        self.state = if size == 0 {
                            DecodeState::Trailers
                        } else {
                            DecodeState::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buffer.len() <= MAX_LINE_BYTES => {
                        return Ok(Step::NeedMore)
                    }
                    _ => return Err("invalid chunk size line in the response"),
                },
                DecodeState::ChunkEnd => {
                    if buffer.len() < 2 {
                        return Ok(Step::NeedMore);
                    }
                    if &buffer[..2] != b"\r\n" {
                        return Err("a response chunk does not end with CRLF");
                    }
                    buffer.advance(2);
                    self.state = DecodeState::ChunkSize;
                }
                DecodeState::Trailers => {
                    // Trailer fields are kept (a settled cost may be one); an empty line ends
                    // the body. A line that is no field is dropped, as a field hyper drops.
                    match buffer.windows(2).position(|pair| pair == b"\r\n") {
                        Some(0) => {
                            buffer.advance(2);
                            self.state = DecodeState::Done;
                            if let Some(trailers) = self.trailers.take() {
                                return Ok(Step::Trailers(trailers));
                            }
                        }
                        Some(end) => {
                            let line = buffer.split_to(end + 2);
                            self.trailer_field(&line[..end])?;
                        }
                        None if buffer.len() <= MAX_LINE_BYTES => return Ok(Step::NeedMore),
                        None => return Err("response trailer field too long"),
                    }
                }
            }
        }
    }

    /// One `name: value` line of the trailers.
    fn trailer_field(&mut self, line: &[u8]) -> Result<(), &'static str> {
        let Some(colon) = memchr::memchr(b':', line) else {
            return Ok(());
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            return Ok(());
        };
        let trailers = self.trailers.get_or_insert_with(Default::default);
        if trailers.len() >= MAX_TRAILER_FIELDS {
            return Err("too many response trailer fields");
        }
        trailers.append(name, value);
        Ok(())
    }

    /// The connection reached its end: the end of the body only for a close-delimited one.
    pub(super) fn at_end_of_stream(&mut self) -> Result<Step, &'static str> {
        match self.state {
            DecodeState::UntilClose | DecodeState::Done => {
                self.state = DecodeState::Done;
                Ok(Step::Done)
            }
            _ => Err("the upstream closed the connection before the end of the body"),
        }
    }
}

pub(super) fn take(buffer: &mut BytesMut, length: usize) -> Bytes {
    if length <= COPY_AT_MOST {
        let piece = Bytes::copy_from_slice(&buffer[..length]);
        buffer.advance(length);
        piece
    } else {
        buffer.split_to(length).freeze()
    }
}

/// A response body read from the connection as the client takes it; a body read to its end
/// returns the connection to the pool, one dropped half-way closes it.
pub(super) struct StreamingBody {
    pub(super) connection: Option<Connection>,
    pub(super) decoder: Decoder,
    pub(super) keep_alive: bool,
    pub(super) idle: Arc<IdleConnections>,
    pub(super) owner: Owner,
}

impl StreamingBody {
    fn finish(&mut self) {
        if let Some(connection) = self.connection.take() {
            if self.keep_alive && connection.buffer.is_empty() {
                self.idle.checkin(connection, self.owner);
            }
        }
    }
}

impl http_body::Body for StreamingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            let Some(connection) = this.connection.as_mut() else {
                return Poll::Ready(None);
            };
            let step = match this.decoder.decode(&mut connection.buffer) {
                Ok(Step::NeedMore) => match ready!(connection.poll_read_more(cx)) {
                    Ok(0) => this.decoder.at_end_of_stream(),
                    Ok(_) => continue,
                    Err(error) => {
                        this.connection = None;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                },
                step => step,
            };
            return match step {
                Ok(Step::Data(data)) => {
                    if this.decoder.is_done() {
                        // Handing the connection back now: the server may not ask again
                        // once the announced length has gone out.
                        this.finish();
                    }
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Ok(Step::Trailers(trailers)) => {
                    this.finish();
                    Poll::Ready(Some(Ok(Frame::trailers(*trailers))))
                }
                Ok(Step::Done) => {
                    this.finish();
                    Poll::Ready(None)
                }
                Ok(Step::NeedMore) => continue,
                Err(error) => {
                    this.connection = None;
                    Poll::Ready(Some(Err(error.into())))
                }
            };
        }
    }

    fn is_end_stream(&self) -> bool {
        self.connection.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    fn decode_all(framing: Framing, input: &[u8]) -> Result<(Vec<u8>, bool), &'static str> {
        let mut decoder = Decoder::new(framing);
        let mut buffer = BytesMut::from(input);
        let mut body = Vec::new();
        loop {
            match decoder.decode(&mut buffer)? {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::Trailers(_) => {}
                Step::NeedMore => return Ok((body, false)),
                Step::Done => return Ok((body, true)),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let input = b"4;name=value\r\nWiki\r\n5\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: never\r\n\r\nNEXT";
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buffer = BytesMut::from(&input[..]);
        let mut body = Vec::new();
        let trailers = loop {
            match decoder.decode(&mut buffer).unwrap() {
                Step::Data(data) => body.extend_from_slice(&data),
                Step::Trailers(trailers) => break trailers,
                other => panic!("no trailers: {other:?}"),
            }
        };
        assert_eq!(body, b"Wikipedia in\r\n\r\nchunks.");
        assert_eq!(trailers.get("expires").unwrap(), "never");
        assert_eq!(decoder.decode(&mut buffer), Ok(Step::Done));
        assert_eq!(
            &buffer[..],
            b"NEXT",
            "the next response stays in the buffer"
        );
    }

    #[test]
    fn chunked_bodies_decode_byte_by_byte() {
        let input = b"3\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n";
        let mut decoder = Decoder::new(Framing::Chunked);
        let mut buffer = BytesMut::new();
        let mut body = Vec::new();
        let mut done = false;
        for byte in input {
            buffer.put_u8(*byte);
            loop {
                match decoder.decode(&mut buffer).unwrap() {
                    Step::Data(data) => body.extend_from_slice(&data),
                    Step::Trailers(_) => {}
                    Step::NeedMore => break,
                    Step::Done => {
                        done = true;
                        break;
                    }
                }
            }
        }
        assert!(done);
        assert_eq!(body, b"abc0123456789abcdef");
    }

    #[test]
    fn malformed_chunks_are_errors() {
        assert!(decode_all(Framing::Chunked, b"zz\r\nab\r\n").is_err());
        assert!(decode_all(Framing::Chunked, b"2\r\nabXX0\r\n\r\n").is_err());
        assert!(decode_all(Framing::Chunked, &[b'1'; 20]).is_err());
        let long_line = [b"0\r\nx: ".as_slice(), &[b'y'; MAX_LINE_BYTES + 10]].concat();
        assert!(decode_all(Framing::Chunked, &long_line).is_err());
    }

    #[test]
    fn length_bodies_stop_at_their_length() {
        assert_eq!(
            decode_all(Framing::Length(5), b"helloHTTP/1.1").unwrap(),
            (b"hello".to_vec(), true)
        );
        assert_eq!(
            decode_all(Framing::Length(10), b"hello").unwrap(),
            (b"hello".to_vec(), false)
        );
        let mut decoder = Decoder::new(Framing::Length(10));
        assert!(
            decoder.at_end_of_stream().is_err(),
            "a short body is an error"
        );
        let mut decoder = Decoder::new(Framing::UntilClose);
        assert_eq!(decoder.at_end_of_stream(), Ok(Step::Done));
    }
}
