//! Manifests: name-addressed, mutable, atomic, and the visibility rule
//! that ties them to chunks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Outcome, violated};

pub const MISSING_MANIFEST: Check = Check {
    name: "missing-manifest",
    level: Level::Must,
    rule: "get_manifest: same shape as get_chunk — <0 on error or missing manifest.",
    quick: true,
    run: missing_manifest,
};

fn missing_manifest(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    match ctx.get_manifest(&h, &ctx.name("never-put")) {
        Ok(got) => Err(violated(format!(
            "get_manifest of a never-put name returned 0 with {} bytes",
            got.len()
        ))),
        Err(rc) => Ok(format!("never-put name gives {rc}")),
    }
}

pub const DELETE_MISSING_MANIFEST: Check = Check {
    name: "delete-missing-manifest",
    level: Level::Must,
    rule: "delete_manifest: best-effort delete. Not finding the key is success, not failure.",
    quick: true,
    run: delete_missing_manifest,
};

fn delete_missing_manifest(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    match h.delete_manifest(&ctx.name("never-put")) {
        Ok(()) => Ok("deleting a never-put name returns 0".into()),
        Err(rc) => Err(violated(format!(
            "delete_manifest of a never-put name returned {rc}"
        ))),
    }
}

pub const MANIFEST_LIFECYCLE: Check = Check {
    name: "manifest-lifecycle",
    level: Level::Must,
    rule: "put_manifest publishes data under name; get_manifest returns it; a second put \
           replaces it; delete_manifest removes it. Large manifests exist (oMLX stores a JSON \
           index as a manifest).",
    quick: true,
    run: manifest_lifecycle,
};

fn manifest_lifecycle(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    let name = ctx.name("m");
    let (first, second) = (ctx.data("m", 1, 300), ctx.data("m", 2, 4 * 1024 * 1024));
    ctx.put_manifest(&h, &name, &first)?;
    ctx.expect_manifest(&h, &name, &first)?;
    ctx.put_manifest(&h, &name, &second)?;
    ctx.expect_manifest(&h, &name, &second)?;
    // Names llama.cpp and oMLX really use.
    for real in ["slot0.bin", "__omlx_index__"] {
        let name = format!("{}-{real}", ctx.name("n"));
        ctx.put_manifest(&h, &name, real.as_bytes())?;
        ctx.expect_manifest(&h, &name, real.as_bytes())?;
        let _ = h.delete_manifest(&name);
    }
    h.delete_manifest(&name)
        .map_err(|rc| violated(format!("delete_manifest of a present name returned {rc}")))?;
    if ctx.get_manifest(&h, &name).is_ok() {
        return Err(violated("get_manifest after delete_manifest returned 0"));
    }
    Ok("put, replace (300 B → 4 MiB), delete; `__`-prefixed names work".into())
}

pub const EMPTY_MANIFEST: Check = Check {
    name: "empty-manifest",
    level: Level::Must,
    rule: "Zero-length manifests are written on purpose (oMLX writes an empty __omlx_index__ to \
           force buffered chunks to flush): every put_manifest flushes all pending chunks of the \
           handle, whether or not the manifest references them.",
    quick: true,
    run: empty_manifest,
};

fn empty_manifest(ctx: &Ctx<'_>) -> Outcome {
    let writer = ctx.open()?;
    let reader = ctx.open()?;
    let chunks: Vec<_> = (0..4)
        .map(|i| (ctx.key("c", i, 32), ctx.data("c", i, 8192)))
        .collect();
    for (hash, data) in &chunks {
        ctx.put_new_chunk(&writer, hash, data)?;
    }
    let name = ctx.name("empty");
    ctx.put_manifest(&writer, &name, &[])?;
    ctx.expect_manifest(&reader, &name, &[])?;
    for (hash, data) in &chunks {
        ctx.expect_chunk(&reader, hash, data)?;
    }
    let _ = writer.delete_manifest(&name);
    Ok("an empty manifest reads back empty and publishes the handle's pending chunks".into())
}

pub const VISIBILITY: Check = Check {
    name: "visibility",
    level: Level::Must,
    rule: "After put_manifest returns successfully, every chunk previously put_chunk'd on this \
           handle MUST be readable — by a different reader too.",
    quick: true,
    run: visibility,
};

fn visibility(ctx: &Ctx<'_>) -> Outcome {
    // The reader is open before anything is written: no stale cache may hide
    // what the writer publishes.
    let reader = ctx.open()?;
    let writer = ctx.open()?;
    let saves = ctx.pick(2, 4);
    let per_save = 24u64;
    for save in 0..saves {
        let chunks: Vec<_> = (0..per_save)
            .map(|i| {
                let n = save * per_save + i;
                (
                    ctx.key("c", n, 8),
                    ctx.data("c", n, 1024 * (1 + n as usize % 64)),
                )
            })
            .collect();
        for (hash, data) in &chunks {
            ctx.put_new_chunk(&writer, hash, data)?;
        }
        let name = ctx.name(&format!("save{save}"));
        let manifest: Vec<u8> = chunks.iter().flat_map(|(h, _)| h.clone()).collect();
        ctx.put_manifest(&writer, &name, &manifest)?;
        ctx.expect_manifest(&reader, &name, &manifest)?;
        for (hash, data) in &chunks {
            ctx.expect_chunk(&reader, hash, data)?;
        }
        let _ = writer.delete_manifest(&name);
    }
    Ok(format!(
        "{saves} saves of {per_save} chunks: a second handle read every manifest and chunk"
    ))
}

