//! Bans (`[limits.NAME.ban]`): a key its limit refused `after` times within `within` is refused
//! entirely for `duration`, whatever its bucket holds (pure: the time is passed in).

use std::time::Duration;

use super::clock::Timestamp;

/// A limit's ban rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    pub after: u32,
    pub within: Duration,
    pub duration: Duration,
}

/// One key's refusals and ban. Refusals are counted in a window that opens at the first one
/// and lasts `within`: a burst split by a window's end counts in two windows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BanState {
    refusals: u32,
    window_opened: Timestamp,
    until: Option<Timestamp>,
}

impl BanState {
    /// Seconds of ban left at `now`, when the key is banned.
    pub fn left(&self, now: Timestamp) -> Option<f64> {
        let until = self.until?;
        (until > now).then(|| until.saturating_elapsed_since(now).as_secs_f64())
    }

    /// Counts a refusal by the limit; true when it begins a ban.
    pub fn refused(&mut self, ban: &Ban, now: Timestamp) -> bool {
        if self.left(now).is_some() {
            return false;
        }
        let window_end = self.window_opened.after(ban.within.as_secs_f64());
        if self.refusals == 0 || now >= window_end {
            self.refusals = 0;
            self.window_opened = now;
        }
        self.refusals += 1;
        if self.refusals < ban.after {
            return false;
        }
        self.refusals = 0;
        self.until = Some(now.after(ban.duration.as_secs_f64()));
        true
    }

    /// Until when the state matters: a ban's end, or the window's.
    pub fn relevant_until(&self, ban: &Ban) -> Timestamp {
        let window_end = self.window_opened.after(ban.within.as_secs_f64());
        self.until.map_or(window_end, |until| until.max(window_end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    fn at(seconds: u64) -> Timestamp {
        Timestamp(1_000 * SECOND + seconds * SECOND)
    }

    fn rule() -> Ban {
        Ban {
            after: 3,
            within: Duration::from_secs(60),
            duration: Duration::from_secs(900),
        }
    }

    #[test]
    fn the_third_refusal_within_a_minute_bans_for_fifteen() {
        let mut state = BanState::default();
        assert!(!state.refused(&rule(), at(0)));
        assert!(!state.refused(&rule(), at(30)));
        assert_eq!(state.left(at(30)), None);
        assert!(state.refused(&rule(), at(59)));
        assert_eq!(state.left(at(59)), Some(900.0));
        assert_eq!(state.left(at(959)), None);
        // Refusals while banned do not extend it or count toward the next.
        assert!(!state.refused(&rule(), at(100)));
        assert_eq!(state.left(at(100)), Some(859.0));
        assert!(!state.refused(&rule(), at(960)));
        assert!(!state.refused(&rule(), at(961)));
        assert!(state.refused(&rule(), at(962)));
    }

    #[test]
    fn refusals_spread_wider_than_the_window_never_ban() {
        let mut state = BanState::default();
        for minute in 0..10 {
            assert!(!state.refused(&rule(), at(minute * 61)));
            assert!(!state.refused(&rule(), at(minute * 61 + 1)));
        }
        assert_eq!(state.left(at(700)), None);
        assert_eq!(state.relevant_until(&rule()), at(9 * 61 + 60));
    }

    #[test]
    fn one_refusal_bans_when_after_is_one() {
        let mut state = BanState::default();
        let once = Ban { after: 1, ..rule() };
        assert!(state.refused(&once, at(5)));
        assert_eq!(state.relevant_until(&once), at(905));
    }
}
