//! Bounded logging: a guest controls how often calls fail and what its
//! error strings say, so neither may decide how much the host logs.
//!
//! * [`bounded`] cuts guest-supplied text to [`MAX_GUEST_TEXT`] bytes before
//!   it reaches an error message or a log line;
//! * [`admit`] lets one line per key through per [`INTERVAL`] (or a few,
//!   [`admit_up_to`]) and counts the rest, which the next admitted line
//!   reports.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Longest guest-supplied text kept in an error or log line.
pub const MAX_GUEST_TEXT: usize = 512;

/// One line per key per interval.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Distinct keys remembered; past it the table starts afresh (keys are
/// backend and operation names, so this is never reached in practice).
const MAX_KEYS: usize = 4096;

/// `text`, cut to [`MAX_GUEST_TEXT`] bytes (on a character boundary) with a
/// note of how much was cut.
pub fn bounded(mut text: String) -> String {
    if text.len() > MAX_GUEST_TEXT {
        let total = text.len();
        let mut cut = MAX_GUEST_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str(&format!("… [{} more bytes cut]", total - cut));
    }
    text
}

struct Slot {
    /// Start of the current interval.
    since: Instant,
    /// Lines admitted in it.
    admitted: u32,
    suppressed: u64,
}

/// Whether a line for `key` may be written now: `Some(n)` with the number of
/// lines suppressed since the last one, or `None` to drop this one.
pub fn admit(key: impl Hash) -> Option<u64> {
    admit_up_to(key, 1)
}

/// As [`admit`], letting up to `lines` lines through per interval.
pub fn admit_up_to(key: impl Hash, lines: u32) -> Option<u64> {
    static SLOTS: LazyLock<Mutex<HashMap<u64, Slot>>> = LazyLock::new(Default::default);
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    let key = hasher.finish();
    let now = Instant::now();
    let mut slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
    if slots.len() >= MAX_KEYS && !slots.contains_key(&key) {
        slots.clear();
    }
    let slot = slots.entry(key).or_insert(Slot {
        since: now,
        admitted: 0,
        suppressed: 0,
    });
    if now.duration_since(slot.since) >= INTERVAL {
        slot.since = now;
        slot.admitted = 0;
    }
    if slot.admitted >= lines {
        slot.suppressed += 1;
        return None;
    }
    slot.admitted += 1;
    Some(std::mem::take(&mut slot.suppressed))
}

/// A warning, at most one line per `key` per [`INTERVAL`].
pub fn warn(key: impl Hash, message: std::fmt::Arguments<'_>) {
    if let Some(suppressed) = admit(key) {
        if suppressed > 0 {
            tracing::warn!("{message} ({suppressed} similar lines suppressed)");
        } else {
            tracing::warn!("{message}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_long_text_on_a_char_boundary() {
        assert_eq!(bounded("short".into()), "short");
        let long = "é".repeat(MAX_GUEST_TEXT);
        let cut = bounded(long.clone());
        assert!(cut.len() < MAX_GUEST_TEXT + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("[{} more bytes cut]", long.len() - MAX_GUEST_TEXT)));
    }

    #[test]
    fn admits_one_line_per_interval_and_counts_the_rest() {
        let key = ("log_limit test", line!());
        assert_eq!(admit(key), Some(0));
        for _ in 0..1000 {
            assert_eq!(admit(key), None);
        }
        assert_eq!(admit(("another key", line!())), Some(0));
        std::thread::sleep(INTERVAL);
        assert_eq!(admit(key), Some(1000));
        let burst = ("burst", line!());
        assert!((0..5).all(|_| admit_up_to(burst, 5).is_some()));
        assert_eq!(admit_up_to(burst, 5), None);
    }
}
