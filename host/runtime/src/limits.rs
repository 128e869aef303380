//! Resource limits of one guest instance, and the epoch clock.
//!
//! Wasm code is interrupted by epochs: one process-wide thread bumps the
//! engine's epoch every [`EPOCH_TICK`], and each call arms its store's
//! deadline in ticks. A guest that loops traps with `Trap::Interrupt` at most
//! one tick late; compiled code pays a cheap counter check on loop back-edges.
//! (A guest waiting in a host import is bounded by [`crate::deadline`].)
//!
//! Memory: linear memories and tables count against one cap per instance,
//! whatever number of them the component holds; host-owned payloads have a
//! cap of their own; resources (files, sockets, payloads) are counted by the
//! instance's resource table (`max_resources`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Deserialize;
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
    /// Most resources (files, sockets, payloads, pollables, HTTP requests...)
    /// one instance may hold at once.
    pub max_resources: usize,
    /// Most files, directories and TCP sockets one instance may hold open
    /// at once; `None` for its kind's default
    /// ([`Limits::max_descriptors_for`]).
    pub max_descriptors: Option<usize>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            memory_limit_mib: 256,
            call_timeout_ms: 30_000,
            max_payload_mib: 1024,
            fuel: None,
            max_resources: 1024,
            max_descriptors: None,
        }
    }
}

/// Descriptors a fabric, event subscriber or storage advisor may hold by
/// default: they serve no consumer's data, and the shipped ones open a
/// socket or two at most.
pub const AUXILIARY_MAX_DESCRIPTORS: usize = 16;

impl Limits {
    /// [`Limits::max_payload_mib`] in bytes.
    pub fn max_payload_bytes(&self) -> u64 {
        self.max_payload_mib.saturating_mul(1 << 20)
    }

    /// The descriptor cap of an instance of a `kind` guest: the configured
    /// one, else [`AUXILIARY_MAX_DESCRIPTORS`] for guests other than
    /// kv-store backends, whose only default bound is `max_resources` (and
    /// the process's share, `capabilities::descriptors`).
    pub fn max_descriptors_for(&self, kind: crate::guest_kind::GuestKind) -> Option<usize> {
        match kind {
            _ if self.max_descriptors.is_some() => self.max_descriptors,
            crate::guest_kind::GuestKind::KvStore => None,
            crate::guest_kind::GuestKind::Fabric | crate::guest_kind::GuestKind::Subscriber => {
                Some(AUXILIARY_MAX_DESCRIPTORS)
            }
        }
    }

    /// The limiter for one instance.
    pub(crate) fn instance_limits(&self) -> InstanceLimits {
        InstanceLimits {
            memory_bytes: usize::try_from(self.memory_limit_mib.saturating_mul(1 << 20))
                .unwrap_or(usize::MAX),
            max_payload_bytes: self.max_payload_bytes(),
            payload_bytes_held: Arc::default(),
            memory_held: 0,
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
        if self.max_resources < 16 {
            return Err("max_resources must be at least 16".into());
        }
        if self.fuel == Some(0) {
            return Err("fuel must be at least 1".into());
        }
        Ok(())
    }
}

/// Limits a backend or tenant may set; unset values fall back.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Linear memory cap per instance, MiB.
    pub memory_limit_mib: Option<u64>,
    /// Deadline for one call, ms.
    pub call_timeout_ms: Option<u64>,
    /// Largest payload a guest may return, MiB.
    pub max_payload_mib: Option<u64>,
    /// Fuel per call.
    pub fuel: Option<u64>,
    /// Resources one instance may hold.
    pub max_resources: Option<usize>,
    /// Files, directories and sockets one instance may hold open.
    pub max_descriptors: Option<usize>,
}

impl LimitsConfig {
    /// These settings over `base`.
    pub(crate) fn over(&self, base: &Limits) -> Limits {
        Limits {
            memory_limit_mib: self.memory_limit_mib.unwrap_or(base.memory_limit_mib),
            call_timeout_ms: self.call_timeout_ms.unwrap_or(base.call_timeout_ms),
            max_payload_mib: self.max_payload_mib.unwrap_or(base.max_payload_mib),
            fuel: self.fuel.or(base.fuel),
            max_resources: self.max_resources.unwrap_or(base.max_resources),
            max_descriptors: self.max_descriptors.or(base.max_descriptors),
        }
    }
}

/// Most core instances, linear memories and tables one component instance
/// may create. Every shipped guest needs one memory and a handful of
/// instances and tables; each linear memory reserves address space (its
/// guard region) whatever its size, so their number is capped too.
const MAX_CORE_INSTANCES: usize = 64;
const MAX_MEMORIES: usize = 4;
const MAX_TABLES: usize = 64;
/// Bytes charged per table element (a pointer-sized slot).
const TABLE_ELEMENT_BYTES: usize = std::mem::size_of::<usize>();

/// Limits enforced on one instance, and what was refused.
pub(crate) struct InstanceLimits {
    /// Cap on linear memories and tables together, over every core instance
    /// inside the component (a component may hold many).
    memory_bytes: usize,
    /// Bytes of linear memory and tables the instance holds now.
    memory_held: usize,
    pub(crate) max_payload_bytes: u64,
    /// Bytes of host-owned payloads this instance holds now. Payload memory
    /// is host memory, outside the guest's cap, so it has a cap of its own:
    /// at most `max_payload_bytes` at once. Shared with the charges of
    /// payload bytes that streams may still hold ([`PayloadCharge`]).
    payload_bytes_held: Arc<AtomicU64>,
    /// Set when the guest asked for memory past its cap during the current
    /// call. A trap that follows is reported as out-of-memory rather than a
    /// bare abort; each call starts with it clear.
    pub(crate) memory_denied: bool,
}

