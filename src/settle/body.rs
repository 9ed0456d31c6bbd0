//! A response body as its JSON fields are read: a JSON document kept until it ends, or an
//! event stream read event by event; inflated first when the upstream compressed it (gzip or
//! deflate), for reading only.

use std::io::Write;

use bytes::Bytes;
use flate2::write::{GzDecoder, ZlibDecoder};
use http::header::CONTENT_ENCODING;
use http::HeaderMap;

use super::json::{number_at, JsonPath};
use super::sse::EventScanner;
use super::Reading;

/// What of a body is kept for its JSON fields.
#[derive(Debug)]
pub(super) enum BodyScan {
    /// Nothing reads the body.
    None,
    /// A JSON body, kept until it ends (by reference to its frames when they come as they
    /// are), at most `limit` bytes.
    Json {
        /// Most bodies come in a frame or two.
        frames: smallvec::SmallVec<[Bytes; 2]>,
        length: usize,
        limit: usize,
        /// It grew past the most that is kept: its fields read as invalid.
        overflowed: bool,
    },
    /// An event stream: each event is read as it completes.
    Events(Box<EventScanner>),
}

impl BodyScan {
    pub(super) fn json(limit: usize) -> BodyScan {
        BodyScan::Json {
            frames: smallvec::SmallVec::new(),
            length: 0,
            limit,
            overflowed: false,
        }
    }

    /// The body's next bytes, kept by reference where they are kept whole.
    fn feed(&mut self, data: &Bytes) {
        match self {
            BodyScan::None => {}
            BodyScan::Json { .. } => self.keep(data.len(), || data.clone()),
            BodyScan::Events(scanner) => scanner.feed(data),
        }
    }

    /// Keeps `length` more bytes of a JSON body, unless that makes it too long.
    fn keep(&mut self, more: usize, bytes: impl FnOnce() -> Bytes) {
        let BodyScan::Json {
            frames,
            length,
            limit,
            overflowed,
        } = self
        else {
            return;
        };
        if *overflowed || more == 0 {
            return;
        }
        *length += more;
        if *length > *limit {
            *overflowed = true;
            *frames = smallvec::SmallVec::new();
        } else {
            frames.push(bytes());
        }
    }

    fn reading(&self, index: usize, path: &JsonPath, ended: bool) -> Reading {
        match self {
            BodyScan::Events(scanner) => scanner.reading(index),
            BodyScan::Json { .. } if !ended => Reading::Absent,
            BodyScan::Json {
                overflowed: true, ..
            } => Reading::Invalid,
            BodyScan::Json { frames, .. } => number_at(frames, path),
            BodyScan::None => Reading::Absent,
        }
    }
}

/// Inflated bytes go straight to the scan, as the inflater writes them.
impl Write for BodyScan {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            BodyScan::None => {}
            BodyScan::Json { .. } => {
                self.keep(buf.len(), || Bytes::copy_from_slice(buf));
                // Past the limit, inflating more (a bomb, say) is work for nothing.
                if matches!(
                    self,
                    BodyScan::Json {
                        overflowed: true,
                        ..
                    }
                ) {
                    return Err(std::io::ErrorKind::FileTooLarge.into());
                }
            }
            BodyScan::Events(scanner) => scanner.feed(buf),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A body scan behind the body's `Content-Encoding`.
#[derive(Debug)]
pub(super) enum Coded {
    Identity(BodyScan),
    Gzip(Box<GzDecoder<BodyScan>>),
    Deflate(Box<ZlibDecoder<BodyScan>>),
    /// An encoding that is not read (br, zstd, several), or a body that did not inflate.
    Unreadable,
}

impl Coded {
    pub(super) fn new(scan: BodyScan, head: &HeaderMap) -> Coded {
        if matches!(scan, BodyScan::None) {
            return Coded::Identity(scan);
        }
        let mut codings = head.get_all(CONTENT_ENCODING).iter();
        let coding = match (codings.next(), codings.next()) {
            (None, _) => return Coded::Identity(scan),
            (Some(coding), None) => coding.to_str().unwrap_or_default().trim(),
            _ => return Coded::Unreadable,
        };
        match coding.to_ascii_lowercase().as_str() {
            "" | "identity" => Coded::Identity(scan),
            "gzip" | "x-gzip" => Coded::Gzip(Box::new(GzDecoder::new(scan))),
            "deflate" => Coded::Deflate(Box::new(ZlibDecoder::new(scan))),
            _ => Coded::Unreadable,
        }
    }

    pub(super) fn data(&mut self, data: &Bytes) {
        let inflated = match self {
            Coded::Identity(scan) => {
                scan.feed(data);
                return;
            }
            Coded::Gzip(decoder) => decoder.write_all(data),
            Coded::Deflate(decoder) => decoder.write_all(data),
            Coded::Unreadable => return,
        };
        if inflated.is_err() {
            *self = Coded::Unreadable;
        }
    }

    pub(super) fn end(&mut self) {
        let finished = match self {
            Coded::Gzip(decoder) => decoder.try_finish(),
            Coded::Deflate(decoder) => decoder.try_finish(),
            Coded::Identity(_) | Coded::Unreadable => Ok(()),
        };
        if finished.is_err() {
            *self = Coded::Unreadable;
        }
    }

    pub(super) fn reading(&self, index: usize, path: &JsonPath, ended: bool) -> Reading {
        match self {
            Coded::Identity(scan) => scan.reading(index, path, ended),
            Coded::Gzip(decoder) => decoder.get_ref().reading(index, path, ended),
            Coded::Deflate(decoder) => decoder.get_ref().reading(index, path, ended),
            Coded::Unreadable if ended => Reading::Invalid,
            Coded::Unreadable => Reading::Absent,
        }
    }

    /// The scan, when the body is read at all (tests look into it).
    #[cfg(test)]
    pub(super) fn scan(&self) -> Option<&BodyScan> {
        match self {
            Coded::Identity(scan) => Some(scan),
            Coded::Gzip(decoder) => Some(decoder.get_ref()),
            Coded::Deflate(decoder) => Some(decoder.get_ref()),
            Coded::Unreadable => None,
        }
    }
}
