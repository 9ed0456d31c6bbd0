//! Header names a connection has seen. A peer sends the same names, spelled the same, in
//! every message: a name found here is neither validated, lower-cased nor allocated again
//! (every name that is not one of `http`'s standard ones costs an allocation, and a standard
//! one a search of their table).

use http::HeaderName;

/// Names kept per connection at most.
const KNOWN_NAMES: usize = 16;
/// Longer names are not kept: a client could otherwise make each connection hold 16 names as
/// long as a head may be, for the connection's life. Real names are far shorter.
const KEEP_NAMES_UP_TO: usize = 64;

/// The names one connection's messages used, up to `KNOWN_NAMES`, each with its spelling on
/// the wire. On the heap (one allocation per connection): a pooled upstream connection is
/// moved several times per request, and would otherwise carry 16 names inline with it.
#[derive(Debug, Default)]
pub(crate) struct KnownNames(Vec<(Box<[u8]>, HeaderName)>);

impl KnownNames {
    /// The name spelled `spelled`, or `None` if it is not a valid header name.
    pub(crate) fn name(&mut self, spelled: &[u8]) -> Option<HeaderName> {
        // Compared as spelled, not ignoring case: one comparison of bytes, and the lengths
        // tell most names apart before that.
        if let Some((_, name)) = self.0.iter().find(|(known, _)| **known == *spelled) {
            return Some(name.clone());
        }
        let name = HeaderName::from_bytes(spelled).ok()?;
        if self.0.len() < KNOWN_NAMES && spelled.len() <= KEEP_NAMES_UP_TO {
            self.0.push((spelled.into(), name.clone()));
        }
        Some(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_a_connection_used_before_are_reused_as_spelled() {
        let mut names = KnownNames::default();
        let first = names.name(b"X-User-Id").unwrap();
        assert_eq!(first.as_str(), "x-user-id");
        let again = names.name(b"X-User-Id").unwrap();
        assert_eq!(again, first);
        assert_eq!(
            again.as_str().as_ptr(),
            first.as_str().as_ptr(),
            "the kept name, not a new one"
        );
        assert_eq!(names.0.len(), 1);
        let other_case = names.name(b"x-USER-id").unwrap();
        assert_eq!(other_case, first, "the same name, spelled otherwise");
        assert_eq!(names.0.len(), 2);
        assert!(names.name(b"bad name").is_none());
        let long = "x".repeat(KEEP_NAMES_UP_TO + 1);
        assert_eq!(names.name(long.as_bytes()).unwrap().as_str(), long);
        assert_eq!(names.0.len(), 2, "a long name is not kept");
        assert!(names.name(b"x-user-i").is_some_and(|name| name != first));
        for index in 0..2 * KNOWN_NAMES {
            let name = format!("x-{index}");
            assert_eq!(names.name(name.as_bytes()).unwrap().as_str(), name);
        }
        assert_eq!(names.0.len(), KNOWN_NAMES, "no more than that are kept");
    }
}