impl InstanceLimits {
    /// Bytes of linear memory and tables the instance holds now.
    pub(crate) fn memory_held(&self) -> usize {
        self.memory_held
    }

    /// Account for a new payload of `len` bytes; `false` if it would exceed
    /// the cap on payload bytes held at once.
    pub(crate) fn reserve_payload(&mut self, len: u64) -> bool {
        let max = self.max_payload_bytes;
        self.payload_bytes_held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(len).filter(|&after| after <= max)
            })
            .is_ok()
    }

    /// A payload of `len` bytes left the instance (dropped, or returned).
    pub(crate) fn release_payload(&mut self, len: u64) {
        release(&self.payload_bytes_held, len);
    }

    /// Hand the charge of `len` reserved payload bytes to whatever holds
    /// those bytes: it is given back when the charge is dropped.
    pub(crate) fn charge(&self, len: u64) -> PayloadCharge {
        PayloadCharge {
            held: self.payload_bytes_held.clone(),
            len,
        }
    }

    /// Grow the instance's total from `current` to `desired` bytes of one
    /// memory or table, if the cap allows.
    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let after = self
            .memory_held
            .saturating_sub(current)
            .saturating_add(desired);
        if after > self.memory_bytes {
            self.memory_denied = true;
            return false;
        }
        self.memory_held = after;
        true
    }
}

fn release(held: &AtomicU64, len: u64) {
    // Never below zero, whatever the order of releases.
    let _ = held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
        Some(h.saturating_sub(len))
    });
}

/// Payload bytes charged to an instance for as long as anything holds them:
/// the owner of a shared payload's buffer, whose slices a socket or an HTTP
/// body may keep after the guest dropped the payload. So a guest cannot
/// hand bytes to streams and free its cap while they are still held.
pub(crate) struct PayloadCharge {
    held: Arc<AtomicU64>,
    len: u64,
}

impl Drop for PayloadCharge {
    fn drop(&mut self) {
        release(&self.held, self.len);
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Refuse rather than trap: the guest sees a failed allocation and may
        // recover (Rust's try_reserve does); a plain allocation aborts.
        Ok(self.grow(current, desired))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deadline::{Deadline, block_on};
    use wasmtime::component::{Component, Linker};

    /// Instantiate a component (no imports) under `limits`.
    fn instantiate(text: &str, limits: &Limits) -> (wasmtime::Result<()>, bool) {
        let engine = crate::engine::engine();
        let component = Component::new(engine, wat::parse_str(text).unwrap()).unwrap();
        let mut store = wasmtime::Store::new(engine, limits.instance_limits());
        store.limiter(|l| l);
        store.set_epoch_deadline(1000);
        let linker = Linker::new(engine);
        let result = block_on(Deadline::after_ms(10_000), None, || {
            linker.instantiate_async(&mut store, &component)
        })
        .expect("no deadline");
        (result.map(drop), store.data().memory_denied)
    }

    #[test]
    fn many_memories_in_one_component_share_the_cap() {
        // Three core instances of 100 MiB each: 300 MiB against 256 MiB.
        let instances = |n: usize| {
            let inst = "(core instance (instantiate $m))".repeat(n);
            format!("(component (core module $m (memory 1600)) {inst})")
        };
        let limits = Limits::default();
        assert_eq!(limits.memory_limit_mib, 256);
        let (two, denied) = instantiate(&instances(2), &limits);
        assert!(two.is_ok() && !denied);
        let (three, denied) = instantiate(&instances(3), &limits);
        assert!(three.is_err() && denied, "{three:?}");
        // And more memories than the count cap are refused however small.
        let tiny = "(component (core module $m (memory 0))".to_owned()
            + &"(core instance (instantiate $m))".repeat(MAX_MEMORIES + 1)
            + ")";
        let (many, _) = instantiate(&tiny, &limits);
        assert!(many.is_err(), "{many:?}");
    }

    #[test]
    fn multi_memory_modules_do_not_load() {
        let engine = crate::engine::engine();
        let text = "(component (core module (memory 1) (memory 1)))";
        let err = Component::new(engine, wat::parse_str(text).unwrap()).unwrap_err();
        assert!(format!("{err:#}").contains("multiple memories"), "{err:#}");
    }

    #[test]
    fn memories_and_tables_share_one_cap() {
        let mut limits = Limits {
            memory_limit_mib: 1,
            ..Limits::default()
        }
        .instance_limits();
        let half = 512 << 10;
        // Two memories of half the cap each fit; a third byte does not.
        assert!(limits.memory_growing(0, half, None).unwrap());
        assert!(limits.memory_growing(0, half, None).unwrap());
        assert!(!limits.memory_growing(0, 1, None).unwrap());
        assert!(limits.memory_denied);
        // Nor does a table.
        assert!(!limits.table_growing(0, 1, None).unwrap());
        // Growing an existing memory is charged by its growth only.
        let mut limits = Limits {
            memory_limit_mib: 1,
            ..Limits::default()
        }
        .instance_limits();
        assert!(limits.memory_growing(0, half, None).unwrap());
        assert!(limits.memory_growing(half, 2 * half, None).unwrap());
        assert!(!limits.memory_growing(2 * half, 2 * half + 1, None).unwrap());
    }
}
