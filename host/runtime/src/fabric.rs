//! Fabric guests: untrusted transports of MRDN v1 frames
//! (`wit/fabric/fabric.wit`, docs/fabric.md).
//!
//! The split of trust: the host encodes frames and verifies every frame a
//! guest hands back ([`kvwasm_mrdn`], strict mode) before its caller sees
//! it; the guest only moves opaque bytes over what it was granted. A fabric
//! runs in the same sandbox as a kv-store backend ([`crate::sandbox`]):
//! the same grants, limits, deadline, metrics and trap handling.
//!
//! A [`Fabric`] keeps one guest instance (a transport holds one connection
//! or one in-memory map). An instance that traps or overruns its deadline
//! is discarded and the next call starts a fresh one; handles the lost
//! instance gave out are forgotten with it (`NotFound`), never resolved by
//! the new instance to some other frame. Callers see host handles, mapped
//! to the guest's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use kvwasm_mrdn::{DecodeMode, HEADER_LEN, Header, Tier};
use wasmtime::Store;

use crate::backend::Backend;
use crate::bindings::fabric::Fabric as FabricExports;
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::payload::{self, MallocBuffer};
use crate::sandbox::{self, Outcome};
use crate::state::HostState;

/// Most frames a fabric may hold unreleased at once, per [`Fabric`].
pub const MAX_LIVE_HANDLES: usize = 1 << 20;

/// An open fabric: one guest instance, safe to call from many threads (one
/// call at a time).
pub struct Fabric {
    policy: Arc<Backend>,
    state: Mutex<State>,
}

struct State {
    instance: Option<FabricInstance>,
    /// Host handle → what was pushed under it, for the live instance.
    handles: HashMap<u64, Pushed>,
    next_handle: u64,
}

/// What the host remembers of a pushed frame.
#[derive(Clone, Copy)]
struct Pushed {
    guest_handle: u64,
    header: [u8; HEADER_LEN],
}

/// A frame pulled from a fabric, verified by the host (strict decode: magic,
/// version, tier, padding, length, no trailing bytes, Blake3 checksum).
pub struct VerifiedFrame {
    bytes: MallocBuffer,
    tier: Tier,
}

impl VerifiedFrame {
    /// The whole frame, header included.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// The body the checksum covers.
    pub fn body(&self) -> &[u8] {
        &self.bytes.as_slice()[HEADER_LEN..]
    }

    /// The tier in the header.
    pub fn tier(&self) -> Tier {
        self.tier
    }
}

impl Fabric {
    /// The fabric `[fabrics.<name>]` of the config file (found as
    /// [`crate::config::locate`] finds it), with its first instance started.
    pub fn open(name: &str) -> Result<Arc<Fabric>, KvError> {
        crate::metrics::serve_from_env();
        let path = crate::config::locate().map_err(KvError::Host)?;
        let config = crate::config::Config::load(&path).map_err(KvError::Host)?;
        let policy = config.fabric(name).map_err(KvError::Host)?;
        Fabric::start(Arc::new(policy)).map(Arc::new)
    }

    /// A fabric running `policy`'s component, which must be a fabric guest.
    /// The first instance starts now, so a broken component fails here.
    pub fn start(policy: Arc<Backend>) -> Result<Fabric, KvError> {
        policy.component.fabric_pre()?;
        let fabric = Fabric {
            policy,
            state: Mutex::new(State {
                instance: None,
                handles: HashMap::new(),
                next_handle: 1,
            }),
        };
        let deadline = fabric.deadline();
        let mut state = fabric.lock();
        fabric.instance(&mut state, deadline)?;
        drop(state);
        Ok(fabric)
    }

    /// The name in logs and metrics (`fabrics.<name>`).
    pub fn name(&self) -> &str {
        &self.policy.name
    }

