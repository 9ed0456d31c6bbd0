//! What both of the gateway's own HTTP/1.1 paths (the server's and the upstream client's)
//! share about the wire: the rules of a message's fields and framing (`message`), header
//! names and their per-connection cache, reused header maps, the `Date` cache, and the field
//! writer.

pub(crate) mod date;
pub(crate) mod header_maps;
pub(crate) mod header_names;
pub(crate) mod message;

/// One header field, `name: value` and its line end, into an HTTP/1.1 head.
pub(crate) fn write_header_field(out: &mut bytes::BytesMut, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}
