//! Overload: while the upstream struggles (too many requests in flight, or its moving average
//! latency above the target), every limit's refill rate is multiplied by `factor`; once load
//! falls, the factor climbs back to 1 in steps over about ten seconds.
//!
//! Load is local, so this is per replica: each replica protects the upstream from its own
//! share of the traffic.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::config::Overload;
use crate::in_flight::UpstreamInFlight;

/// Seconds a full recovery (from `factor` back to 1) takes.
const RECOVERY_SECONDS: f64 = 10.0;
/// Weight of a new latency sample in the moving average.
const SMOOTHING: f64 = 0.2;

/// The next load factor, from the current one: `factor` at once while overloaded, else a
/// step back towards 1.
pub fn next_factor(current: f64, overloaded: bool, overload: &Overload, elapsed: f64) -> f64 {
    if overloaded {
        return overload.factor;
    }
    let step = (1.0 - overload.factor) / RECOVERY_SECONDS * elapsed;
    (current + step).min(1.0)
}

/// Whether these measurements count as overloaded.
pub fn is_overloaded(overload: &Overload, inflight: u64, latency: Duration) -> bool {
    overload.max_inflight.is_some_and(|max| inflight > max)
        || overload
            .latency_target
            .is_some_and(|target| latency > target)
}

/// Ticks without a sample and without a request in flight before latency evidence fades.
const QUIET_TICKS: u64 = 10;

/// Upstream load as the gateway sees it, and the factor it implies.
#[derive(Debug)]
pub struct LoadMonitor {
    /// Upstream requests whose response body has not ended.
    inflight: Arc<AtomicU64>,
    /// Moving average of upstream latency, in seconds (f64 bits).
    latency: AtomicU64,
    has_average: AtomicBool,
    samples_since_tick: AtomicU64,
    quiet_ticks: AtomicU64,
    /// The current load factor (f64 bits).
    factor: AtomicU64,
}

impl Default for LoadMonitor {
    fn default() -> LoadMonitor {
        LoadMonitor {
            inflight: Arc::new(AtomicU64::new(0)),
            latency: AtomicU64::new(0f64.to_bits()),
            has_average: AtomicBool::new(false),
            samples_since_tick: AtomicU64::new(0),
            quiet_ticks: AtomicU64::new(0),
            factor: AtomicU64::new(1f64.to_bits()),
        }
    }
}

impl LoadMonitor {
    /// What every limit's rate is multiplied by now.
    pub fn factor(&self) -> f64 {
        f64::from_bits(self.factor.load(Ordering::Relaxed))
    }

    /// Counts an upstream request until the guard is dropped (with its response body).
    pub fn start_request(&self) -> UpstreamInFlight {
        UpstreamInFlight::new(&self.inflight)
    }

    /// Adds one upstream latency sample to the moving average.
    pub fn observe(&self, latency: Duration) {
        let sample = latency.as_secs_f64();
        let first = !self.has_average.swap(true, Ordering::Relaxed);
        self.samples_since_tick.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .latency
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let average = f64::from_bits(bits);
                let next = if first {
                    sample
                } else {
                    average + SMOOTHING * (sample - average)
                };
                Some(next.to_bits())
            });
    }

    pub fn latency(&self) -> Duration {
        Duration::from_secs_f64(f64::from_bits(self.latency.load(Ordering::Relaxed)).max(0.0))
    }

    /// Re-evaluates the load `elapsed` seconds after the previous tick and returns the factor.
    /// When the upstream has been idle for a while (no sample, nothing in flight), the latency
    /// evidence fades (halves each tick), so an upstream nobody calls any more is not held
    /// overloaded forever.
    pub fn tick(&self, overload: Option<&Overload>, elapsed: f64) -> f64 {
        let Some(overload) = overload else {
            self.factor.store(1f64.to_bits(), Ordering::Relaxed);
            return 1.0;
        };
        let idle = self.inflight.load(Ordering::Relaxed) == 0;
        if self.samples_since_tick.swap(0, Ordering::Relaxed) > 0 || !idle {
            self.quiet_ticks.store(0, Ordering::Relaxed);
        } else if self.quiet_ticks.fetch_add(1, Ordering::Relaxed) + 1 >= QUIET_TICKS {
            let _ = self
                .latency
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                    Some((f64::from_bits(bits) / 2.0).to_bits())
                });
        }
        let overloaded = is_overloaded(
            overload,
            self.inflight.load(Ordering::Relaxed),
            self.latency(),
        );
        let factor = next_factor(self.factor(), overloaded, overload, elapsed);
        self.factor.store(factor.to_bits(), Ordering::Relaxed);
        factor
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVERLOAD: Overload = Overload {
        max_inflight: Some(10),
        latency_target: Some(Duration::from_millis(250)),
        factor: 0.5,
    };

    #[test]
    fn drops_at_once_and_recovers_in_steps() {
        assert_eq!(next_factor(1.0, true, &OVERLOAD, 0.1), 0.5);
        let mut factor = 0.5;
        let mut steps = 0;
        while factor < 1.0 {
            factor = next_factor(factor, false, &OVERLOAD, 1.0);
            steps += 1;
        }
        assert_eq!(steps, 10, "about ten seconds to recover");
        assert_eq!(next_factor(0.7, true, &OVERLOAD, 1.0), 0.5);
    }

    #[test]
    fn overloaded_by_inflight_or_latency() {
        assert!(!is_overloaded(&OVERLOAD, 10, Duration::from_millis(250)));
        assert!(is_overloaded(&OVERLOAD, 11, Duration::ZERO));
        assert!(is_overloaded(&OVERLOAD, 0, Duration::from_millis(251)));
        let latency_only = Overload {
            max_inflight: None,
            ..OVERLOAD
        };
        assert!(!is_overloaded(&latency_only, 10_000, Duration::ZERO));
    }

    #[test]
    fn the_monitor_follows_samples_and_forgets_stale_ones() {
        let monitor = LoadMonitor::default();
        for _ in 0..5 {
            monitor.observe(Duration::from_millis(400));
        }
        assert_eq!(monitor.tick(Some(&OVERLOAD), 0.1), 0.5);
        for _ in 0..20 {
            monitor.observe(Duration::from_millis(10));
        }
        monitor.tick(Some(&OVERLOAD), 0.1);
        assert!(monitor.latency() < Duration::from_millis(250));
        let mut factor = monitor.factor();
        for _ in 0..200 {
            factor = monitor.tick(Some(&OVERLOAD), 0.1);
        }
        assert_eq!(factor, 1.0);
        // Slow samples with nothing newer: held overloaded while requests are in flight,
        // forgotten once the upstream has been idle for a while.
        monitor.observe(Duration::from_secs(10));
        let stuck = monitor.start_request();
        for _ in 0..50 {
            assert_eq!(monitor.tick(Some(&OVERLOAD), 0.1), 0.5);
        }
        drop(stuck);
        for _ in 0..200 {
            factor = monitor.tick(Some(&OVERLOAD), 0.1);
        }
        assert_eq!(factor, 1.0);
        let guard = monitor.start_request();
        assert_eq!(monitor.inflight.load(Ordering::Relaxed), 1);
        drop(guard);
        assert_eq!(monitor.inflight.load(Ordering::Relaxed), 0);
        assert_eq!(monitor.tick(None, 0.1), 1.0);
    }
}
