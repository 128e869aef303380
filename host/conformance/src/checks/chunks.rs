//! Chunks: content-addressed, immutable, byte-identical.

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Finding, Outcome, short_hex, violated};

pub const PUT_CHUNK_IDEMPOTENT: Check = Check {
    name: "put-chunk-idempotent",
    level: Level::Must,
    rule: "put_chunk is idempotent on duplicate hashes: returns 0 on success, 1 if the chunk \
           already existed (the consumer counts these as dedup hits), with no side effects.",
    quick: true,
    run: put_chunk_idempotent,
};

fn put_chunk_idempotent(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    let hash = ctx.key("c", 0, 8);
    let original = ctx.data("c", 0, 64 * 1024);
    ctx.put_new_chunk(&h, &hash, &original)?;
    let again =
        |h: &kv_store_abi::Handle<'_>, data: &[u8], when: &str| match h.put_chunk(&hash, data) {
            Ok(true) => Ok(()),
            Ok(false) => Err(violated(format!(
                "put_chunk of a present hash returned 0 instead of 1 ({when})"
            ))),
            Err(rc) => Err(violated(format!(
                "put_chunk of a present hash returned {rc} ({when})"
            ))),
        };
    again(&h, &original, "same handle, same bytes")?;
    // A duplicate put is a no-op even when the caller's bytes differ.
    again(
        &h,
        &ctx.data("other", 0, 64 * 1024),
        "same handle, different bytes",
    )?;
    ctx.expect_chunk(&h, &hash, &original)?;
    // Once published, another handle sees the chunk as present too.
    ctx.put_manifest(&h, &ctx.name("m"), &hash)?;
    let other = ctx.open()?;
    again(&other, &original, "second handle, after put_manifest")?;
    ctx.expect_chunk(&other, &hash, &original)?;
    let _ = h.delete_manifest(&ctx.name("m"));
    Ok("0 then 1 (same handle, different bytes, second handle); bytes unchanged".into())
}

pub const ROUND_TRIP_SIZES: Check = Check {
    name: "round-trip-sizes",
    level: Level::Must,
    rule: "The buffer's bytes MUST be byte-identical to what was passed in to put_chunk.",
    quick: true,
    run: round_trip_sizes,
};

fn round_trip_sizes(ctx: &Ctx<'_>) -> Outcome {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    let mut sizes = vec![0, 1, 7, 4 * KIB - 1, 4 * KIB, 64 * KIB + 3, MIB];
    if !ctx.quick {
        sizes.extend([16 * MIB, 64 * MIB]);
    }
    let h = ctx.open()?;
    for (i, &size) in sizes.iter().enumerate() {
        let (hash, data) = (ctx.key("c", i as u64, 8), ctx.data("c", i as u64, size));
        ctx.put_new_chunk(&h, &hash, &data)?;
        ctx.expect_chunk(&h, &hash, &data)
            .map_err(|f| with_context(f, &format!("{size}-byte chunk")))?;
    }
    Ok(format!("sizes {} bytes round-trip exactly", list(&sizes)))
}

pub const HASH_LENGTHS: Check = Check {
    name: "hash-lengths",
    level: Level::Must,
    rule: "Chunks are keyed by raw hash bytes the consumer chose (llama.cpp: 8-byte xxh3-64; \
           oMLX: 32-byte SHA-256): never hard-code a hash length, accept 1..=64 bytes.",
    quick: true,
    run: hash_lengths,
};

/// `put_chunk` of a hash an earlier run on the same store may have stored:
/// the bytes the store must then give back (its own for that hash, else
/// `data`).
fn put_maybe_seen(
    ctx: &Ctx<'_>,
    h: &kv_store_abi::Handle<'_>,
    hash: &[u8],
    data: Vec<u8>,
) -> Result<Vec<u8>, Finding> {
    match h.put_chunk(hash, &data) {
        Ok(true) => Ok(ctx.get_chunk(h, hash).unwrap_or_default()),
        Ok(false) => Ok(data),
        Err(rc) => Err(violated(format!(
            "put_chunk({}, {} bytes) returned {rc}",
            short_hex(hash),
            data.len()
        ))),
    }
}

