//! `kv-crash-writer LIB URI write SEED EPOCH [MODE]`: a consumer that opens
//! URI through the kv_store_v1 library LIB and saves llama.cpp-like slots
//! from two threads on one handle until it is killed. One line per step:
//! `open ok`, `seed SEED epoch EPOCH`, then `saved T NAME chunks=N dup=D` and
//! `deleted T NAME`. Any failed call ends the process with status 1.
//!
//! MODE breaks the save order on purpose, for the checker's self-test only:
//! `manifest-first` publishes the manifest before its chunks;
//! `torn-manifest` publishes half of the manifest before the chunks and the
//! whole after, as a backend writing manifests in place would. Both print
//! `published T NAME` once the early manifest is visible.
//!
//! `kv-crash-writer LIB URI check`: audit the store with a fresh handle and
//! print the report (`kvwasm_tests::crash::CheckReport`).

use kv_store_abi::{Handle, Library};
use kvwasm_tests::crash::{
    ChunkRef, Rng, SLOTS, check, chunk_content, encode_manifest, save_ids, slot_name,
};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Correct,
    ManifestFirst,
    TornManifest,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lib, uri, command, rest @ ..] = args.as_slice() else {
        usage()
    };
    let lib = Library::open(lib.as_ref()).unwrap_or_else(|e| panic!("{e}"));
    let Some(store) = lib.open_store(uri) else {
        println!("open NULL");
        std::process::exit(2);
    };
    println!("open ok");
    match (command.as_str(), rest) {
        ("check", []) => {
            for line in check(&store).to_lines() {
                println!("{line}");
            }
        }
        ("write", [seed, epoch, mode @ ..]) => {
            let mode = match mode {
                [] => Mode::Correct,
                [m] if m == "manifest-first" => Mode::ManifestFirst,
                [m] if m == "torn-manifest" => Mode::TornManifest,
                _ => usage(),
            };
            let (seed, epoch) = (number(seed), number(epoch));
            println!("seed {seed} epoch {epoch}");
            std::thread::scope(|s| {
                for thread in 0..2 {
                    let store = &store;
                    s.spawn(move || write_forever(store, seed, epoch, thread, mode));
                }
            });
        }
        _ => usage(),
    }
}

/// Save (and now and then delete) slots until killed.
fn write_forever(store: &Handle<'_>, seed: u64, epoch: u64, thread: u64, mode: Mode) -> ! {
    let mut rng = Rng::new(seed ^ thread.wrapping_mul(0xA076_1D64_78BD_642F));
    for seq in 0u64.. {
        let name = slot_name(rng.range(0, SLOTS as u64) as usize);
        if rng.range(0, 10) == 0 {
            ok(store.delete_manifest(&name), "delete_manifest");
            println!("deleted {thread} {name}");
            continue;
        }
        let contents: Vec<Vec<u8>> = save_ids(&mut rng, epoch)
            .into_iter()
            .map(chunk_content)
            .collect();
        let chunks: Vec<ChunkRef> = contents
            .iter()
            .map(|c| (kvwasm_tests::xxh3_key(c), c.len()))
            .collect();
        let writer = format!("{seed}/{epoch}/{thread}/{seq}");
        let manifest = encode_manifest(&name, &writer, &chunks);
        let early = match mode {
            Mode::Correct => None,
            Mode::ManifestFirst => Some(&manifest[..]),
            Mode::TornManifest => Some(&manifest[..manifest.len() / 2]),
        };
        if let Some(early) = early {
            ok(store.put_manifest(&name, early), "put_manifest");
            println!("published {thread} {name}");
        }
        let mut dup = 0;
        for (content, (key, _)) in contents.iter().zip(&chunks) {
            match store.put_chunk(key, content) {
                Ok(present) => dup += usize::from(present),
                Err(rc) => fail("put_chunk", rc),
            }
        }
        if mode != Mode::ManifestFirst {
            ok(store.put_manifest(&name, &manifest), "put_manifest");
        }
        println!("saved {thread} {name} chunks={} dup={dup}", chunks.len());
    }
    unreachable!("saves forever")
}

fn ok(result: Result<(), i32>, what: &str) {
    if let Err(rc) = result {
        fail(what, rc);
    }
}

fn fail(what: &str, rc: i32) -> ! {
    eprintln!("kv-crash-writer: {what} failed with {rc}");
    std::process::exit(1);
}

fn number(s: &str) -> u64 {
    s.parse().unwrap_or_else(|_| usage())
}

fn usage() -> ! {
    eprintln!(
        "usage: kv-crash-writer LIB URI (write SEED EPOCH [manifest-first|torn-manifest] | check)"
    );
    std::process::exit(2);
}
