//! Header names seen before: by a client's connections on one thread, or by one upstream
//! connection. Peers send the same names, spelled the same, in every message: a name found
//! here is neither validated, lower-cased nor allocated again (every name that is not one of
//! `http`'s standard ones costs an allocation, and a standard one a search of their table).

use http::HeaderName;

/// Names kept at most.
const KNOWN_NAMES: usize = 16;
/// Longer names are not kept: a client could otherwise make the table hold 16 names as long as
/// a head may be. Real names are far shorter.
const KEEP_NAMES_UP_TO: usize = 64;

/// Names used before, up to `KNOWN_NAMES`, each with its spelling on the wire; once full, a
/// new name takes the place of the one kept longest, so that the table follows the traffic
/// (names a client invents only ever cost what an unknown name costs). On the heap (one
/// allocation per table): a pooled upstream connection is moved several times per request,
/// and would otherwise carry 16 names inline with it.
#[derive(Debug, Default)]
pub(crate) struct KnownNames {
    names: Vec<(Box<[u8]>, HeaderName)>,
    /// Where the next name goes once the table is full.
    next: usize,
}

impl KnownNames {
    /// The name spelled `spelled`, or `None` if it is not a valid header name.
    pub(crate) fn name(&mut self, spelled: &[u8]) -> Option<HeaderName> {
        // Compared as spelled, not ignoring case: one comparison of bytes, and the lengths
        // tell most names apart before that.
        if let Some((_, name)) = self.names.iter().find(|(known, _)| **known == *spelled) {
            return Some(name.clone());
        }
        let name = HeaderName::from_bytes(spelled).ok()?;
        if spelled.len() <= KEEP_NAMES_UP_TO {
            let kept = (spelled.into(), name.clone());
            if self.names.len() < KNOWN_NAMES {
                self.names.push(kept);
            } else {
                self.names[self.next] = kept;
                self.next = (self.next + 1) % KNOWN_NAMES;
            }
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
        assert_eq!(names.names.len(), 1);
        let other_case = names.name(b"x-USER-id").unwrap();
        assert_eq!(other_case, first, "the same name, spelled otherwise");
        assert_eq!(names.names.len(), 2);
        assert!(names.name(b"bad name").is_none());
        let long = "x".repeat(KEEP_NAMES_UP_TO + 1);
        assert_eq!(names.name(long.as_bytes()).unwrap().as_str(), long);
        assert_eq!(names.names.len(), 2, "a long name is not kept");
        assert!(names.name(b"x-user-i").is_some_and(|name| name != first));
        for index in 0..2 * KNOWN_NAMES {
            let name = format!("x-{index}");
            assert_eq!(names.name(name.as_bytes()).unwrap().as_str(), name);
        }
        assert_eq!(names.names.len(), KNOWN_NAMES, "no more than that are kept");
        let kept: Vec<&[u8]> = names.names.iter().map(|(spelled, _)| &**spelled).collect();
        let latest: Vec<String> = (KNOWN_NAMES..2 * KNOWN_NAMES)
            .map(|index| format!("x-{index}"))
            .collect();
        assert!(
            latest.iter().all(|name| kept.contains(&name.as_bytes())),
            "the latest names take the places of the oldest"
        );
    }
}
