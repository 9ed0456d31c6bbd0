use bytes::Bytes;
use http::{HeaderMap, HeaderValue};

use super::*;

fn json(path: &str) -> Measuring {
    Measuring::of(&Measure::Field(Field::Json(path.to_owned())))
}

fn header(name: &'static str) -> Measuring {
    Measuring::of(&Measure::Field(Field::Header(HeaderName::from_static(
        name,
    ))))
}

fn head(fields: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut head = HeaderMap::new();
    for (name, value) in fields {
        head.append(*name, HeaderValue::from_static(value));
    }
    head
}

/// The reading of one measure over a body sent in `frames`, ended whole.
fn read(measure: Measuring, head: &HeaderMap, frames: &[&[u8]], limit: usize) -> Reading {
    let mut meter = Meter::new(&[measure], head, limit);
    for frame in frames {
        meter.data(&Bytes::copy_from_slice(frame));
    }
    meter.end();
    meter.reading(0, 0.0)
}

#[test]
fn a_json_body_settles_by_its_field_in_one_frame_or_many() {
    let body = br#"{"id":"x","choices":[{"text":"usage"}],"usage":{"prompt_tokens":9,"total_tokens":153}}"#;
    let none = HeaderMap::new();
    assert_eq!(
        read(json("usage.total_tokens"), &none, &[body], 1 << 16),
        Reading::Number(153.0)
    );
    let pieces: Vec<&[u8]> = body.chunks(7).collect();
    assert_eq!(
        read(json("usage.total_tokens"), &none, &pieces, 1 << 16),
        Reading::Number(153.0)
    );
    assert_eq!(
        read(json("usage.missing"), &none, &[body], 1 << 16),
        Reading::Absent
    );
}

