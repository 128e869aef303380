//! What `kvwasm tier status` prints, and the status file a tiered store
//! writes for it (`key value` lines).

use super::contract::TierUsage;

/// What `kvwasm tier status` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierStatus {
    pub usage: Vec<TierUsage>,
    /// Reads served per tier.
    pub hits: Vec<u64>,
    pub misses: u64,
    pub promotions: u64,
    pub demotions: u64,
    pub evictions: u64,
    pub moved_bytes: u64,
    pub verify_failures: u64,
    pub refused: u64,
    pub decisions: Vec<String>,
}

impl TierStatus {
    /// `key value` lines (the status file's format).
    pub fn to_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .usage
            .iter()
            .zip(&self.hits)
            .map(|(u, hits)| {
                format!(
                    "tier {} {} {} {} {hits}",
                    u.name,
                    u.capacity_bytes.map_or("-".into(), |c| c.to_string()),
                    u.used_bytes,
                    u.chunks
                )
            })
            .collect();
        for (key, value) in [
            ("misses", self.misses),
            ("promotions", self.promotions),
            ("demotions", self.demotions),
            ("evictions", self.evictions),
            ("moved_bytes", self.moved_bytes),
            ("verify_failures", self.verify_failures),
            ("refused", self.refused),
        ] {
            lines.push(format!("{key} {value}"));
        }
        lines.extend(self.decisions.iter().map(|d| format!("decision {d}")));
        lines
    }

    /// Parse [`Self::to_lines`]; `None` if any line is malformed.
    pub fn from_lines(text: &str) -> Option<TierStatus> {
        let mut status = TierStatus {
            usage: Vec::new(),
            hits: Vec::new(),
            misses: 0,
            promotions: 0,
            demotions: 0,
            evictions: 0,
            moved_bytes: 0,
            verify_failures: 0,
            refused: 0,
            decisions: Vec::new(),
        };
        for line in text.lines() {
            let (key, rest) = line.split_once(' ')?;
            let number = || rest.parse::<u64>().ok();
            match key {
                "tier" => {
                    let f: Vec<&str> = rest.split(' ').collect();
                    let [name, capacity, used, chunks, hits] = f.as_slice() else {
                        return None;
                    };
                    status.usage.push(TierUsage {
                        name: (*name).to_owned(),
                        capacity_bytes: match *capacity {
                            "-" => None,
                            bytes => Some(bytes.parse().ok()?),
                        },
                        used_bytes: used.parse().ok()?,
                        chunks: chunks.parse().ok()?,
                    });
                    status.hits.push(hits.parse().ok()?);
                }
                "misses" => status.misses = number()?,
                "promotions" => status.promotions = number()?,
                "demotions" => status.demotions = number()?,
                "evictions" => status.evictions = number()?,
                "moved_bytes" => status.moved_bytes = number()?,
                "verify_failures" => status.verify_failures = number()?,
                "refused" => status.refused = number()?,
                "decision" => status.decisions.push(rest.to_owned()),
                _ => return None,
            }
        }
        Some(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> TierStatus {
        TierStatus {
            usage: vec![
                TierUsage {
                    name: "hot".into(),
                    capacity_bytes: Some(1 << 20),
                    used_bytes: 4096,
                    chunks: 2,
                },
                TierUsage {
                    name: "cold".into(),
                    capacity_bytes: None,
                    used_bytes: 1 << 30,
                    chunks: 9,
                },
            ],
            hits: vec![7, 3],
            misses: 1,
            promotions: 2,
            demotions: 3,
            evictions: 4,
            moved_bytes: 5,
            verify_failures: 6,
            refused: 8,
            decisions: vec!["promote 2 chunks to hot".into(), "no change".into()],
        }
    }

    #[test]
    fn the_status_file_reads_back_as_written() {
        let text = status().to_lines().join("\n");
        assert_eq!(TierStatus::from_lines(&text), Some(status()));
    }

    #[test]
    fn a_malformed_status_file_is_refused_whole() {
        let good = status().to_lines();
        for bad in [
            "misses many",
            "tier hot 1 2",
            "tier hot - x 2 3",
            "tier hot abc 1 2 3",
            "moons 3",
            "misses",
        ] {
            let mut lines = good.clone();
            lines.push(bad.into());
            assert_eq!(TierStatus::from_lines(&lines.join("\n")), None, "{bad}");
        }
    }
}
