//! Resource limits of one guest instance, and the deadline clock.
//!
//! Deadlines use epoch interruption: one process-wide thread bumps the
//! engine's epoch every [`EPOCH_TICK`], and each call arms its store's
//! deadline in ticks. A guest that loops traps with `Trap::Interrupt` at most
//! one tick late; compiled code pays a cheap counter check on loop back-edges.

use std::time::Duration;

use wasmtime::ResourceLimiter;

/// Granularity of call deadlines.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Limits applied to every instance of a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Cap on a guest's linear memory, in MiB.
    pub memory_limit_mib: u64,
    /// Deadline for one call into the guest, in milliseconds.
    pub call_timeout_ms: u64,
    /// Largest payload a guest may create or read into the host, in MiB.
    pub max_payload_mib: u64,
    /// Fuel (roughly, wasm instructions) one call may use; `None` for no
    /// metering. Backends that set it run on a metered engine.
    pub fuel: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_limit_mib: 256,
            call_timeout_ms: 30_000,
            max_payload_mib: 1024,
            fuel: None,
        }
    }
}

impl Limits {
    /// Deadline in epoch ticks (rounded up, at least one).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let tick = EPOCH_TICK.as_millis() as u64;
        self.call_timeout_ms.div_ceil(tick).max(1)
    }

    /// [`Limits::max_payload_mib`] in bytes.
    pub fn max_payload_bytes(&self) -> u64 {
        self.max_payload_mib.saturating_mul(1 << 20)
    }

    /// The limiter for one instance.
    pub(crate) fn instance_limits(&self) -> InstanceLimits {
        InstanceLimits {
            memory_bytes: usize::try_from(self.memory_limit_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            max_payload_bytes: self.max_payload_bytes(),
            payload_bytes_held: 0,
            memory_denied: false,
        }
    }

    /// Reject nonsensical values when a config is loaded.
    pub fn validate(&self) -> Result<(), String> {
        if self.memory_limit_mib == 0 {
            return Err("memory_limit_mib must be at least 1".into());
        }
        if self.call_timeout_ms == 0 {
            return Err("call_timeout_ms must be at least 1".into());
        }
        if self.max_payload_mib == 0 {
            return Err("max_payload_mib must be at least 1".into());
        }
        if self.fuel == Some(0) {
            return Err("fuel must be at least 1".into());
        }
        Ok(())
    }
}

/// Limits enforced on one instance, and what was refused.
pub(crate) struct InstanceLimits {
    memory_bytes: usize,
    pub(crate) max_payload_bytes: u64,
    /// Bytes of host-owned payloads this instance holds now. Payload memory
    /// is host memory, outside the guest's cap, so it has a cap of its own:
    /// at most `max_payload_bytes` at once.
    payload_bytes_held: u64,
    /// Set when the guest asked for memory past its cap. A trap that
    /// follows is reported as out-of-memory rather than a bare abort.
    pub(crate) memory_denied: bool,
}

impl InstanceLimits {
    /// Account for a new payload of `len` bytes; `false` if it would exceed
    /// the cap on payload bytes held at once.
    pub(crate) fn reserve_payload(&mut self, len: u64) -> bool {
        match self.payload_bytes_held.checked_add(len) {
            Some(held) if held <= self.max_payload_bytes => {
                self.payload_bytes_held = held;
                true
            }
            _ => false,
        }
    }

    /// A payload of `len` bytes left the instance (dropped, or returned).
    pub(crate) fn release_payload(&mut self, len: u64) {
        self.payload_bytes_held = self.payload_bytes_held.saturating_sub(len);
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Refuse rather than trap: the guest sees a failed allocation and may
        // recover (Rust's try_reserve does); a plain allocation aborts.
        if desired > self.memory_bytes {
            self.memory_denied = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}
