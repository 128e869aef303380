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
//! `kv-crash-writer LIB URI stage SEED`: put the chunks of slot SEED
//! ([`staged_chunks`]), print `staged N`, and wait to be killed: a writer
//! that dies between its chunks and its manifest, leaving them unsynced.
//! `kv-crash-writer LIB URI publish SEED`: put the same chunks (finding them
//! in place) and publish `slot-0` naming them; prints
//! `published slot-0 chunks=N dup=D`.
//!
//! `kv-crash-writer LIB URI check`: audit the store with a fresh handle and
//! print the report (`kvwasm_tests::crash::CheckReport`).
//!
//! `kv-crash-writer LIB URI publish-race THREADS SECONDS`: no kill needed.
//! THREADS threads save small slots (three fresh chunks, then a manifest)
//! on one handle; after each `put_manifest` a second handle reads the
//! chunks back, as a concurrent restore would. Prints `missing T N HEX` for
//! each chunk not visible after its manifest, then `raced saves=S missing=M`.

use kv_store_abi::{Handle, Library};
use kvwasm_tests::crash::{
    ChunkRef, Rng, SLOTS, check, chunk_content, encode_manifest, save_ids, slot_name, staged_chunks,
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
        ("stage", [seed]) => {
            let chunks = staged_chunks(number(seed));
            for content in &chunks {
                if let Err(rc) = store.put_chunk(&kvwasm_tests::xxh3_key(content), content) {
                    fail("put_chunk", rc);
                }
            }
            println!("staged {}", chunks.len());
            loop {
                std::thread::park();
            }
        }
        ("publish", [seed]) => {
            let contents = staged_chunks(number(seed));
            let mut dup = 0;
            for content in &contents {
                match store.put_chunk(&kvwasm_tests::xxh3_key(content), content) {
                    Ok(present) => dup += usize::from(present),
                    Err(rc) => fail("put_chunk", rc),
                }
            }
            let chunks: Vec<ChunkRef> = contents
                .iter()
                .map(|c| (kvwasm_tests::xxh3_key(c), c.len()))
                .collect();
            let name = slot_name(0);
            let manifest = encode_manifest(&name, &format!("publish/{seed}"), &chunks);
            ok(store.put_manifest(&name, &manifest), "put_manifest");
            println!("published {name} chunks={} dup={dup}", chunks.len());
        }
        ("publish-race", [threads, seconds]) => {
            let reader = lib.open_store(uri).expect("open a second handle");
            let (saves, missing) = publish_race(
                &store,
                &reader,
                number(threads),
                std::time::Duration::from_secs(number(seconds)),
            );
            println!("raced saves={saves} missing={missing}");
        }
        _ => usage(),
    }
}

/// Save from `threads` threads on `store` for `time`, reading every save's
/// chunks back through `reader` once its manifest is published. Returns
/// (saves, chunks missing after their manifest).
fn publish_race(
    store: &Handle<'_>,
    reader: &Handle<'_>,
    threads: u64,
    time: std::time::Duration,
) -> (u64, u64) {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let end = std::time::Instant::now() + time;
    let (saves, missing) = (AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for thread in 0..threads {
            let (saves, missing) = (&saves, &missing);
            s.spawn(move || {
                let name = format!("race-{thread}");
                for save in 0.. {
                    if std::time::Instant::now() >= end {
                        break;
                    }
                    let keys: Vec<[u8; 8]> = (0..3)
                        .map(|i| {
                            let data = kvwasm_tests::pattern(64, thread << 40 | save << 2 | i);
                            let key = kvwasm_tests::xxh3_key(&data);
                            if let Err(rc) = store.put_chunk(&key, &data) {
                                fail("put_chunk", rc);
                            }
                            key
                        })
                        .collect();
                    ok(store.put_manifest(&name, &keys.concat()), "put_manifest");
                    for key in keys {
                        if reader.get_chunk(&key).is_err() {
                            println!("missing {thread} {save} {}", hex::encode(key));
                            missing.fetch_add(1, Relaxed);
                        }
                    }
                    saves.fetch_add(1, Relaxed);
                }
            });
        }
    });
    (saves.into_inner(), missing.into_inner())
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
        "usage: kv-crash-writer LIB URI (write SEED EPOCH [manifest-first|torn-manifest] \
         | stage SEED | publish SEED | check | publish-race THREADS SECONDS)"
    );
    std::process::exit(2);
}
