//! Lower-case hexadecimal without the formatting machinery: request ids and hashed keys are
//! spelled on every request.

/// `bytes` in lower-case hexadecimal, two digits per byte, into `digits`.
pub(crate) fn write_hex(bytes: &[u8], digits: &mut [u8]) {
    // Both digits of a byte in one look-up.
    const PAIRS: [[u8; 2]; 256] = {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut byte = 0;
        while byte < 256 {
            pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
            byte += 1;
        }
        pairs
    };
    for (pair, byte) in digits.chunks_exact_mut(2).zip(bytes) {
        pair.copy_from_slice(&PAIRS[usize::from(*byte)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_is_spelled_as_two_lower_case_hex_digits() {
        let bytes: Vec<u8> = (0..=255).collect();
        let mut digits = vec![0u8; 512];
        write_hex(&bytes, &mut digits);
        let expected: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(String::from_utf8(digits).unwrap(), expected);
    }
}
