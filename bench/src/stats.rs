//! Summary statistics for benchmark samples: nearest-rank percentiles over latencies in µs and
//! durations in ms.
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

#[cfg(test)]
mod tests {
    use super::*;

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