fn hash_lengths(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    let mut stored = Vec::new();
    for len in 1..=64usize {
        let (hash, data) = (
            ctx.key("c", len as u64, len),
            ctx.data("c", len as u64, 512 + len),
        );
        // A 1- or 2-byte hash has at most 65,536 values: an earlier run on
        // the same store may have taken this one.
        let data = if len <= 2 {
            put_maybe_seen(ctx, &h, &hash, data)?
        } else {
            ctx.put_new_chunk(&h, &hash, &data)?;
            data
        };
        stored.push((hash, data));
    }
    // Hashes that are prefixes of one another, or all zero bytes, are
    // distinct keys: no truncation, no C-string handling of binary keys.
    let long = ctx.key("prefix", 0, 32);
    for len in [4usize, 8, 16, 32] {
        let data = ctx.data("prefix", len as u64, 256);
        ctx.put_new_chunk(&h, &long[..len], &data)?;
        stored.push((long[..len].to_vec(), data));
    }
    let zeros = vec![0u8; 8];
    let data = put_maybe_seen(ctx, &h, &zeros, ctx.data("zeros", 0, 256))?;
    stored.push((zeros, data));
    for (hash, data) in &stored {
        ctx.expect_chunk(&h, hash, data)?;
    }
    Ok(format!(
        "{} keys: lengths 1..=64, nested prefixes, all-zero bytes",
        stored.len()
    ))
}

pub const MISSING_CHUNK: Check = Check {
    name: "missing-chunk",
    level: Level::Must,
    rule: "get_chunk returns 0 on success, <0 on error or missing chunk.",
    quick: true,
    run: missing_chunk,
};

fn missing_chunk(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    for len in [8, 32] {
        let hash = ctx.key("never-put", 0, len);
        if let Ok(got) = ctx.get_chunk(&h, &hash) {
            return Err(violated(format!(
                "get_chunk of never-put hash {} returned 0 with {} bytes",
                short_hex(&hash),
                got.len()
            )));
        }
    }
    Ok("never-put hashes (8 and 32 bytes) give <0".into())
}

pub const PREFETCH: Check = Check {
    name: "prefetch",
    level: Level::Must,
    rule: "prefetch_chunks (v2) is a hint: n_hashes contiguous hash_len-byte keys; failure is \
           non-fatal, and get_chunk afterwards returns exactly the stored bytes (or <0 if missing).",
    quick: true,
    run: prefetch,
};

fn prefetch(ctx: &Ctx<'_>) -> Outcome {
    if !ctx.lib.has_prefetch() {
        return Err(Finding::NotApplicable(
            "vtable version 1: no prefetch_chunks".into(),
        ));
    }
    let h = ctx.open()?;
    let present: Vec<(Vec<u8>, Vec<u8>)> = (0..6)
        .map(|i| (ctx.key("c", i, 8), ctx.data("c", i, 32 * 1024 + i as usize)))
        .collect();
    for (hash, data) in &present {
        ctx.put_new_chunk(&h, hash, data)?;
    }
    ctx.put_manifest(&h, &ctx.name("m"), b"prefetch")?;
    let missing = ctx.key("never-put", 0, 8);
    let mut notes = Vec::new();
    let mut run = |label: &str, hashes: Vec<&[u8]>| {
        let rc = h.prefetch_chunks(&hashes).err().unwrap_or(0);
        notes.push(format!("{label} → {rc}"));
    };
    run(
        "present",
        present.iter().map(|(k, _)| k.as_slice()).collect(),
    );
    run(
        "present+missing",
        vec![&present[0].0, &missing, &present[1].0],
    );
    run(
        "duplicates",
        vec![&present[2].0, &present[2].0, &present[3].0, &present[2].0],
    );
    run("empty list", Vec::new());
    // The hint must not change what a get returns, in either direction.
    for (hash, data) in &present {
        ctx.expect_chunk(&h, hash, data)?;
    }
    if ctx.get_chunk(&h, &missing).is_ok() {
        return Err(violated(
            "after prefetch, get_chunk of a missing hash returned 0",
        ));
    }
    let _ = h.delete_manifest(&ctx.name("m"));
    Ok(format!(
        "prefetch {}; every get afterwards exact",
        notes.join(", ")
    ))
}

fn with_context(finding: Finding, context: &str) -> Finding {
    match finding {
        Finding::Violated(why) => Finding::Violated(format!("{context}: {why}")),
        other => other,
    }
}

fn list(sizes: &[usize]) -> String {
    sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
