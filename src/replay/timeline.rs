//! Admitted and refused requests over time, in a bounded number of bins: whatever span a log
//! covers (a minute, a month, a line dated 2099), the bins widen instead of multiplying.

/// The most bins a timeline keeps; past it, neighbouring bins merge and each covers twice the
/// time.
const MOST_BINS: usize = 2048;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// The second the first bin starts at (Unix seconds), once a request was seen.
    pub start: Option<i64>,
    /// Seconds each bin covers (at least 1).
    width: i64,
    /// Per bin: admitted, refused.
    pub bins: Vec<[u64; 2]>,
}

impl Timeline {
    /// Counts a request at `time` (Unix seconds). Lines logged out of order before the first
    /// one count in the first bin.
    pub fn record(&mut self, time: f64, refused: bool) {
        let second = time.floor() as i64;
        let start = *self.start.get_or_insert(second);
        self.width = self.width.max(1);
        let offset = second.saturating_sub(start).max(0);
        while offset / self.width >= MOST_BINS as i64 {
            self.widen();
        }
        let index = (offset / self.width) as usize;
        if index >= self.bins.len() {
            self.bins.resize(index + 1, [0, 0]);
        }
        self.bins[index][usize::from(refused)] += 1;
    }

    /// Seconds each bin covers.
    pub fn width(&self) -> i64 {
        self.width.max(1)
    }

    fn widen(&mut self) {
        let merged = self
            .bins
            .chunks(2)
            .map(|pair| {
                pair.iter()
                    .fold([0, 0], |sum, bin| [sum[0] + bin[0], sum[1] + bin[1]])
            })
            .collect();
        self.bins = merged;
        self.width = self.width.saturating_mul(2);
    }

    /// The same counts in at most `most` bins (for a chart), with the seconds each covers.
    pub fn coarsened(&self, most: usize) -> (i64, Vec<[u64; 2]>) {
        let per_bin = self.bins.len().div_ceil(most.max(1)).max(1);
        let bins = self
            .bins
            .chunks(per_bin)
            .map(|group| {
                group
                    .iter()
                    .fold([0, 0], |sum, bin| [sum[0] + bin[0], sum[1] + bin[1]])
            })
            .collect();
        (self.width() * per_bin as i64, bins)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_fall_into_seconds_until_the_span_needs_wider_bins() {
        let mut timeline = Timeline::default();
        timeline.record(100.2, false);
        timeline.record(100.9, true);
        timeline.record(102.0, false);
        assert_eq!((timeline.start, timeline.width()), (Some(100), 1));
        assert_eq!(timeline.bins, [[1, 1], [0, 0], [1, 0]]);
        // A line a day later: bins widen until the day fits, and no request is lost.
        timeline.record(100.0 + 86_400.0, true);
        assert!(timeline.bins.len() <= MOST_BINS);
        assert_eq!(timeline.width(), 64);
        let total: u64 = timeline.bins.iter().flatten().sum();
        assert_eq!(total, 4);
        assert_eq!(timeline.bins[0], [2, 1]);
        assert_eq!(timeline.bins.last(), Some(&[0, 1]));
    }

    #[test]
    fn a_line_far_in_the_future_or_past_keeps_the_timeline_bounded() {
        let mut timeline = Timeline::default();
        timeline.record(1_796_083_200.0, false);
        timeline.record(4_102_444_800.0, false);
        timeline.record(0.0, true);
        assert!(timeline.bins.len() <= MOST_BINS);
        assert_eq!(timeline.bins[0], [1, 1]);
    }

    #[test]
    fn coarsening_keeps_every_count() {
        let mut timeline = Timeline::default();
        for second in 0..1000 {
            timeline.record(f64::from(second), second % 3 == 0);
        }
        let (width, bins) = timeline.coarsened(120);
        assert_eq!(width, 9);
        assert!(bins.len() <= 120);
        let admitted: u64 = bins.iter().map(|bin| bin[0]).sum();
        let refused: u64 = bins.iter().map(|bin| bin[1]).sum();
        assert_eq!((admitted, refused), (666, 334));
    }
}
