//! Store keys: how a request's buckets are spelled in Redis, and the Cluster slot each lives in.

use smallvec::SmallVec;

use crate::limit::BucketKey;

/// A request's store keys, `<prefix><limit>:<key>` each, spelled into one string: one
/// allocation per request rather than one per bucket.
#[derive(Debug, Default)]
pub(super) struct StoreKeys {
    text: String,
    /// Where each key ends in `text`.
    ends: SmallVec<[usize; 4]>,
}

impl StoreKeys {
    pub(super) fn new<'k, 'l: 'k>(
        prefix: &str,
        keys: impl ExactSizeIterator<Item = &'k BucketKey<'l>>,
    ) -> StoreKeys {
        let mut text = String::with_capacity(keys.len() * (prefix.len() + 56));
        let ends = keys
            .map(|key| {
                text.push_str(prefix);
                key.push_to(&mut text);
                text.len()
            })
            .collect();
        StoreKeys { text, ends }
    }

    /// Adds a key spelled in full (prefix included).
    pub(super) fn push(&mut self, key: &str) {
        self.text.push_str(key);
        self.ends.push(self.text.len());
    }

    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &str> + Clone {
        (0..self.ends.len()).map(|index| &self[index])
    }
}

impl std::ops::Index<usize> for StoreKeys {
    type Output = str;

    fn index(&self, index: usize) -> &str {
        let start = index.checked_sub(1).map_or(0, |before| self.ends[before]);
        &self.text[start..self.ends[index]]
    }
}

/// Indexes of `keys` grouped by Redis Cluster slot, in first-seen order.
pub(super) fn group_by_slot<'k>(keys: impl IntoIterator<Item = &'k str>) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (index, key) in keys.into_iter().enumerate() {
        let slot = slot(key.as_bytes());
        match groups
            .iter_mut()
            .find(|(group_slot, _)| *group_slot == slot)
        {
            Some((_, members)) => members.push(index),
            None => groups.push((slot, vec![index])),
        }
    }
    groups.into_iter().map(|(_, members)| members).collect()
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of the key, or of its hash tag
/// (`{...}`, the first non-empty one), modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % 16384
}

/// What a Cluster hashes of a key instead of the whole: the text between its first `{` and
/// the next `}`, unless that is empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|byte| *byte == b'{')?;
    let rest = &key[open + 1..];
    let length = rest.iter().position(|byte| *byte == b'}')?;
    (length > 0).then(|| &rest[..length])
}

/// The key of a bucket's ban state: in the bucket's own Cluster slot, so that the call that
/// decides the bucket reads and writes it too. Bucket keys hold a `}` only inside a hash tag
/// of the prefix (`[store] prefix` is checked for it).
pub(super) fn ban_key(key: &str) -> String {
    match hash_tag(key.as_bytes()) {
        Some(_) => format!("{key}|ban"),
        None => format!("{{{key}}}|ban"),
    }
}

/// Whether bucket keys made with `prefix` keep their ban state in their own slot: a `}` in
/// a prefix without a hash tag would end the tag [`ban_key`] makes early.
pub(crate) fn prefix_keeps_ban_keys_in_slot(prefix: &str) -> bool {
    hash_tag(prefix.as_bytes()).is_some() || !prefix.contains('}')
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in data {
        crc ^= u16::from(*byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::KeyPart;

    #[test]
    fn a_requests_store_keys_are_each_prefix_limit_and_key() {
        let key = |limit: &'static str, parts: Vec<KeyPart>| BucketKey {
            limit,
            fingerprint: 7,
            parts: parts.into_iter().collect(),
        };
        let keys = [
            key("everyone", vec![]),
            key(
                "per_network",
                vec![KeyPart::Network("203.0.113.0/24".parse().unwrap())],
            ),
            key(
                "per_user",
                vec![
                    KeyPart::Digest([0xab; 16]),
                    KeyPart::Network("2001:db8::/48".parse().unwrap()),
                ],
            ),
        ];
        let spelled = StoreKeys::new("tg:", keys.iter());
        let expected = [
            "tg:everyone:global".to_owned(),
            "tg:per_network:v4:203.0.113.0/24".to_owned(),
            format!("tg:per_user:h:{}|v6:2001:db8::/48", "ab".repeat(16)),
        ];
        assert_eq!(spelled.iter().collect::<Vec<_>>(), expected);
        for (index, expected) in expected.iter().enumerate() {
            assert_eq!(&spelled[index], expected);
        }
        assert_eq!(StoreKeys::new("tg:", [].iter()).iter().count(), 0);
    }

    #[test]
    fn a_ban_key_lives_in_its_buckets_slot() {
        for key in [
            "tg:everyone:global",
            "tg:per_network:v6:2001:db8::/48",
            "tollgate:login:h:00ff|as:64500",
            "{tg}:per_account:h:ab",
            "t{g:x{y}z:cc:DE",
            "tg{:a",
        ] {
            let ban = ban_key(key);
            assert_eq!(slot(ban.as_bytes()), slot(key.as_bytes()), "{key} / {ban}");
            assert_ne!(ban, key);
        }
        assert_eq!(ban_key("tg:everyone:global"), "{tg:everyone:global}|ban");
        assert_eq!(ban_key("{tg}:a:global"), "{tg}:a:global|ban");
        assert!(prefix_keeps_ban_keys_in_slot("tollgate:"));
        assert!(prefix_keeps_ban_keys_in_slot("{tollgate}:"));
        assert!(prefix_keeps_ban_keys_in_slot("a{b"));
        assert!(!prefix_keeps_ban_keys_in_slot("a}b:"));
        assert!(!prefix_keeps_ban_keys_in_slot("{}tg:"));
    }

    #[test]
    fn slots_match_redis_cluster() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(
            slot(b"foo{}{bar}"),
            slot(b"foo{}{bar}"),
            "empty tag: the whole key"
        );
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"tollgate:{x}:a"), slot(b"x"));
    }

    #[test]
    fn groups_keep_order_within_a_slot() {
        assert_eq!(
            group_by_slot(["{a}1", "{b}1", "{a}2"]),
            vec![vec![0, 2], vec![1]]
        );
    }
}
