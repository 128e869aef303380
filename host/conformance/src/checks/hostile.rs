//! Hostile and malformed inputs: rejected with `<0`, never a crash, and the
//! handle keeps working.

use std::ffi::CString;
use std::ptr::{null, null_mut};

use kv_store_abi::{Handle, KvStore};

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Finding, Outcome, violated};

pub const HOSTILE_INPUTS: Check = Check {
    name: "hostile-inputs",
    level: Level::Must,
    rule: "Every bad input (NULL pointers with zero and non-zero lengths, hash_len 0, very long \
           names, names with '/' or '..') is answered with <0 and no crash; a backend must reject \
           dangerous names itself. prefetch_chunks with NULL hashes or hash_len 0 must not \
           crash either (its return code is the SHOULD `prefetch-bad-arguments`).",
    quick: true,
    run: hostile_inputs,
};

fn hostile_inputs(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    let s: *mut KvStore = h.as_ptr();
    let vt = ctx.lib.vtable();
    let (put_chunk, get_chunk) = (vt.put_chunk.expect("v1"), vt.get_chunk.expect("v1"));
    let (put_manifest, get_manifest) = (vt.put_manifest.expect("v1"), vt.get_manifest.expect("v1"));
    let delete_manifest = vt.delete_manifest.expect("v1");

    // A present chunk and manifest, so failures below are due to the bad
    // argument, not to a miss.
    let (hash, data) = (ctx.key("c", 0, 8), ctx.data("c", 0, 1024));
    ctx.put_new_chunk(&h, &hash, &data)?;
    let present = ctx.name("present");
    ctx.put_manifest(&h, &present, b"present")?;
    let present_c = CString::new(present.clone()).expect("no NUL");

    let mut accepted: Vec<String> = Vec::new();
    let mut expect_err = |what: &str, rc: i32| {
        if rc >= 0 {
            accepted.push(format!("{what} → {rc}"));
        }
    };
    let (mut out, mut out_len) = (null_mut::<u8>(), 0usize);
    // SAFETY: the arguments of every call below are either valid or the
    // deliberately NULL/zero values under test; nothing dangles.
    unsafe {
        expect_err(
            "put_chunk(hash NULL, len 8)",
            put_chunk(s, null(), 8, data.as_ptr(), data.len()),
        );
        expect_err(
            "put_chunk(hash NULL, len 0)",
            put_chunk(s, null(), 0, data.as_ptr(), data.len()),
        );
        expect_err(
            "put_chunk(hash_len 0)",
            put_chunk(s, hash.as_ptr(), 0, data.as_ptr(), data.len()),
        );
        expect_err(
            "put_chunk(data NULL, len 16)",
            put_chunk(s, ctx.key("n", 0, 8).as_ptr(), 8, null(), 16),
        );
        expect_err(
            "get_chunk(hash NULL, len 8)",
            get_chunk(s, null(), 8, &mut out, &mut out_len),
        );
        expect_err(
            "get_chunk(hash NULL, len 0)",
            get_chunk(s, null(), 0, &mut out, &mut out_len),
        );
        expect_err(
            "get_chunk(hash_len 0)",
            get_chunk(s, hash.as_ptr(), 0, &mut out, &mut out_len),
        );
        expect_err(
            "get_chunk(out_data NULL)",
            get_chunk(s, hash.as_ptr(), 8, null_mut(), &mut out_len),
        );
        expect_err(
            "get_chunk(out_len NULL)",
            get_chunk(s, hash.as_ptr(), 8, &mut out, null_mut()),
        );
        expect_err(
            "put_manifest(name NULL)",
            put_manifest(s, null(), data.as_ptr(), 4),
        );
        expect_err(
            "put_manifest(data NULL, len 16)",
            put_manifest(s, present_c.as_ptr(), null(), 16),
        );
        expect_err(
            "get_manifest(name NULL)",
            get_manifest(s, null(), &mut out, &mut out_len),
        );
        expect_err(
            "get_manifest(out_data NULL)",
            get_manifest(s, present_c.as_ptr(), null_mut(), &mut out_len),
        );
        expect_err(
            "get_manifest(out_len NULL)",
            get_manifest(s, present_c.as_ptr(), &mut out, null_mut()),
        );
        expect_err("delete_manifest(name NULL)", delete_manifest(s, null()));
    }
    // Bad prefetch arguments must not crash or break the handle; what they
    // return is a SHOULD, judged by `prefetch-bad-arguments`.
    let prefetched = prefetch_bad_calls(ctx, &h, &hash);

    // Names that would escape a directory or collide with the layout.
    let long = "x".repeat(64 * 1024);
    let names = [
        "",
        "/",
        "a/b",
        "/etc/passwd",
        "..",
        "../x",
        "x/../../y",
        ".",
        "chunks/0",
        &long,
    ];
    for name in names {
        let c = CString::new(name).expect("no NUL");
        let shown = if name.len() > 24 {
            format!("<{} bytes>", name.len())
        } else {
            format!("{name:?}")
        };
        // SAFETY: a valid C string and live buffers.
        unsafe {
            expect_err(
                &format!("put_manifest({shown})"),
                put_manifest(s, c.as_ptr(), data.as_ptr(), 4),
            );
            expect_err(
                &format!("get_manifest({shown})"),
                get_manifest(s, c.as_ptr(), &mut out, &mut out_len),
            );
            expect_err(
                &format!("delete_manifest({shown})"),
                delete_manifest(s, c.as_ptr()),
            );
        }
    }
    if !out.is_null() && !ctx.leak_outputs {
        // An accepted get above handed back a buffer; it is the consumer's.
        // SAFETY: from the backend's malloc (checked by malloc-outputs).
        unsafe { libc::free(out.cast()) };
    }
    if !accepted.is_empty() {
        return Err(violated(format!("accepted: {}", accepted.join("; "))));
    }
    // NULL data with length 0 is an empty buffer in C; either answer is fine.
    // SAFETY: NULL with length 0.
    let empty = unsafe { put_chunk(s, ctx.key("empty", 0, 8).as_ptr(), 8, null(), 0) };
    // The handle survived all of it.
    ctx.expect_chunk(&h, &hash, &data)?;
    ctx.expect_manifest(&h, &present, b"present")?;
    let _ = h.delete_manifest(&present);
    Ok(format!(
        "15 bad calls and {} hostile names rejected; put_chunk(data NULL, len 0) → {empty}; \
         {}; handle still works",
        names.len(),
        if prefetched.is_empty() {
            "no prefetch_chunks (v1)".to_owned()
        } else {
            prefetched
                .iter()
                .map(|(what, rc)| format!("prefetch_chunks({what}) → {rc}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ))
}

/// Call `prefetch_chunks` with NULL hashes and with hash_len 0 (n_hashes 3
/// each); empty on a v1 vtable.
fn prefetch_bad_calls(ctx: &Ctx<'_>, h: &Handle<'_>, hash: &[u8]) -> Vec<(&'static str, i32)> {
    let Some(prefetch) = ctx
        .lib
        .vtable()
        .prefetch_chunks
        .filter(|_| ctx.lib.has_prefetch())
    else {
        return Vec::new();
    };
    // SAFETY: a live handle; NULL hashes and hash_len 0 are the values under
    // test, and `hash` is readable for the call that names it.
    unsafe {
        vec![
            ("hashes NULL, n 3", prefetch(h.as_ptr(), null(), 8, 3)),
            ("hash_len 0, n 3", prefetch(h.as_ptr(), hash.as_ptr(), 0, 3)),
        ]
    }
}

pub const PREFETCH_BAD_ARGUMENTS: Check = Check {
    name: "prefetch-bad-arguments",
    level: Level::Should,
    rule: "prefetch_chunks with NULL hashes or hash_len 0 (and n_hashes > 0) should return <0. \
           Prefetch is a non-fatal hint, so a backend that ignores such a call (returns 0) \
           is not broken; it must not crash, and the handle keeps working.",
    quick: true,
    run: prefetch_bad_arguments,
};

fn prefetch_bad_arguments(ctx: &Ctx<'_>) -> Outcome {
    if !ctx.lib.has_prefetch() {
        return Err(Finding::NotApplicable(
            "vtable version 1: no prefetch_chunks".into(),
        ));
    }
    let h = ctx.open()?;
    let (hash, data) = (ctx.key("c", 0, 8), ctx.data("c", 0, 1024));
    ctx.put_new_chunk(&h, &hash, &data)?;
    let accepted: Vec<String> = prefetch_bad_calls(ctx, &h, &hash)
        .into_iter()
        .filter(|(_, rc)| *rc >= 0)
        .map(|(what, rc)| format!("prefetch_chunks({what}) → {rc}"))
        .collect();
    ctx.expect_chunk(&h, &hash, &data)?;
    if accepted.is_empty() {
        Ok("both rejected with <0; handle still works".into())
    } else {
        Err(violated(format!(
            "accepted (harmless for a hint, but the caller is not told its arguments are bad): {}",
            accepted.join("; ")
        )))
    }
}
