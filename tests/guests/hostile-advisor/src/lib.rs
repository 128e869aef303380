//! A deliberately hostile storage advisor, for tests only. It remembers
//! the hashes it observes (up to 100 000) and obeys the last command it
//! saw as an access's manifest name; `advise` then answers:
//!
//! | manifest    | `advise` answers                                           |
//! |-------------|------------------------------------------------------------|
//! | `!evict`    | evict every known hash from every tier it was seen in      |
//! | `!unknown`  | promote, demote and evict 1000 hashes it never saw         |
//! | `!storm`    | demote every known hash from tier 0 and promote it back    |
//! | `!huge`     | 100 000 advice records of 1000 hashes each (traps on memory)|
//! | `!alias`    | one 1 MiB buffer named as 100 hashes (100 MiB to copy)     |
//! | `!bighash`  | advice naming 64 KiB and empty hashes                      |
//! | `!tier`     | advice on tier 4 000 000 000                               |
//! | `!panic`    | panics (trap)                                              |
//! | `!loop`     | spins forever (deadline)                                   |
//! | `!fds`      | opens `/data/fd-target` until refused and keeps every descriptor; no advice |
//!
//! No command: no advice. No settings. The store's moves (`observe-moves`)
//! are ignored.

use std::cell::RefCell;

use kvwasm_advisor_bindings::exports::kvwasm::events::advisor::{
    self, Action, Advice, ChunkAccess, TierUsage,
};
use kvwasm_advisor_bindings::exports::kvwasm::events::{advisor_moves, subscriber};
use kvwasm_advisor_bindings::kvwasm::events::types;

/// Hashes remembered at most.
const MAX_KNOWN: usize = 100_000;

#[derive(Default)]
struct State {
    /// Known hashes with the tier each was last seen in.
    known: Vec<(Vec<u8>, u32)>,
    command: String,
    /// Descriptors opened by `!fds`, kept for the instance's life.
    files: Vec<std::fs::File>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

struct Hostile;

impl subscriber::Guest for Hostile {
    fn on_batch(_events: Vec<types::Event>) -> Result<(), String> {
        Ok(())
    }
}

impl advisor::Guest for Hostile {
    fn observe(accesses: Vec<ChunkAccess>) {
        STATE.with_borrow_mut(|state| {
            for a in accesses {
                if let Some(command) = a.manifest.as_deref().filter(|m| m.starts_with('!')) {
                    state.command = command.to_owned();
                }
                if state.known.len() < MAX_KNOWN && !state.known.iter().any(|(h, _)| *h == a.hash) {
                    state.known.push((a.hash, a.tier));
                }
            }
        })
    }

    fn advise(_usage: Vec<TierUsage>, _now_ms: u64) -> Vec<Advice> {
        STATE.with_borrow_mut(|state| {
            if state.command == "!fds" {
                // Everything the host lets it open, held: the share of the
                // process's descriptors it could starve others of.
                while let Ok(file) = std::fs::File::open("/data/fd-target") {
                    state.files.push(file);
                }
                eprintln!("hostile advisor: holding {} descriptors", state.files.len());
                return Vec::new();
            }
            let known = || {
                state
                    .known
                    .iter()
                    .map(|(h, _)| h.clone())
                    .collect::<Vec<_>>()
            };
            let advice = |action, tier, hashes| Advice {
                action,
                tier,
                hashes,
            };
            match state.command.as_str() {
                "!evict" => state
                    .known
                    .iter()
                    .map(|(h, tier)| advice(Action::Evict, *tier, vec![h.clone()]))
                    .chain([0, 1].map(|tier| advice(Action::Evict, tier, known())))
                    .collect(),
                "!unknown" => {
                    let strangers: Vec<Vec<u8>> = (0u32..1000)
                        .map(|i| [b"never".as_slice(), &i.to_be_bytes()].concat())
                        .collect();
                    [Action::Promote, Action::Demote, Action::Evict]
                        .map(|a| advice(a, 0, strangers.clone()))
                        .into()
                }
                "!storm" => vec![
                    advice(Action::Demote, 0, known()),
                    advice(Action::Promote, 1, known()),
                ],
                "!huge" => (0..100_000)
                    .map(|_| advice(Action::Demote, 0, vec![vec![7u8; 32]; 1000]))
                    .collect(),
                "!alias" => {
                    // The canonical ABI lets every list point at the same
                    // bytes: 1 MiB of guest memory, 100 MiB for the host.
                    let buf: &'static mut [u8] = Vec::leak(vec![3u8; 1 << 20]);
                    let hashes = (0..100)
                        .map(|_| unsafe {
                            Vec::from_raw_parts(buf.as_mut_ptr(), buf.len(), buf.len())
                        })
                        .collect();
                    vec![advice(Action::Demote, 0, hashes)]
                }
                "!bighash" => vec![advice(
                    Action::Demote,
                    0,
                    vec![vec![1u8; 65536], Vec::new()],
                )],
                "!tier" => vec![advice(Action::Demote, 4_000_000_000, known())],
                "!panic" => panic!("hostile advisor: panic on command"),
                "!loop" => loop {
                    std::hint::black_box(0u64);
                },
                _ => Vec::new(),
            }
        })
    }
}

impl advisor_moves::Guest for Hostile {
    fn observe_moves(_moves: Vec<advisor_moves::ChunkMove>) {}
}

kvwasm_advisor_bindings::export_advisor!(Hostile);
