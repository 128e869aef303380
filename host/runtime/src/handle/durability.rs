//! Which chunks a handle has been told were accepted but are not yet
//! durable, and which of those were lost.
//!
//! A backend may buffer chunks per instance until `flush`. The handle
//! numbers every accepted `put_chunk` and remembers, per instance, the
//! range of puts it holds unflushed. A manifest is published only after
//! every other instance holding puts made before the manifest call began
//! has been flushed; an instance lost (trap, deadline) with unflushed puts
//! records them as lost, and the next manifest covering them fails, so a
//! manifest never names a chunk that may have been dropped.
//!
//! Every change is made under the pool's lock together with the instance's
//! return to the pool, so no other thread sees an instance back before its
//! bookkeeping is.

use std::collections::HashMap;

use crate::error::KvError;

/// Puts numbered `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Puts {
    first: u64,
    last: u64,
}

#[derive(Debug, Default)]
pub(super) struct Durability {
    /// Accepted `put_chunk` calls so far.
    puts: u64,
    /// Instance id → the puts it holds unflushed.
    unflushed: HashMap<u64, Puts>,
    /// Puts lost with their instance, not yet reported to a manifest.
    lost: Vec<Puts>,
}

impl Durability {
    /// The number of the last accepted put: a manifest call covers the puts
    /// up to the cutoff taken when it begins.
    pub(super) fn cutoff(&self) -> u64 {
        self.puts
    }

    /// `instance` accepted a put.
    pub(super) fn put_accepted(&mut self, instance: u64) {
        self.puts += 1;
        let seq = self.puts;
        self.unflushed
            .entry(instance)
            .and_modify(|p| p.last = seq)
            .or_insert(Puts {
                first: seq,
                last: seq,
            });
    }

    /// `instance` made everything it accepted durable (`flush`, or its own
    /// `put_manifest`).
    pub(super) fn flushed(&mut self, instance: u64) {
        self.unflushed.remove(&instance);
    }

    /// `instance` is gone; whatever it held unflushed is lost.
    pub(super) fn instance_lost(&mut self, instance: u64) {
        if let Some(puts) = self.unflushed.remove(&instance) {
            self.lost.push(puts);
        }
    }

    /// Whether `instance` (not `own`) holds unflushed puts made at or
    /// before `cutoff`.
    pub(super) fn is_due(&self, instance: u64, own: u64, cutoff: u64) -> bool {
        instance != own
            && self
                .unflushed
                .get(&instance)
                .is_some_and(|p| p.first <= cutoff)
    }

    /// Whether any instance but `own` holds unflushed puts made at or before
    /// `cutoff`.
    pub(super) fn any_due(&self, own: u64, cutoff: u64) -> bool {
        self.unflushed
            .keys()
            .any(|&id| self.is_due(id, own, cutoff))
    }

    /// `Err` if puts made at or before `cutoff` were lost: reported once, to
    /// this caller; losses of later puts are kept for later manifests.
    pub(super) fn take_loss(&mut self, cutoff: u64) -> Result<(), KvError> {
        let covered = self.lost.iter().filter(|p| p.first <= cutoff).count();
        if covered == 0 {
            return Ok(());
        }
        self.lost.retain_mut(|p| {
            if p.first > cutoff {
                return true;
            }
            p.first = cutoff + 1;
            p.first <= p.last
        });
        Err(KvError::Io(format!(
            "{covered} backend instance(s) holding chunks put through this handle were lost \
             (trap or deadline) before the chunks were durable; put the chunks again before \
             publishing a manifest"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_fails_every_manifest_covering_it_once() {
        let mut d = Durability::default();
        d.put_accepted(1); // 1
        d.put_accepted(2); // 2
        d.put_accepted(1); // 3
        assert!(d.is_due(1, 2, 1) && !d.is_due(1, 1, 3) && d.any_due(2, 3));
        d.flushed(2);
        assert!(!d.is_due(2, 1, 3));
        d.instance_lost(1); // puts 1 and 3 lost
        assert!(d.take_loss(0).is_ok(), "a manifest begun before the puts");
        assert!(d.take_loss(2).is_err(), "covers put 1");
        assert!(d.take_loss(2).is_ok(), "reported once");
        assert!(d.take_loss(3).is_err(), "put 3 is still unreported");
        assert!(d.take_loss(9).is_ok());
        // A lost instance that held nothing unflushed loses nothing.
        d.instance_lost(7);
        assert!(d.take_loss(9).is_ok());
    }
}
