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

use std::collections::{BTreeSet, HashMap};

use crate::error::KvError;

/// Puts numbered `first..=last`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Puts {
    first: u64,
    last: u64,
}

/// Puts lost with their instance.
#[derive(Clone, Copy, Debug)]
struct Lost {
    puts: Puts,
    /// Once reported: the last manifest ticket issued then. Every manifest
    /// call begun by that time, and covering these puts, fails too.
    told_through: Option<u64>,
}

#[derive(Debug, Default)]
pub(super) struct Durability {
    /// Accepted `put_chunk` calls so far.
    puts: u64,
    /// Instance id → the puts it holds unflushed.
    unflushed: HashMap<u64, Puts>,
    /// Puts lost with their instance and not yet reported to every manifest
    /// call that was in flight when they were first reported.
    lost: Vec<Lost>,
    /// `put_manifest` calls begun so far (each gets the next ticket).
    tickets: u64,
    /// Tickets of the `put_manifest` calls in flight.
    in_flight: BTreeSet<u64>,
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

    /// Whether `instance` holds puts not yet flushed.
    pub(super) fn holds_puts(&self, instance: u64) -> bool {
        self.unflushed.contains_key(&instance)
    }

    /// Give back the memory of bookkeeping that has emptied.
    pub(super) fn shrink(&mut self) {
        self.unflushed.shrink_to_fit();
        self.lost.shrink_to_fit();
    }

    /// `instance` made everything it accepted durable (`flush`, or its own
    /// `put_manifest`).
    pub(super) fn flushed(&mut self, instance: u64) {
        self.unflushed.remove(&instance);
    }

    /// `instance` is gone; whatever it held unflushed is lost.
    pub(super) fn instance_lost(&mut self, instance: u64) {
        if let Some(puts) = self.unflushed.remove(&instance) {
            self.lost.push(Lost {
                puts,
                told_through: None,
            });
        }
    }

    /// A `put_manifest` call begins: its ticket.
    pub(super) fn begin_manifest(&mut self) -> u64 {
        self.tickets += 1;
        self.in_flight.insert(self.tickets);
        self.tickets
    }

    /// The `put_manifest` call with `ticket` ended. Losses every call that
    /// could have named them has now been told of are forgotten.
    pub(super) fn end_manifest(&mut self, ticket: u64) {
        self.in_flight.remove(&ticket);
        let oldest = self.in_flight.first().copied();
        self.lost.retain(|l| match l.told_through {
            Some(told) => oldest.is_some_and(|o| o <= told),
            None => true,
        });
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

    /// `Err` if puts made at or before `cutoff` were lost, for the manifest
    /// call with `ticket`. A loss fails the first manifest call covering it
    /// and every other call already begun by then (another thread's
    /// manifest may be the one naming the lost chunks); calls begun later
    /// succeed. Lost puts past `cutoff` stay unreported for later calls.
    pub(super) fn take_loss(&mut self, cutoff: u64, ticket: u64) -> Result<(), KvError> {
        let mut hits = 0;
        let mut later = Vec::new();
        for lost in &mut self.lost {
            if lost.puts.first > cutoff {
                continue;
            }
            match lost.told_through {
                Some(told) if ticket > told => continue,
                Some(_) => hits += 1,
                None => {
                    hits += 1;
                    if lost.puts.last > cutoff {
                        later.push(Lost {
                            puts: Puts {
                                first: cutoff + 1,
                                last: lost.puts.last,
                            },
                            told_through: None,
                        });
                        lost.puts.last = cutoff;
                    }
                    lost.told_through = Some(self.tickets);
                }
            }
        }
        self.lost.extend(later);
        if hits == 0 {
            return Ok(());
        }
        Err(KvError::Io(format!(
            "{hits} backend instance(s) holding chunks put through this handle were lost \
             (trap or deadline) before the chunks were durable; put the chunks again before \
             publishing a manifest"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_fails_every_manifest_in_flight_when_it_is_reported() {
        let mut d = Durability::default();
        d.put_accepted(1); // 1
        d.put_accepted(2); // 2
        d.put_accepted(1); // 3
        assert!(d.is_due(1, 2, 1) && !d.is_due(1, 1, 3) && d.any_due(2, 3));
        d.flushed(2);
        assert!(!d.is_due(2, 1, 3));
        // Two manifest calls are in flight (say, two threads) when instance 1,
        // holding puts 1 and 3, is lost.
        let a = d.begin_manifest();
        let b = d.begin_manifest();
        d.instance_lost(1);
        assert!(
            d.take_loss(2, b).is_err(),
            "the first to check covers put 1"
        );
        d.end_manifest(b);
        assert!(
            d.take_loss(2, a).is_err(),
            "the other one, begun before, too"
        );
        d.end_manifest(a);
        let c = d.begin_manifest();
        assert!(d.take_loss(0, c).is_ok(), "a manifest covering no lost put");
        assert!(d.take_loss(3, c).is_err(), "put 3 is still unreported");
        d.end_manifest(c);
        let e = d.begin_manifest();
        assert!(d.take_loss(9, e).is_ok(), "begun after every report");
        d.end_manifest(e);
        // A lost instance that held nothing unflushed loses nothing.
        d.instance_lost(7);
        let f = d.begin_manifest();
        assert!(d.take_loss(9, f).is_ok());
        d.end_manifest(f);
        assert!(d.lost.is_empty() && d.in_flight.is_empty());
    }
}