#[test]
fn what_a_json_body_cannot_settle_reads_as_invalid_or_absent() {
    let none = HeaderMap::new();
    let cases: [(&[u8], Reading); 11] = [
        (br#"{"n":"153"}"#, Reading::Invalid),
        (br#"{"n":-1}"#, Reading::Invalid),
        (br#"{"n":1e300}"#, Reading::Invalid),
        (br#"{"n":1e400}"#, Reading::Invalid),
        (br#"{"n":NaN}"#, Reading::Invalid),
        (br#"{"n":{"m":1}}"#, Reading::Invalid),
        (br#"{"n":[1]}"#, Reading::Invalid),
        (br#"{"n":1,"n":2}"#, Reading::Invalid),
        (br#"{"n":1} trailing"#, Reading::Invalid),
        (br#"[{"n":1}]"#, Reading::Absent),
        (br#"{"n":null}"#, Reading::Absent),
    ];
    for (body, expected) in cases {
        assert_eq!(
            read(json("n"), &none, &[body], 1 << 16),
            expected,
            "{}",
            String::from_utf8_lossy(body)
        );
    }
    assert_eq!(
        read(json("n"), &none, &[b"{\"n\":1.5}"], 1 << 16),
        Reading::Number(1.5)
    );
    // Larger than what is kept: unknown, never buffered further.
    assert_eq!(
        read(
            json("n"),
            &none,
            &[b"{\"n\":1,", b"\"pad\":\"xxxxxxxxxx\"}"],
            16
        ),
        Reading::Invalid
    );
    // Cut short: the reservation stands.
    let mut meter = Meter::new(&[json("n")], &none, 1 << 16);
    meter.data(&Bytes::from_static(b"{\"n\":1}"));
    assert_eq!(meter.reading(0, 0.0), Reading::Absent);
}

#[test]
fn an_event_stream_settles_by_the_last_event_that_carries_the_field() {
    let head = head(&[("content-type", "text/event-stream; charset=utf-8")]);
    let stream = concat!(
        ": comment\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"usage\"}}],\"usage\":null}\n\n",
        "event: message\r\ndata: {\"usage\":{\"total_tokens\":7}}\r\n\r\n",
        "data: {\"usage\":\n",
        "data: {\"total_tokens\":42}}\n\n",
        "data: [DONE]\n\n",
    )
    .as_bytes();
    for size in [1, 3, 17, stream.len()] {
        let pieces: Vec<&[u8]> = stream.chunks(size).collect();
        assert_eq!(
            read(json("usage.total_tokens"), &head, &pieces, 1 << 16),
            Reading::Number(42.0),
            "frames of {size}"
        );
    }
    // An event that names the field only as null, parseable or not, carries nothing; one
    // that also names it otherwise is parsed (here: named twice, so unknown).
    let after = concat!(
        "data: {\"usage\":{\"total_tokens\":42}}\n\n",
        "data: {\"usage\" :\tnull}\n\n",
        "data: {\"usage\":null,\"broken\n\n",
    );
    assert_eq!(
        read(
            json("usage.total_tokens"),
            &head,
            &[after.as_bytes()],
            1 << 16
        ),
        Reading::Number(42.0)
    );
    let twice = b"data: {\"usage\":null,\"usage\":{\"total_tokens\":3}}\n\n";
    assert_eq!(
        read(json("usage.total_tokens"), &head, &[twice], 1 << 16),
        Reading::Invalid
    );
    // An unfinished last event does not count.
    let cut = b"data: {\"usage\":{\"total_tokens\":7}}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n";
    assert_eq!(
        read(json("usage.total_tokens"), &head, &[cut], 1 << 16),
        Reading::Number(7.0)
    );
}

#[test]
fn an_event_stream_keeps_one_event_at_most_and_never_the_stream() {
    let head = head(&[("content-type", "text/event-stream")]);
    let mut scanner_meter = Meter::new(&[json("usage.total_tokens")], &head, 256);
    let event = Bytes::from(format!("data: {{\"text\":\"{}\"}}\n\n", "x".repeat(100)));
    for _ in 0..100_000 {
        scanner_meter.data(&event);
    }
    let Some(BodyScan::Events(scanner)) = scanner_meter.body.scan() else {
        panic!("not read as events");
    };
    assert!(scanner.held() <= 512, "holds {} bytes", scanner.held());
    scanner_meter.end();
    assert_eq!(scanner_meter.reading(0, 0.0), Reading::Absent);
    // An event larger than the limit, carrying the field or not, is unknown; a later one
    // that fits settles.
    let big = format!(
        "data: {{\"usage\":{{\"total_tokens\":5}},\"p\":\"{}\"}}\n\n",
        "y".repeat(300)
    );
    assert_eq!(
        read(json("usage.total_tokens"), &head, &[big.as_bytes()], 256),
        Reading::Invalid
    );
    let later = format!("{big}data: {{\"usage\":{{\"total_tokens\":5}}}}\n\n");
    assert_eq!(
        read(json("usage.total_tokens"), &head, &[later.as_bytes()], 256),
        Reading::Number(5.0)
    );
    // One endless line.
    let mut meter = Meter::new(&[json("usage.total_tokens")], &head, 256);
    for _ in 0..1000 {
        meter.data(&Bytes::from_static(
            b"data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        ));
    }
    let Some(BodyScan::Events(scanner)) = meter.body.scan() else {
        panic!("not read as events");
    };
    assert!(scanner.held() <= 512, "holds {} bytes", scanner.held());
}

#[test]
fn a_header_or_trailer_settles_once_and_twice_is_invalid() {
    let measure = || vec![header("x-tokens")];
    let meter = Meter::new(&measure(), &head(&[("x-tokens", " 12 ")]), 0);
    assert_eq!(meter.reading(0, 0.0), Reading::Number(12.0));
    let mut meter = Meter::new(&measure(), &HeaderMap::new(), 0);
    assert_eq!(meter.reading(0, 0.0), Reading::Absent);
    meter.trailers(&head(&[("x-tokens", "7.5")]));
    assert_eq!(meter.reading(0, 0.0), Reading::Number(7.5));
    meter.trailers(&head(&[("x-tokens", "7.5")]));
    assert_eq!(meter.reading(0, 0.0), Reading::Invalid, "head and trailer");
    let meter = Meter::new(
        &measure(),
        &head(&[("x-tokens", "1"), ("x-tokens", "2")]),
        0,
    );
    assert_eq!(meter.reading(0, 0.0), Reading::Invalid);
    for text in ["-1", "+1", "inf", "NaN", "1e400", "0x10", "12 tokens", ""] {
        assert_eq!(parse_number(text.as_bytes()), Reading::Invalid, "{text:?}");
    }
    assert_eq!(parse_number(b"1e3"), Reading::Number(1000.0));
}

#[test]
fn bytes_and_time_are_measured_as_they_pass() {
    let mut meter = Meter::new(
        &[Measuring::ResponseBytes, Measuring::UpstreamMs],
        &HeaderMap::new(),
        0,
    );
    meter.data(&Bytes::from_static(b"hello"));
    meter.data(&Bytes::from_static(b" world"));
    assert_eq!(meter.reading(0, 0.0), Reading::Number(11.0));
    assert_eq!(meter.reading(1, 250.5), Reading::Number(250.5));
    assert_eq!(meter.bytes(), 11);
}

fn compressed(bytes: &[u8], gzip: bool) -> Vec<u8> {
    use std::io::Write as _;
    if gzip {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    } else {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }
}

#[test]
fn a_compressed_body_is_read_inflated_and_an_unknown_coding_is_unreadable() {
    let body = format!(
        r#"{{"pad":"{}","usage":{{"total_tokens":77}}}}"#,
        "z".repeat(5000)
    );
    let events = "data: {\"usage\":null}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n";
    for (coding, gzip) in [("gzip", true), ("deflate", false)] {
        let packed = compressed(body.as_bytes(), gzip);
        let pieces: Vec<&[u8]> = packed.chunks(13).collect();
        let coded = head(&[("content-encoding", coding)]);
        assert_eq!(
            read(json("usage.total_tokens"), &coded, &pieces, 1 << 16),
            Reading::Number(77.0),
            "{coding}"
        );
        // What it inflates to counts against the limit, not what it is compressed to.
        assert_eq!(
            read(json("usage.total_tokens"), &coded, &pieces, 1024),
            Reading::Invalid,
            "{coding}: 5 KiB inflated"
        );
        let streamed = head(&[
            ("content-encoding", coding),
            ("content-type", "text/event-stream"),
        ]);
        let packed = compressed(events.as_bytes(), gzip);
        assert_eq!(
            read(json("usage.total_tokens"), &streamed, &[&packed], 1 << 16),
            Reading::Number(9.0),
            "{coding} events"
        );
    }
    let broken = head(&[("content-encoding", "gzip")]);
    assert_eq!(
        read(
            json("usage.total_tokens"),
            &broken,
            &[b"{\"usage\":1}"],
            1 << 16
        ),
        Reading::Invalid,
        "not gzip at all"
    );
    let brotli = head(&[("content-encoding", "br")]);
    assert_eq!(
        read(
            json("usage.total_tokens"),
            &brotli,
            &[body.as_bytes()],
            1 << 16
        ),
        Reading::Invalid
    );
    // A bomb: 8 MiB of zeros in a few KiB never grows the kept body past the limit.
    let bomb = compressed(&vec![b'0'; 8 << 20], true);
    let mut meter = Meter::new(
        &[json("n")],
        &head(&[("content-encoding", "gzip")]),
        1 << 16,
    );
    meter.data(&Bytes::from(bomb));
    meter.end();
    assert_eq!(meter.reading(0, 0.0), Reading::Invalid);
}
