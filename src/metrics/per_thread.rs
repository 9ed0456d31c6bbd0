//! Metrics of the request path, recorded without atomic read-modify-write operations.
//!
//! A request updates some twenty series (its outcome, each limit's fill ratio and tokens, the
//! store's and the upstream's latency). `prometheus`'s own types make each update one or more
//! locked instructions on memory that every worker thread shares: on the hot path that was
//! some 27 locked operations per request, a cache line bouncing between cores for each of
//! them when several threads serve requests. Here every thread that records owns a slot of
//! each series, on cache lines of its own, and adds to it with a plain load and store; a
//! scrape sums the slots. Threads beyond the owned slots share one last slot, updated with
//! atomic read-modify-write operations as before: still exact, only not faster.
//!
//! The families render through `prometheus`'s registry and text encoder, like every other
//! metric: names, labels and the exposition format are the same as with `prometheus`'s types.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::thread_slots::{owned_slots, slot, Slot};
use prometheus::core::{Collector, Desc};
use prometheus::proto;

/// `u64` values per cache line.
const LINE_VALUES: usize = 8;

#[repr(align(64))]
struct Line([AtomicU64; LINE_VALUES]);

impl Line {
    fn new() -> Line {
        Line(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// A fixed number of `u64` values (a counter's one, a histogram's buckets and sum), one copy
/// per slot.
struct Cells {
    lines: Box<[Line]>,
    lines_per_slot: usize,
}

impl Cells {
    fn new(values: usize) -> Cells {
        let lines_per_slot = values.div_ceil(LINE_VALUES);
        let slots = owned_slots() + 1;
        Cells {
            lines: (0..slots * lines_per_slot).map(|_| Line::new()).collect(),
            lines_per_slot,
        }
    }

    fn cell(&self, slot: usize, value: usize) -> &AtomicU64 {
        let line = &self.lines[slot * self.lines_per_slot + value / LINE_VALUES];
        &line.0[value % LINE_VALUES]
    }

    /// Adds `delta` (wrapping: a gauge's decrement is a large addition).
    fn add(&self, slot: Slot, value: usize, delta: u64) {
        match slot {
            Slot::Owned(slot) => {
                // Only this thread writes this cell: a load and a store cannot lose an update.
                let cell = self.cell(slot, value);
                cell.store(
                    cell.load(Ordering::Relaxed).wrapping_add(delta),
                    Ordering::Relaxed,
                );
            }
            Slot::Shared(slot) => {
                self.cell(slot, value).fetch_add(delta, Ordering::Relaxed);
            }
        }
    }

    /// Adds `delta` to a cell that holds an `f64`'s bits.
    fn add_f64(&self, slot: Slot, value: usize, delta: f64) {
        let add = |bits: u64| (f64::from_bits(bits) + delta).to_bits();
        match slot {
            Slot::Owned(slot) => {
                let cell = self.cell(slot, value);
                cell.store(add(cell.load(Ordering::Relaxed)), Ordering::Relaxed);
            }
            Slot::Shared(slot) => {
                let cell = self.cell(slot, value);
                let _ =
                    cell.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| Some(add(bits)));
            }
        }
    }

    fn slots(&self) -> impl Iterator<Item = usize> {
        0..self.lines.len() / self.lines_per_slot
    }

    fn sum(&self, value: usize) -> u64 {
        self.slots()
            .map(|slot| self.cell(slot, value).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    fn sum_f64(&self, value: usize) -> f64 {
        self.slots()
            .map(|slot| f64::from_bits(self.cell(slot, value).load(Ordering::Relaxed)))
            .sum()
    }
}

/// A counter of whole numbers.
#[derive(Clone)]
pub struct IntCounter(Arc<Cells>);

impl IntCounter {
    /// A counter no family exports: for a label combination that cannot occur, which a
    /// handle still has to exist for.
    pub(super) fn unexported() -> IntCounter {
        IntCounter(Arc::new(Cells::new(1)))
    }

    pub fn inc(&self) {
        self.0.add(slot(), 0, 1);
    }

    pub fn get(&self) -> u64 {
        self.0.sum(0)
    }
}

/// A counter of fractional amounts (tokens).
#[derive(Clone)]
pub struct Counter(Arc<Cells>);

impl Counter {
    /// Adds `amount`; a negative or non-finite amount is ignored, as a counter only grows.
    pub fn inc_by(&self, amount: f64) {
        if amount.is_finite() && amount > 0.0 {
            self.0.add_f64(slot(), 0, amount);
        }
    }

    pub fn get(&self) -> f64 {
        self.0.sum_f64(0)
    }
}

/// A gauge of whole numbers, raised and lowered possibly on different threads.
#[derive(Clone)]
pub struct IntGauge(Arc<Cells>);

impl IntGauge {
    pub fn inc(&self) {
        self.0.add(slot(), 0, 1);
    }

    pub fn dec(&self) {
        self.0.add(slot(), 0, u64::MAX);
    }

    pub fn get(&self) -> i64 {
        self.0.sum(0) as i64
    }
}

/// A histogram: a count per bucket (the last one above every bound) and the sum. Its total
/// count is the sum of the bucket counts, so a scrape always finds them consistent.
#[derive(Clone)]
pub struct Histogram {
    cells: Arc<Cells>,
    bounds: Arc<[f64]>,
}

impl Histogram {
    pub fn observe(&self, value: f64) {
        // The first bucket whose bound is not below the value; NaN counts above every bound.
        let bucket = if value.is_nan() {
            self.bounds.len()
        } else {
            self.bounds.partition_point(|bound| *bound < value)
        };
        let slot = slot();
        self.cells.add(slot, bucket, 1);
        self.cells.add_f64(slot, self.bounds.len() + 1, value);
    }

    fn proto(&self) -> proto::Histogram {
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .enumerate()
            .map(|(index, bound)| {
                cumulative += self.cells.sum(index);
                let mut bucket = proto::Bucket::default();
                bucket.set_cumulative_count(cumulative);
                bucket.set_upper_bound(*bound);
                bucket
            })
            .collect();
        let mut histogram = proto::Histogram::default();
        histogram.set_bucket(buckets);
        histogram.set_sample_count(cumulative + self.cells.sum(self.bounds.len()));
        histogram.set_sample_sum(self.cells.sum_f64(self.bounds.len() + 1));
        histogram
    }
}

impl fmt::Debug for IntCounter {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "IntCounter({})", self.get())
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Counter({})", self.get())
    }
}

impl fmt::Debug for IntGauge {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "IntGauge({})", self.get())
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Histogram({} buckets)", self.bounds.len())
    }
}

