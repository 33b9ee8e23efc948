//! Summary statistics for benchmark samples: nearest-rank percentiles over latencies in µs and
//! durations in ms.
//!
//! Two stores, one per kind of run: [`Latencies`] keeps every sample and gives exact
//! nearest-rank percentiles (the fault modes: tens to thousands of samples); [`Histogram`] keeps
//! an HdrHistogram (Gil Tene's High Dynamic Range histogram, crate `hdrhistogram`) with 3
//! significant digits, so a publish load of millions of samples takes a few hundred KiB and its
//! tail (p99.9, max) is exact to 0.1 %.
//!
//! Owns: turning a set of samples into the figures a benchmark prints. Must never: time anything
//! itself (samples come from the caller).

/// Nearest-rank percentile of `sorted` (ascending), `p` in `0.0..=1.0`; `None` when empty.
/// Same definition as `nats bench` and HdrHistogram's "value at percentile" for exact samples.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * p.clamp(0.0, 1.0)).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

/// Latency samples of one run, in µs.
#[derive(Debug, Default, Clone)]
pub struct Latencies {
    samples: Vec<u64>,
    sorted: bool,
}

impl Latencies {
    /// Records one sample, in µs.
    pub fn record_us(&mut self, us: u64) {
        self.samples.push(us);
        self.sorted = false;
    }

    /// Moves every sample of `other` into `self`.
    pub fn merge(&mut self, mut other: Latencies) {
        self.samples.append(&mut other.samples);
        self.sorted = false;
    }

    /// How many samples.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The `p` percentile (`0.0..=1.0`) in ms; 0.0 when empty.
    pub fn ms(&mut self, p: f64) -> f64 {
        if !self.sorted {
            self.samples.sort_unstable();
            self.sorted = true;
        }
        percentile(&self.samples, p).map_or(0.0, |us| us as f64 / 1000.0)
    }
}

/// Latency samples of a publish load, in µs, in an HdrHistogram: values from 1 µs up (it grows
/// as larger values arrive), each within 0.1 % of what was recorded. A percentile is the highest
/// value equivalent to the nearest-rank sample at that rank (HdrHistogram's `value_at_quantile`),
/// so it never understates.
#[derive(Debug, Clone)]
pub struct Histogram(hdrhistogram::Histogram<u64>);

impl Default for Histogram {
    fn default() -> Histogram {
        // 3 significant digits: 0.1 % resolution, the precision HdrHistogram's authors use for
        // latency; auto-resizing, so there is no upper bound to choose.
        Histogram(hdrhistogram::Histogram::new(3).expect("3 significant digits is within 0..=5"))
    }
}

impl Histogram {
    /// Records one sample, in µs (0 is recorded as 0).
    pub fn record_us(&mut self, us: u64) {
        // `record` grows the histogram to hold `us`; it fails only where no growth can (values
        // near u64::MAX), and then the sample is kept at the largest trackable value.
        if self.0.record(us).is_err() {
            self.0.saturating_record(us);
        }
    }

    /// Adds every sample of `other` into `self`.
    pub fn merge(&mut self, other: &Histogram) {
        // Both auto-resize, so no value of `other` is out of `self`'s range.
        self.0.add(&other.0).expect("an auto-resizing histogram takes every value");
    }

    /// How many samples.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether there is no sample.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The `p` percentile (`0.0..=1.0`) in ms; 0.0 when empty.
    pub fn ms(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return 0.0;
        }
        self.0.value_at_quantile(p.clamp(0.0, 1.0)) as f64 / 1000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within HdrHistogram's 3 significant digits of `want`, and never below it.
    fn about(got: f64, want: f64) -> bool {
        got >= want && got <= want * 1.001
    }

    #[test]
    fn histogram_percentiles_are_nearest_rank_within_a_tenth_of_a_percent() {
        let mut h = Histogram::default();
        for ms in 1..=1000u64 {
            h.record_us(ms * 1000);
        }
        assert_eq!(h.len(), 1000);
        for (p, want) in [(0.5, 500.0), (0.9, 900.0), (0.99, 990.0), (0.999, 999.0), (1.0, 1000.0)] {
            assert!(about(h.ms(p), want), "p{p}: {} ms, want {want}", h.ms(p));
        }
        assert!(about(h.ms(0.0), 1.0));
        // Small values are exact: below 2,048 µs every µs has its own bucket.
        let mut small = Histogram::default();
        for us in [3, 1, 2] {
            small.record_us(us);
        }
        assert_eq!((small.ms(0.5), small.ms(1.0)), (0.002, 0.003));
        assert_eq!(Histogram::default().ms(0.99), 0.0);
        assert!(Histogram::default().is_empty());
    }

    #[test]
    fn histograms_merge_and_grow_past_an_hour() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record_us(10);
        b.record_us(5_000_000_000); // 5,000 s: the histogram grows to hold it
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert!(about(a.ms(1.0), 5_000_000.0), "{}", a.ms(1.0));
        assert_eq!(a.ms(0.5), 0.01);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Some(50));
        assert_eq!(percentile(&v, 0.99), Some(99));
        assert_eq!(percentile(&v, 1.0), Some(100));
        assert_eq!(percentile(&v, 0.0), Some(1));
        assert_eq!(percentile(&[], 0.5), None);
        assert_eq!(percentile(&[7], 0.9), Some(7));
    }

    #[test]
    fn latencies_report_ms() {
        let mut l = Latencies::default();
        for us in [3000, 1000, 2000] {
            l.record_us(us);
        }
        assert_eq!(l.ms(0.5), 2.0);
        assert_eq!(l.ms(1.0), 3.0);
        assert_eq!(Latencies::default().ms(0.5), 0.0);
    }
}
