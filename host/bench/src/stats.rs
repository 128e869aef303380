//! Median and spread of repeated samples.

/// Samples of one case on one target.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// In repetition order: sample `i` of every target was taken in the
    /// same repetition, back to back, so they pair up.
    pub samples: Vec<f64>,
}

impl Stat {
    pub fn new(samples: Vec<f64>) -> Stat {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        Stat {
            median: median(&sorted),
            min: sorted.first().copied().unwrap_or(f64::NAN),
            max: sorted.last().copied().unwrap_or(f64::NAN),
            samples,
        }
    }

    /// Median over repetitions of `self[i] / baseline[i]`: each ratio
    /// compares two runs taken back to back, so drift on a noisy machine
    /// cancels out of it.
    pub fn paired_ratio(&self, baseline: &Stat) -> f64 {
        let mut ratios: Vec<f64> = self
            .samples
            .iter()
            .zip(&baseline.samples)
            .map(|(a, b)| a / b)
            .collect();
        ratios.sort_by(f64::total_cmp);
        median(&ratios)
    }
}

fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Stat::new(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        assert_eq!(Stat::new(vec![4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert!(Stat::new(Vec::new()).median.is_nan());
    }

    #[test]
    fn ratios_pair_samples_by_repetition() {
        // Drift: both targets slow down together in the second repetition.
        let base = Stat::new(vec![1.0, 2.0, 1.0]);
        let other = Stat::new(vec![0.9, 1.8, 0.9]);
        assert!((other.paired_ratio(&base) - 0.9).abs() < 1e-9);
        assert_eq!(other.samples, vec![0.9, 1.8, 0.9], "order kept");
    }
}
