//! Back-off after repeated lost instances: a guest that traps on every
//! call, or fails every start, would otherwise cost a fresh instantiation
//! per call. Used by a kv-store handle's pool and by the single-instance
//! guests, fabrics and subscribers ([`crate::single`]), and by `kvwasm
//! serve` for a subscriber whose rebuilds replay calls that succeed.

use std::time::{Duration, Instant};

use crate::error::KvError;

/// Losses in a row before calls back off.
const BACKOFF_AFTER: u32 = 3;
/// First back-off; it doubles with every further loss, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A back-off that [`Backoff::lost`] started.
pub struct Started {
    wait: Duration,
    streak: u32,
}

impl Started {
    pub fn log(&self, label: &str) {
        crate::log_limit::warn(
            ("backoff", label),
            format_args!(
                "{label}: backing off for {} ms after {} lost instances in a row",
                self.wait.as_millis(),
                self.streak
            ),
        );
    }
}

#[derive(Debug, Default)]
pub struct Backoff {
    /// Instances lost in a row: to a trap or the deadline in a call, or
    /// failing to start.
    streak: u32,
    /// While in the future, calls are refused instead of starting yet
    /// another instance that will trap.
    retry_at: Option<Instant>,
    /// Why the last instance was lost, for the refusals: the caller of a
    /// refused call learns what keeps failing, not only that something does.
    last_loss: String,
}

impl Backoff {
    /// A call returned (a value or the guest's own error): the instance
    /// is healthy.
    pub fn succeeded(&mut self) {
        self.streak = 0;
        self.retry_at = None;
    }

    /// An instance was lost to `why` (in a call, or it failed to start).
    /// Returns the back-off this starts, if any, for [`Started::log`]
    /// (called once the lock around this is released).
    pub fn lost(&mut self, why: &KvError) -> Option<Started> {
        self.streak += 1;
        self.last_loss = crate::log_limit::bounded(why.to_string());
        if self.streak < BACKOFF_AFTER {
            return None;
        }
        let doublings = (self.streak - BACKOFF_AFTER).min(16);
        let wait = FIRST_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF);
        self.retry_at = Some(Instant::now() + wait);
        Some(Started {
            wait,
            streak: self.streak,
        })
    }

    /// Whether calls are refused now (what [`Backoff::check`] says, without
    /// the message).
    pub fn refusing(&self) -> bool {
        self.retry_at.is_some_and(|at| at > Instant::now())
    }

    /// `Err` while calls are refused, naming the guest as `kind name`
    /// (`backend "disk"`, `fabric "mrdn"`).
    pub fn check(&self, kind: &str, name: &str) -> Result<(), KvError> {
        match self.retry_at {
            Some(at) if at > Instant::now() => Err(KvError::Unavailable(format!(
                "{kind} {name:?} lost {} instances in a row (traps, deadlines or failed \
                 starts; the last: {}); calls are refused for another {} ms",
                self.streak,
                self.last_loss,
                at.saturating_duration_since(Instant::now()).as_millis()
            ))),
            _ => Ok(()),
        }
    }
}
