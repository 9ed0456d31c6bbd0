use super::*;

/// A ClientHello message with these cipher suites and extensions, in this order.
fn hello(ciphers: &[u16], extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(32);
    body.extend([9u8; 32]);
    body.extend(u16::try_from(ciphers.len() * 2).unwrap().to_be_bytes());
    for cipher in ciphers {
        body.extend(cipher.to_be_bytes());
    }
    body.extend([1, 0]);
    let mut listed = Vec::new();
    for (kind, data) in extensions {
        listed.extend(kind.to_be_bytes());
        listed.extend(u16::try_from(data.len()).unwrap().to_be_bytes());
        listed.extend(data);
    }
    body.extend(u16::try_from(listed.len()).unwrap().to_be_bytes());
    body.extend(listed);
    body
}

/// The message behind a handshake header, cut into records of at most `record` bytes.
fn records(message: &[u8], record: usize) -> Vec<u8> {
    let mut handshake = vec![CLIENT_HELLO];
    handshake.extend(&u32::try_from(message.len()).unwrap().to_be_bytes()[1..]);
    handshake.extend(message);
    let mut bytes = Vec::new();
    for chunk in handshake.chunks(record) {
        bytes.extend([HANDSHAKE_RECORD, 0x03, 0x01]);
        bytes.extend(u16::try_from(chunk.len()).unwrap().to_be_bytes());
        bytes.extend(chunk);
    }
    bytes
}

fn u16s(values: &[u16], length_bytes: usize) -> Vec<u8> {
    let mut data = Vec::new();
    let length = values.len() * 2;
    data.extend(&u16::try_from(length).unwrap().to_be_bytes()[2 - length_bytes..]);
    for value in values {
        data.extend(value.to_be_bytes());
    }
    data
}

fn sni(host: &str) -> Vec<u8> {
    let mut entry = vec![0];
    entry.extend(u16::try_from(host.len()).unwrap().to_be_bytes());
    entry.extend(host.as_bytes());
    let mut data = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
    data.extend(entry);
    data
}

fn alpn(protocols: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for protocol in protocols {
        list.push(u8::try_from(protocol.len()).unwrap());
        list.extend(*protocol);
    }
    let mut data = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    data.extend(list);
    data
}

/// The Chrome hello of FoxIO's JA4 specification (its JA4_r lists these values), with
/// GREASE in the ciphers, extensions, versions and signature algorithms, in wire order.
fn chrome_hello() -> Vec<u8> {
    let ciphers = [
        0x3a3a, 0x1301, 0x1302, 0x1303, 0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0xc013,
        0xc014, 0x009c, 0x009d, 0x002f, 0x0035,
    ];
    let extensions = vec![
        (0x5a5a, vec![]),
        (0x0000, sni("example.com")),
        (0x0017, vec![]),
        (0xff01, vec![0]),
        (0x000a, u16s(&[0x1a1a, 0x001d, 0x0017], 2)),
        (0x000b, vec![1, 0]),
        (0x0023, vec![]),
        (0x0010, alpn(&[b"h2", b"http/1.1"])),
        (0x0005, vec![1, 0, 0, 0, 0]),
        (
            0x000d,
            u16s(
                &[
                    0x0403, 0x0804, 0x0401, 0x0503, 0x0805, 0x0501, 0x0806, 0x0601,
                ],
                2,
            ),
        ),
        (0x0012, vec![]),
        (0x0033, vec![0, 0]),
        (0x002d, vec![1, 1]),
        (0x002b, u16s(&[0x6a6a, 0x0304, 0x0303], 1)),
        (0x001b, vec![2, 0, 2]),
        (0x4469, vec![0, 3, 2, b'h', b'2']),
        (0x0015, vec![0; 8]),
        (0xdada, vec![0]),
    ];
    hello(&ciphers, &extensions)
}

#[test]
fn the_specification_s_chrome_vector() {
    assert_eq!(
        fingerprint(&chrome_hello()).as_deref(),
        Some("t13d1516h2_8daaf6152771_e5627efa2ab1")
    );
}

#[test]
fn a_hello_split_over_records_and_segments_reads_the_same() {
    let message = chrome_hello();
    for record in [16_384, 700, 100, 5, 1] {
        let bytes = records(&message, record);
        assert_eq!(
            reassemble(&bytes),
            Hello::Complete(message.clone()),
            "{record}"
        );
        // Every prefix, as TCP segments could deliver it, asks for more.
        for cut in [0, 1, 4, 5, 6, 9, bytes.len() / 2, bytes.len() - 1] {
            assert_eq!(reassemble(&bytes[..cut]), Hello::Partial, "{record} {cut}");
        }
    }
    // What follows the hello (a second record of the handshake) is not part of it.
    let mut bytes = records(&message, 300);
    bytes.extend([0x14, 0x03, 0x03, 0, 1, 1]);
    assert_eq!(reassemble(&bytes), Hello::Complete(message));
}