    /// The guest's label (`nixl-synth`, `tcp`...), cut to a bounded length.
    pub fn label(&self) -> Result<String, KvError> {
        self.operation(
            0,
            |_| 0,
            |state, deadline| {
                let instance = self.instance(state, deadline)?;
                let guest = instance.bindings.kvwasm_fabric_transport();
                let outcome =
                    sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                        guest
                            .call_label(s)
                            .await
                            .map(|l| Ok::<_, KvError>(crate::log_limit::bounded(l)))
                    });
                self.settle(state, outcome)
            },
        )
    }

    /// Hand one encoded frame to the guest; returns a host handle for
    /// [`Fabric::pull`] and [`Fabric::release`].
    ///
    /// The frame's header is checked (strictly) and its length must match
    /// it; the checksum is not recomputed: the caller is host code that
    /// just encoded it, and the receiving side verifies every byte.
    pub fn push(&self, frame: &[u8]) -> Result<u64, KvError> {
        let header = Header::parse(frame, DecodeMode::Strict)
            .map_err(|e| KvError::BadInput(format!("not an MRDN frame: {e}")))?;
        if frame.len() != HEADER_LEN + header.body_len as usize {
            return Err(KvError::BadInput(format!(
                "the frame is {} bytes; its header announces {}",
                frame.len(),
                HEADER_LEN + header.body_len as usize
            )));
        }
        let limit = self.policy.limits.max_payload_bytes();
        if frame.len() as u64 > limit {
            return Err(KvError::Limit(format!(
                "a frame of {} bytes exceeds the fabric's limit of {} MiB",
                frame.len(),
                self.policy.limits.max_payload_mib
            )));
        }
        self.operation(
            frame.len(),
            |_| 0,
            |state, deadline| {
                if state.handles.len() >= MAX_LIVE_HANDLES {
                    return Err(KvError::Limit(format!(
                        "{MAX_LIVE_HANDLES} frames are already pushed and not released"
                    )));
                }
                let instance = self.instance(state, deadline)?;
                let guest = instance.bindings.kvwasm_fabric_transport();
                let outcome =
                    sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                        payload::lend(s, frame, async |s, frame| guest.call_push(s, frame).await)
                            .await?
                    });
                let guest_handle = self.settle(state, outcome)?;
                let handle = state.next_handle;
                state.next_handle += 1;
                state.handles.insert(
                    handle,
                    Pushed {
                        guest_handle,
                        header: frame[..HEADER_LEN]
                            .try_into()
                            .expect("header checked above"),
                    },
                );
                Ok(handle)
            },
        )
    }

    /// The frame the guest returns for `handle`, verified. It may be a
    /// different frame than the one pushed (a transport may hand back a
    /// peer's reply); [`Fabric::pull_echo`] insists on the same one.
    pub fn pull(&self, handle: u64) -> Result<VerifiedFrame, KvError> {
        self.pull_checked(handle, false)
    }

    /// As [`Fabric::pull`], and the frame must be the one pushed under
    /// `handle` (same header, so the same checksum, tier and length): a
    /// guest handing back someone else's frame fails here.
    pub fn pull_echo(&self, handle: u64) -> Result<VerifiedFrame, KvError> {
        self.pull_checked(handle, true)
    }

    fn pull_checked(&self, handle: u64, echo: bool) -> Result<VerifiedFrame, KvError> {
        self.operation(
            0,
            |f: &VerifiedFrame| f.bytes.len(),
            |state, deadline| {
                let pushed = self.live(state, handle)?;
                let instance = self.instance(state, deadline)?;
                let guest = instance.bindings.kvwasm_fabric_transport();
                let outcome = sandbox::run(
                    &mut instance.store,
                    deadline,
                    instance.fuel,
                    async |s| match guest.call_pull(&mut *s, pushed.guest_handle).await? {
                        Ok(frame) => Ok(Ok(payload::take(s, frame)?)),
                        Err(e) => Ok(Err(e)),
                    },
                );
                let bytes = self.settle(state, outcome)?;
                let fail = |what: String| {
                    KvError::Io(format!(
                        "fabric {:?} returned a bad frame for handle {handle}: {what}",
                        self.policy.name
                    ))
                };
                let tier = kvwasm_mrdn::decode_with(bytes.as_slice(), DecodeMode::Strict)
                    .map_err(|e| fail(e.to_string()))?
                    .tier;
                if echo && bytes.as_slice()[..HEADER_LEN] != pushed.header {
                    return Err(fail("not the frame pushed under it".into()));
                }
                Ok(VerifiedFrame { bytes, tier })
            },
        )
    }

    /// Tell the guest to forget `handle`; the host forgets it whatever the
    /// guest answers.
    pub fn release(&self, handle: u64) -> Result<(), KvError> {
        self.operation(
            0,
            |_| 0,
            |state, deadline| {
                let pushed = self.live(state, handle)?;
                state.handles.remove(&handle);
                let instance = self.instance(state, deadline)?;
                let guest = instance.bindings.kvwasm_fabric_transport();
                let outcome =
                    sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                        guest.call_release(s, pushed.guest_handle).await
                    });
                self.settle(state, outcome)
            },
        )
    }

    /// Handles pushed and not yet released.
    pub fn live_handles(&self) -> usize {
        self.lock().handles.len()
    }

    /// What was pushed under `handle`, if the instance that took it lives.
    fn live(&self, state: &State, handle: u64) -> Result<Pushed, KvError> {
        state.handles.get(&handle).copied().ok_or(KvError::NotFound)
    }

    /// The live instance, started if there is none.
    fn instance<'s>(
        &self,
        state: &'s mut State,
        deadline: Deadline,
    ) -> Result<&'s mut FabricInstance, KvError> {
        if state.instance.is_none() {
            state.instance = Some(FabricInstance::start(&self.policy, deadline)?);
        }
        Ok(state.instance.as_mut().expect("just started"))
    }

    /// The result of a call; a lost instance is discarded with its handles.
    fn settle<T>(&self, state: &mut State, outcome: Outcome<T>) -> Result<T, KvError> {
        match outcome {
            Outcome::Returned(result) => result,
            Outcome::Lost(err) => {
                tracing::info!(
                    "fabric {:?}: guest instance discarded after: {err}; a fresh one serves \
                     the next call",
                    self.policy.name
                );
                state.instance = None;
                // Its handles go with it: asked about later they are
                // NotFound, never a frame of the next instance, and they no
                // longer count against the limit.
                state.handles.clear();
                Err(err)
            }
        }
    }

    /// Run one operation under the fabric's deadline and call gate, in a
    /// `fabric_call` span, counted in its metrics.
    fn operation<T>(
        &self,
        bytes_in: usize,
        bytes_out: impl FnOnce(&T) -> usize,
        call: impl FnOnce(&mut State, Deadline) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        let deadline = self.deadline();
        let result = self.policy.enter_call(deadline).and_then(|_slot| {
            let mut state = self.lock();
            call(&mut state, deadline)
        });
        let out = result.as_ref().map_or(0, bytes_out);
        if let Err(e) = &result
            && !e.is_miss()
        {
            crate::log_limit::warn(
                ("fabric call failed", self.policy.name.as_str()),
                format_args!("fabric {:?}: {e}", self.policy.name),
            );
        }
        self.policy
            .metrics
            .record(bytes_in, out, result.as_ref().err());
        result
    }

    fn deadline(&self) -> Deadline {
        Deadline::after_ms(self.policy.limits.call_timeout_ms)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Fabric {
    /// Release what is still pushed, so a transport can free its peer's
    /// memory, within one deadline; then drop the instance.
    fn drop(&mut self) {
        let deadline = self.deadline();
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let Some(instance) = state.instance.as_mut() else {
            return;
        };
        let guest = instance.bindings.kvwasm_fabric_transport();
        for pushed in state.handles.values() {
            if deadline.remaining().is_zero() {
                break;
            }
            let outcome = sandbox::run(&mut instance.store, deadline, instance.fuel, async |s| {
                guest.call_release(s, pushed.guest_handle).await
            });
            if let Outcome::Lost(_) = outcome {
                break;
            }
        }
    }
}

/// One instance of a fabric guest.
struct FabricInstance {
    store: Store<HostState>,
    bindings: FabricExports,
    fuel: Option<u64>,
}

impl FabricInstance {
    fn start(policy: &Backend, deadline: Deadline) -> Result<FabricInstance, KvError> {
        let pre = policy.component.fabric_pre()?;
        let (mut store, fuel) = sandbox::new_store(policy, "")?;
        let started = sandbox::run(&mut store, deadline, fuel, async |s| {
            pre.instantiate_async(s).await.map(Ok::<_, KvError>)
        });
        let bindings = match started {
            Outcome::Returned(result) => result?,
            Outcome::Lost(err) => return Err(err),
        };
        Ok(FabricInstance {
            store,
            bindings,
            fuel,
        })
    }
}