impl fmt::Debug for Family {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Family({})", self.0.desc.fq_name)
    }
}

/// What a family's series are.
enum Kind {
    IntCounter,
    Counter,
    IntGauge,
    Histogram(Arc<[f64]>),
}

impl Kind {
    fn values(&self) -> usize {
        match self {
            Kind::IntCounter | Kind::Counter | Kind::IntGauge => 1,
            // The buckets, the one above every bound, and the sum.
            Kind::Histogram(bounds) => bounds.len() + 2,
        }
    }
}

/// A metric family: one series per set of label values, created on first use and kept (so a
/// reload that resolves the same labels again continues the same series). Clones share the
/// series: one is registered, the others record.
#[derive(Clone)]
pub(super) struct Family(Arc<FamilySeries>);

struct FamilySeries {
    desc: Desc,
    kind: Kind,
    series: Mutex<Vec<(Vec<String>, Arc<Cells>)>>,
}

impl Family {
    fn new(name: &str, help: &str, labels: &[&str], kind: Kind) -> Family {
        let labels = labels.iter().map(|label| label.to_string()).collect();
        let desc =
            Desc::new(name.into(), help.into(), labels, Default::default()).expect("valid metric");
        Family(Arc::new(FamilySeries {
            desc,
            kind,
            series: Mutex::new(Vec::new()),
        }))
    }

    pub(super) fn int_counters(name: &str, help: &str, labels: &[&str]) -> Family {
        Family::new(name, help, labels, Kind::IntCounter)
    }

    pub(super) fn counters(name: &str, help: &str, labels: &[&str]) -> Family {
        Family::new(name, help, labels, Kind::Counter)
    }

    pub(super) fn int_gauge(name: &str, help: &str) -> Family {
        Family::new(name, help, &[], Kind::IntGauge)
    }