pub const MANIFEST_ATOMICITY: Check = Check {
    name: "manifest-atomicity",
    level: Level::Must,
    rule: "put_manifest is atomic: a concurrent reader either sees the previous value of the \
           manifest or the new value, never a partial write.",
    quick: true,
    run: manifest_atomicity,
};

/// A self-describing manifest value: `[seq u64][len u64]` then bytes
/// derived from `seq`; lengths vary so a torn write shows as a bad length.
fn atomic_value(ctx: &Ctx<'_>, seq: u64) -> Vec<u8> {
    let len = 16 + (seq as usize * 7919) % (48 * 1024);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&seq.to_le_bytes());
    v.extend_from_slice(&(len as u64).to_le_bytes());
    v.extend_from_slice(&ctx.data("v", seq, len - 16));
    v
}

fn manifest_atomicity(ctx: &Ctx<'_>) -> Outcome {
    let writer = ctx.open()?;
    let other = ctx.open()?;
    let name = ctx.name("m");
    let replacements = ctx.pick(300u64, 2000);
    ctx.put_manifest(&writer, &name, &atomic_value(ctx, 0))?;
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let torn: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);
    let write_error = std::thread::scope(|s| {
        // Two readers on the writer's handle, one on a second handle.
        for reader in [&writer, &writer, &other] {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    let verdict = match ctx.get_manifest(reader, &name) {
                        Err(rc) => Some(format!("get_manifest returned {rc} while replaced")),
                        Ok(got) => check_value(ctx, &got),
                    };
                    reads.fetch_add(1, Ordering::Relaxed);
                    if let Some(why) = verdict {
                        *torn.lock().unwrap_or_else(|e| e.into_inner()) = Some(why);
                        done.store(true, Ordering::Release);
                    }
                }
            });
        }
        let mut error = None;
        for seq in 1..=replacements {
            if done.load(Ordering::Acquire) {
                break;
            }
            if let Err(e) = ctx.put_manifest(&writer, &name, &atomic_value(ctx, seq)) {
                error = Some(e);
                break;
            }
        }
        done.store(true, Ordering::Release);
        error
    });
    let _ = writer.delete_manifest(&name);
    if let Some(e) = write_error {
        return Err(e);
    }
    let reads = reads.into_inner();
    match torn.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(why) => Err(violated(format!("a concurrent reader saw {why}"))),
        None => Ok(format!(
            "{replacements} replacements (16 B–48 KiB) under {reads} concurrent reads: never torn"
        )),
    }
}

/// `None` when `got` is one complete value.
fn check_value(ctx: &Ctx<'_>, got: &[u8]) -> Option<String> {
    if got.len() < 16 {
        return Some(format!("a {}-byte partial value", got.len()));
    }
    let seq = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
    let len = u64::from_le_bytes(got[8..16].try_into().expect("8 bytes")) as usize;
    if len != got.len() {
        return Some(format!(
            "a torn value: version {seq} is {len} bytes, {} were read",
            got.len()
        ));
    }
    (got != atomic_value(ctx, seq).as_slice())
        .then(|| format!("version {seq} with corrupted contents"))
}

pub const DURABLE_ACROSS_REOPEN: Check = Check {
    name: "durable-across-reopen",
    level: Level::Should,
    rule: "Backends persist KV state over a durable substrate: what was published is still there \
           after every handle is closed and the URI is opened again.",
    quick: true,
    run: durable_across_reopen,
};

fn durable_across_reopen(ctx: &Ctx<'_>) -> Outcome {
    let (hash, data) = (ctx.key("c", 0, 8), ctx.data("c", 0, 4096));
    let name = ctx.name("m");
    {
        let h = ctx.open()?;
        ctx.put_new_chunk(&h, &hash, &data)?;
        ctx.put_manifest(&h, &name, &hash)?;
    }
    let h = ctx.open()?;
    if ctx.get_manifest(&h, &name).is_err() || ctx.get_chunk(&h, &hash).is_err() {
        return Err(violated(
            "the manifest or chunk was gone after close and reopen (an in-memory backend?)",
        ));
    }
    ctx.expect_manifest(&h, &name, &hash)?;
    ctx.expect_chunk(&h, &hash, &data)?;
    let _ = h.delete_manifest(&name);
    Ok("manifest and chunk survive close and reopen".into())
}
