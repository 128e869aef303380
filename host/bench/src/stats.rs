//! Median and spread of repeated samples.

/// Samples of one case on one target.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub samples: Vec<f64>,
}

impl Stat {
    pub fn new(mut samples: Vec<f64>) -> Stat {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let median = match n {
            0 => f64::NAN,
            _ if n % 2 == 1 => samples[n / 2],
            _ => (samples[n / 2 - 1] + samples[n / 2]) / 2.0,
        };
        Stat {
            median,
            min: samples.first().copied().unwrap_or(f64::NAN),
            max: samples.last().copied().unwrap_or(f64::NAN),
            samples,
        }
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
}