    pub(super) fn histograms(name: &str, help: &str, labels: &[&str], bounds: &[f64]) -> Family {
        Family::new(name, help, labels, Kind::Histogram(bounds.into()))
    }

    fn cells(&self, values: &[&str]) -> Arc<Cells> {
        assert_eq!(
            values.len(),
            self.0.desc.variable_labels.len(),
            "label values of {}",
            self.0.desc.fq_name
        );
        let mut series = self.0.series.lock();
        if let Some((_, cells)) = series.iter().find(|(labels, _)| labels == values) {
            return cells.clone();
        }
        let cells = Arc::new(Cells::new(self.0.kind.values()));
        let labels = values.iter().map(|value| value.to_string()).collect();
        series.push((labels, cells.clone()));
        cells
    }

    pub(super) fn int_counter(&self, values: &[&str]) -> IntCounter {
        IntCounter(self.cells(values))
    }

    pub(super) fn counter(&self, values: &[&str]) -> Counter {
        Counter(self.cells(values))
    }

    pub(super) fn gauge(&self) -> IntGauge {
        IntGauge(self.cells(&[]))
    }

    pub(super) fn histogram(&self, values: &[&str]) -> Histogram {
        let Kind::Histogram(bounds) = &self.0.kind else {
            panic!("{} is not a histogram", self.0.desc.fq_name);
        };
        Histogram {
            cells: self.cells(values),
            bounds: bounds.clone(),
        }
    }

    /// Every series' label values and value (whole-number families), for summaries.
    pub(super) fn values(&self) -> Vec<(Vec<String>, u64)> {
        self.0
            .series
            .lock()
            .iter()
            .map(|(labels, cells)| (labels.clone(), cells.sum(0)))
            .collect()
    }
}

