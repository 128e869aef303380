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
use std::sync::Arc;

use kvwasm_mrdn::{DecodeMode, HEADER_LEN, Header, Tier};

use crate::backend::Backend;
use crate::bindings::fabric::Fabric as FabricBindings;
use crate::deadline::Deadline;
use crate::error::KvError;
use crate::payload::{self, MallocBuffer};
use crate::single::{GuestKind, Instance, OneInstance};

/// Most frames a fabric may hold unreleased at once, per [`Fabric`].
pub const MAX_LIVE_HANDLES: usize = 1 << 20;

/// An open fabric: one guest instance, safe to call from many threads (one
/// call at a time).
pub struct Fabric {
    guest: OneInstance<FabricExports>,
}

/// What the host keeps for the live instance.
struct Handles {
    /// Host handle → what was pushed under it.
    live: HashMap<u64, Pushed>,
    /// Never reused, across instances too: a handle of a lost instance is
    /// never resolved by the next one to some other frame.
    next: u64,
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
        let handles = Handles {
            live: HashMap::new(),
            next: 1,
        };
        Ok(Fabric {
            guest: OneInstance::start(policy, handles)?,
        })
    }

    /// The name in logs and metrics (`fabrics.<name>`).
    pub fn name(&self) -> &str {
        &self.guest.policy().name
    }

    /// The guest's label (`nixl-synth`, `tcp`...), cut to a bounded length.
    pub fn label(&self) -> Result<String, KvError> {
        self.guest.operation(
            0,
            |_| 0,
            |turn| {
                turn.call(async |s, guest| {
                    guest
                        .transport()
                        .call_label(s)
                        .await
                        .map(|l| Ok::<_, KvError>(crate::log_limit::bounded(l)))
                })
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
        let limits = &self.guest.policy().limits;
        if frame.len() as u64 > limits.max_payload_bytes() {
            return Err(KvError::Limit(format!(
                "a frame of {} bytes exceeds the fabric's limit of {} MiB",
                frame.len(),
                limits.max_payload_mib
            )));
        }
        self.guest.operation(
            frame.len(),
            |_| 0,
            |turn| {
                if turn.tied().live.len() >= MAX_LIVE_HANDLES {
                    return Err(KvError::Limit(format!(
                        "{MAX_LIVE_HANDLES} frames are already pushed and not released"
                    )));
                }
                let guest_handle = turn.call(async |s, guest| {
                    payload::resource::lend(s, frame, async |s, frame| {
                        guest.transport().call_push(s, frame).await
                    })
                    .await?
                })?;
                let handles = turn.tied();
                let handle = handles.next;
                handles.next += 1;
                handles.live.insert(
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
        self.guest.operation(
            0,
            |f: &VerifiedFrame| f.bytes.len(),
            |turn| {
                let pushed = live(turn.tied(), handle)?;
                let bytes = turn.call(async |s, guest| {
                    match guest
                        .transport()
                        .call_pull(&mut *s, pushed.guest_handle)
                        .await?
                    {
                        Ok(frame) => Ok(Ok(payload::resource::take(s, frame)?.into_block()?)),
                        Err(e) => Ok(Err(e)),
                    }
                })?;
                let fail = |what: String| {
                    KvError::Io(format!(
                        "fabric {:?} returned a bad frame for handle {handle}: {what}",
                        self.name()
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
        self.guest.operation(
            0,
            |_| 0,
            |turn| {
                let pushed = live(turn.tied(), handle)?;
                turn.tied().live.remove(&handle);
                turn.call(async |s, guest| {
                    guest.transport().call_release(s, pushed.guest_handle).await
                })
            },
        )
    }

    /// Handles pushed and not yet released.
    pub fn live_handles(&self) -> usize {
        self.guest.with_tied(|handles| handles.live.len())
    }
}

/// What was pushed under `handle`, if the instance that took it lives.
fn live(handles: &Handles, handle: u64) -> Result<Pushed, KvError> {
    handles.live.get(&handle).copied().ok_or(KvError::NotFound)
}

impl Drop for Fabric {
    /// Release what is still pushed, so a transport can free its peer's
    /// memory, within one deadline; a lost instance is not restarted for it.
    fn drop(&mut self) {
        let mut turn = self.guest.last_turn();
        let pushed: Vec<u64> = turn.tied().live.values().map(|p| p.guest_handle).collect();
        for guest_handle in pushed {
            if !turn.is_live() || turn.expired() {
                break;
            }
            let _ =
                turn.call(async |s, guest| guest.transport().call_release(s, guest_handle).await);
        }
    }
}

/// The exports of one fabric instance.
struct FabricExports(FabricBindings);

impl FabricExports {
    fn transport(&self) -> &crate::bindings::fabric::exports::kvwasm::fabric::transport::Guest {
        self.0.kvwasm_fabric_transport()
    }
}

impl GuestKind for FabricExports {
    const KIND: &'static str = "fabric";
    type Tied = Handles;

    fn start(policy: &Backend, deadline: Deadline) -> Result<Instance<Self>, KvError> {
        let pre = policy.component.fabric_pre()?;
        Instance::start(policy, deadline, async |s| {
            pre.instantiate_async(s).await.map(FabricExports)
        })
    }

    /// The lost instance's handles go with it: asked about later they are
    /// `NotFound`, and they no longer count against the limit.
    fn discarded(handles: &mut Handles) {
        handles.live.clear();
    }
}