#[test]
fn what_is_not_a_readable_hello_has_no_fingerprint() {
    // Plain HTTP, an SSLv2-style hello, an alert, a ServerHello, an empty record.
    for bytes in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        &[0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15][..],
        &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28][..],
        &[0x16, 0x03, 0x03, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00][..],
        &[0x16, 0x03, 0x01, 0x00, 0x00][..],
    ] {
        assert_eq!(reassemble(bytes), Hello::Unreadable, "{bytes:?}");
    }
    // A hello that declares more than anyone sends.
    let oversized = [0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x10, 0x00, 0x00];
    assert_eq!(reassemble(&oversized), Hello::Unreadable);
    // Truncated inside, trailing bytes, an extension named twice: parsed, not fingerprinted.
    let message = chrome_hello();
    assert_eq!(fingerprint(&message[..message.len() - 3]), None);
    let mut trailing = message.clone();
    trailing.push(0);
    assert_eq!(fingerprint(&trailing), None);
    let twice = hello(&[0x1301], &[(0x0017, vec![]), (0x0017, vec![])]);
    assert_eq!(fingerprint(&twice), None);
    let broken_versions = hello(&[0x1301], &[(0x002b, vec![3, 3, 4])]);
    assert_eq!(fingerprint(&broken_versions), None);
}

#[test]
fn the_first_part_counts_and_names() {
    // No SNI, no ALPN, no extensions at all, TLS 1.2 from the legacy version.
    let bare = hello(&[0xc02f, 0x0a0a], &[]);
    // The cipher hash: SHA-256 of "c02f", cut to 12 digits.
    assert_eq!(
        fingerprint(&bare).as_deref(),
        Some("t12i010000_f06271c2b022_000000000000")
    );
    // ALPN ends: printable as they are, high bytes as 9, a control byte makes 99.
    assert_eq!(alpn_ends(Some(b"h2")), "h2");
    assert_eq!(alpn_ends(Some(b"x")), "xx");
    assert_eq!(alpn_ends(Some(&[0xba, 0xad])), "99");
    assert_eq!(alpn_ends(Some(&[b'h', 0x1f])), "99");
    assert_eq!(alpn_ends(Some(&[0xc3, b'a'])), "9a");
    assert_eq!(alpn_ends(Some(b"")), "00");
    assert_eq!(alpn_ends(None), "00");
    // Counts stop at 99.
    let many: Vec<u16> = (1..=150).collect();
    let text = fingerprint(&hello(&many, &[])).unwrap();
    assert!(text.starts_with("t12i9900"), "{text}");
}

proptest::proptest! {
    #[test]
    fn any_bytes_are_read_without_a_panic(bytes: Vec<u8>, cut in 0usize..64) {
        let _ = reassemble(&bytes);
        let _ = fingerprint(&bytes);
        let message = chrome_hello();
        let mut mutated = message.clone();
        for (index, byte) in bytes.iter().enumerate().take(8) {
            let at = (usize::from(*byte) * 31 + index * 97 + cut) % mutated.len();
            mutated[at] ^= byte | 1;
        }
        let _ = fingerprint(&mutated);
        let _ = reassemble(&records(&mutated, cut + 1));
    }
}

#[test]
fn the_server_name_asked_for_is_read_lower_cased() {
    let message = |extensions: &[(u16, Vec<u8>)]| hello(&[0x1301], extensions);
    assert_eq!(
        server_name(&message(&[(0x0000, sni("Shop.Example.com"))])),
        Some("shop.example.com".to_owned())
    );
    assert_eq!(server_name(&message(&[(0x0010, alpn(&[b"h2"]))])), None);
    assert_eq!(
        server_name(&message(&[(0x0000, sni(&"a".repeat(300)))])),
        Some("a".repeat(300)),
        "a name no certificate answers is still the name asked for"
    );
    let mut cut = sni("example.com");
    cut.truncate(cut.len() - 3);
    let cut = message(&[(0x0000, cut)]);
    assert_eq!(server_name(&cut), None);
    assert!(
        fingerprint(&cut).is_some(),
        "the rest of the hello still reads"
    );
}

#[test]
fn an_acme_validation_offers_acme_tls_alone() {
    let message = |protocols: &[&[u8]]| hello(&[0x1301], &[(0x0010, alpn(protocols))]);
    assert!(asks_acme_challenge(&message(&[b"acme-tls/1"])));
    assert!(!asks_acme_challenge(&message(&[b"acme-tls/1", b"h2"])));
    assert!(!asks_acme_challenge(&message(&[b"h2", b"acme-tls/1"])));
    assert!(!asks_acme_challenge(&hello(&[0x1301], &[])));
}