impl Collector for Family {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.0.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let series = self.0.series.lock().clone();
        let metrics = series
            .into_iter()
            .map(|(values, cells)| {
                let mut labels: Vec<proto::LabelPair> = self
                    .0
                    .desc
                    .variable_labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = proto::LabelPair::default();
                        pair.set_name(name.clone());
                        pair.set_value(value);
                        pair
                    })
                    .collect();
                labels.sort_by(|a, b| a.get_name().cmp(b.get_name()));
                let mut metric = proto::Metric::default();
                metric.set_label(labels);
                let counter = |value: f64| {
                    let mut counter = proto::Counter::default();
                    counter.set_value(value);
                    counter
                };
                match &self.0.kind {
                    Kind::IntCounter => metric.set_counter(counter(cells.sum(0) as f64)),
                    Kind::Counter => metric.set_counter(counter(cells.sum_f64(0))),
                    Kind::IntGauge => {
                        let mut gauge = proto::Gauge::default();
                        gauge.set_value(cells.sum(0) as i64 as f64);
                        metric.set_gauge(gauge);
                    }
                    Kind::Histogram(bounds) => {
                        let histogram = Histogram {
                            cells,
                            bounds: bounds.clone(),
                        };
                        metric.set_histogram(histogram.proto());
                    }
                }
                metric
            })
            .collect();
        let mut family = proto::MetricFamily::default();
        family.set_name(self.0.desc.fq_name.clone());
        family.set_help(self.0.desc.help.clone());
        family.set_field_type(match self.0.kind {
            Kind::IntCounter | Kind::Counter => proto::MetricType::COUNTER,
            Kind::IntGauge => proto::MetricType::GAUGE,
            Kind::Histogram(_) => proto::MetricType::HISTOGRAM,
        });
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use prometheus::{Encoder, HistogramOpts, HistogramVec, Registry, TextEncoder};

    use super::*;

    fn render(registry: &Registry) -> String {
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&registry.gather(), &mut text)
            .expect("encodes");
        String::from_utf8(text).expect("utf-8")
    }

    #[test]
    fn updates_from_many_threads_all_count() {
        // More threads than there are owned slots: the later ones share the last slot.
        let threads = owned_slots() * 2 + 3;
        let counter = Family::int_counters("c", "c", &["route"]).int_counter(&["a"]);
        let tokens = Family::counters("t", "t", &[]).counter(&[]);
        let gauge = Family::int_gauge("g", "g").gauge();
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counter.inc();
                        tokens.inc_by(0.5);
                        gauge.inc();
                    }
                    for _ in 0..999 {
                        gauge.dec();
                    }
                });
            }
        });
        assert_eq!(counter.get(), threads as u64 * 1000);
        assert_eq!(tokens.get(), threads as f64 * 500.0);
        assert_eq!(gauge.get(), threads as i64);
        // Lowered on one thread after being raised on others: still right.
        gauge.dec();
        assert_eq!(gauge.get(), threads as i64 - 1);
    }

    #[test]
    fn a_counter_ignores_amounts_that_would_not_make_it_grow() {
        let tokens = Family::counters("t", "t", &[]).counter(&[]);
        tokens.inc_by(2.0);
        for amount in [-1.0, 0.0, f64::NAN, f64::INFINITY] {
            tokens.inc_by(amount);
        }
        assert_eq!(tokens.get(), 2.0);
    }

    #[test]
    fn the_same_labels_give_the_same_series() {
        let family = Family::int_counters("c", "c", &["route", "outcome"]);
        family.int_counter(&["a", "allowed"]).inc();
        family.int_counter(&["a", "allowed"]).inc();
        family.int_counter(&["b", "allowed"]).inc();
        let mut values = family.values();
        values.sort();
        assert_eq!(
            values,
            [
                (vec!["a".to_string(), "allowed".to_string()], 2),
                (vec!["b".to_string(), "allowed".to_string()], 1),
            ]
        );
    }

    /// The same observations, recorded here and by `prometheus`'s own types, render the same.
    #[test]
    fn renders_as_prometheus_own_types_do() {
        let bounds = [0.0, 0.1, 0.5, 1.0];
        let values = [0.0, 0.05, 0.1, 0.3, 1.0, 2.5, f64::NAN, 0.7, 0.1];

        let ours = Registry::new();
        let histograms = Family::histograms("h_seconds", "Help text.", &["route", "b"], &bounds);
        let counters = Family::int_counters("c_total", "Counts.", &["route", "b"]);
        let tokens = Family::counters("t_total", "Tokens.", &["route"]);
        let gauge = Family::int_gauge("g", "A gauge.");
        for family in [&histograms, &counters, &tokens, &gauge] {
            ours.register(Box::new(family.clone())).expect("unique");
        }

        let theirs = Registry::new();
        let their_histograms = HistogramVec::new(
            HistogramOpts::new("h_seconds", "Help text.").buckets(bounds.to_vec()),
            &["route", "b"],
        )
        .expect("valid");
        let their_counters = prometheus::IntCounterVec::new(
            prometheus::Opts::new("c_total", "Counts."),
            &["route", "b"],
        )
        .expect("valid");
        let their_tokens =
            prometheus::CounterVec::new(prometheus::Opts::new("t_total", "Tokens."), &["route"])
                .expect("valid");
        let their_gauge = prometheus::IntGauge::new("g", "A gauge.").expect("valid");
        let their_collectors: [Box<dyn Collector>; 4] = [
            Box::new(their_histograms.clone()),
            Box::new(their_counters.clone()),
            Box::new(their_tokens.clone()),
            Box::new(their_gauge.clone()),
        ];
        for collector in their_collectors {
            theirs.register(collector).expect("unique");
        }

        for (route, labels) in [("z", ["z", "1"]), ("a", ["a", "2"])] {
            for value in values {
                histograms.histogram(&labels).observe(value);
                their_histograms.with_label_values(&labels).observe(value);
            }
            for _ in 0..3 {
                counters.int_counter(&labels).inc();
                their_counters.with_label_values(&labels).inc();
            }
            tokens.counter(&[route]).inc_by(1.5);
            their_tokens.with_label_values(&[route]).inc_by(1.5);
        }
        for _ in 0..4 {
            gauge.gauge().inc();
            their_gauge.inc();
        }
        gauge.gauge().dec();
        their_gauge.dec();
        // A family without series is left out, as `prometheus` leaves out an unused vector.
        let unused = Family::int_counters("unused_total", "Unused.", &["route"]);
        ours.register(Box::new(unused)).expect("unique");

        let rendered = render(&ours);
        assert_eq!(rendered, render(&theirs));
        assert!(rendered.contains("h_seconds_bucket{b=\"1\",route=\"z\",le=\"0.1\"} 4"));
        assert!(rendered.contains("h_seconds_count{b=\"1\",route=\"z\"} 9"));
    }
}
