//! Loading, naming, exports and the handle lifecycle.

use std::ffi::CString;

use kv_store_abi::{GET_CHUNK_INTO_SYMBOL, GET_VTABLE_SYMBOL, VERSION_PREFETCH, library_file_name};

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Finding, Outcome, violated};

pub const VTABLE: Check = Check {
    name: "vtable",
    level: Level::Must,
    rule: "The consumer does dlopen, dlsym(\"kv_store_get_vtable\"), calls it once to obtain the \
           vtable; the version is 1, or 2 if prefetch_chunks is non-NULL, and every v1 entry is set.",
    quick: true,
    run: vtable,
};

fn vtable(ctx: &Ctx<'_>) -> Outcome {
    // Loading already rejected a NULL vtable, version 0 and NULL v1 entries.
    let vt = ctx.lib.vtable();
    match vt.version {
        1 => Ok("version 1: all seven v1 entries set (prefetch_chunks not read on v1)".into()),
        VERSION_PREFETCH if vt.prefetch_chunks.is_some() => {
            Ok("version 2: all seven v1 entries and prefetch_chunks set".into())
        }
        VERSION_PREFETCH => Err(violated(
            "version is 2 but prefetch_chunks is NULL; set version 1 if you stay at v1",
        )),
        v => Err(violated(format!(
            "version {v} is unknown: kv_store_v1 defines versions 1 and 2"
        ))),
    }
}

pub const LIBRARY_NAME: Check = Check {
    name: "library-name",
    level: Level::Must,
    rule: "Scheme is the backend identifier and MUST match the cdylib name: scheme foo → \
           libkv_store_foo.{so,dylib}.",
    quick: true,
    run: library_name,
};

fn library_name(ctx: &Ctx<'_>) -> Outcome {
    let Some((scheme, _)) = ctx.uri.split_once("://") else {
        return Err(violated(format!("URI {:?} has no scheme", ctx.uri)));
    };
    let want = library_file_name(scheme);
    let file = ctx
        .lib_path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    if file == want {
        Ok(format!("scheme {scheme:?} ↔ {file}"))
    } else {
        Err(violated(format!(
            "URI scheme {scheme:?} needs a library named {want}, this one is {file}"
        )))
    }
}

pub const EXPORTS: Check = Check {
    name: "exports",
    level: Level::Should,
    rule: "kv_store_get_vtable is the only exported symbol the consumer needs (everything else \
           can be hidden); documented optional calls beside it, such as \
           kv_store_wasm_get_chunk_into, are expected.",
    quick: true,
    run: exports,
};

/// Symbols every ELF shared object defines; not the vendor's doing.
const LINKER_SYMBOLS: [&str; 5] = ["_init", "_fini", "_edata", "_end", "__bss_start"];

/// Optional calls a consumer may look up beside the vtable (docs/engines.md).
const OPTIONAL_CALLS: [&str; 1] = [GET_CHUNK_INTO_SYMBOL];

fn exports(ctx: &Ctx<'_>) -> Outcome {
    use object::{Object, ObjectSymbol};
    let bytes = std::fs::read(ctx.lib_path).map_err(|e| {
        Finding::NotApplicable(format!("cannot read {}: {e}", ctx.lib_path.display()))
    })?;
    let file = object::File::parse(&*bytes)
        .map_err(|e| Finding::NotApplicable(format!("not an object file this check reads: {e}")))?;
    let extra: Vec<String> = file
        .dynamic_symbols()
        .filter(|s| s.is_definition() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .filter(|n| {
            n != GET_VTABLE_SYMBOL
                && !LINKER_SYMBOLS.contains(&n.as_str())
                && !OPTIONAL_CALLS.contains(&n.as_str())
        })
        .collect();
    if extra.is_empty() {
        Ok(format!("only {GET_VTABLE_SYMBOL} is exported"))
    } else {
        let shown: Vec<_> = extra.iter().take(8).map(String::as_str).collect();
        Err(violated(format!(
            "{} other symbols exported (build with -fvisibility=hidden): {}{}",
            extra.len(),
            shown.join(", "),
            if extra.len() > 8 { ", …" } else { "" }
        )))
    }
}

pub const URI_SECRETS: Check = Check {
    name: "uri-secrets",
    level: Level::Should,
    rule: "Auth credentials, region, and other secrets are configured via environment variables, \
           not the URI (so they don't end up in process listings or log lines).",
    quick: true,
    run: uri_secrets,
};

fn uri_secrets(ctx: &Ctx<'_>) -> Outcome {
    let rest = ctx.uri.split_once("://").map_or(ctx.uri, |(_, r)| r);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') {
        return Err(violated("the URI carries user info (user:password@host)"));
    }
    let query = rest
        .split_once('?')
        .map_or("", |(_, q)| q)
        .to_ascii_lowercase();
    let secretish = [
        "key",
        "secret",
        "token",
        "password",
        "passwd",
        "auth",
        "credential",
    ];
    if let Some(word) = secretish.iter().find(|w| query.contains(*w)) {
        return Err(violated(format!(
            "the URI query mentions {word:?}: pass secrets in the environment"
        )));
    }
    Ok("no user info or secret-looking query parameters in the URI".into())
}

pub const OPEN_CLOSE: Check = Check {
    name: "open-close",
    level: Level::Must,
    rule: "open(uri) constructs a backend instance; close releases it; the consumer may pass NULL \
           to close if open failed mid-flight.",
    quick: true,
    run: open_close,
};

fn open_close(ctx: &Ctx<'_>) -> Outcome {
    let first = ctx.open()?;
    let second = ctx.open()?;
    if first.as_ptr() == second.as_ptr() {
        return Err(violated("two open() calls returned the same handle"));
    }
    drop(second);
    drop(first);
    let close = ctx.lib.vtable().close.expect("checked at load");
    // SAFETY: the spec allows close(NULL).
    unsafe { close(std::ptr::null_mut()) };
    Ok("two handles opened and closed; close(NULL) is harmless".into())
}

pub const OPEN_BAD_URI: Check = Check {
    name: "open-bad-uri",
    level: Level::Should,
    rule: "Return NULL on failure. Errors should be logged to stderr by the backend.",
    quick: true,
    run: open_bad_uri,
};

fn open_bad_uri(ctx: &Ctx<'_>) -> Outcome {
    let open = ctx.lib.vtable().open.expect("checked at load");
    let mut accepted = Vec::new();
    // SAFETY: NULL is an input a defensive backend answers with NULL.
    let null = unsafe { open(std::ptr::null()) };
    if !null.is_null() {
        accepted.push("NULL".to_owned());
    }
    for uri in ["", "no-scheme-at-all", "kvwasm-check-unknown-scheme://x/y"] {
        let c = CString::new(uri).expect("no NUL");
        // SAFETY: a valid C string.
        let h = unsafe { open(c.as_ptr()) };
        if !h.is_null() {
            accepted.push(format!("{uri:?}"));
            let close = ctx.lib.vtable().close.expect("checked at load");
            // SAFETY: a handle this call opened.
            unsafe { close(h) };
        }
    }
    if accepted.is_empty() {
        Ok("NULL, empty and foreign-scheme URIs all give NULL".into())
    } else {
        Err(violated(format!("open accepted {}", accepted.join(", "))))
    }
}

pub const TRAILING_SLASH_URI: Check = Check {
    name: "trailing-slash-uri",
    level: Level::Must,
    rule: "The consumer MAY trim a trailing / on the URI before calling open (the consumers pass \
           it unchanged): uri and uri + \"/\" name the same store.",
    quick: true,
    run: trailing_slash,
};

fn trailing_slash(ctx: &Ctx<'_>) -> Outcome {
    let plain = ctx.open()?;
    let slashed = ctx.open_uri(&format!("{}/", ctx.uri.trim_end_matches('/')))?;
    let (name, body) = (ctx.name("m"), ctx.data("m", 0, 100));
    let (hash, chunk) = (ctx.key("c", 0, 8), ctx.data("c", 0, 4096));
    ctx.put_new_chunk(&slashed, &hash, &chunk)?;
    ctx.put_manifest(&slashed, &name, &body)?;
    ctx.expect_manifest(&plain, &name, &body)?;
    ctx.expect_chunk(&plain, &hash, &chunk)?;
    let _ = plain.delete_manifest(&name);
    Ok("writes through `uri/` are read through `uri`".into())
}

pub const CLOSE_RELEASES: Check = Check {
    name: "close-releases",
    level: Level::Should,
    rule: "close(self): release every resource the backend opened.",
    quick: false,
    run: close_releases,
};

fn close_releases(ctx: &Ctx<'_>) -> Outcome {
    let cycle = |i: u64| -> Result<(), Finding> {
        let h = ctx.open()?;
        let hash = ctx.key("c", i, 8);
        ctx.put_new_chunk(&h, &hash, &ctx.data("c", i, 1024))?;
        ctx.get_chunk(&h, &hash)
            .map_err(|rc| violated(format!("get_chunk returned {rc}")))?;
        ctx.put_manifest(&h, &ctx.name("m"), b"x")
    };
    // Warm up: one-time process state (caches, runtime threads) is not a leak.
    cycle(0)?;
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
    const CYCLES: u64 = 25;
    for i in 1..=CYCLES {
        cycle(i)?;
    }
    let (fds2, threads2) = (count("/proc/self/fd"), count("/proc/self/task"));
    if fds2 > fds + 2 || threads2 > threads + 2 {
        return Err(violated(format!(
            "after {CYCLES} open/close cycles: file descriptors {fds} → {fds2}, threads {threads} → {threads2}"
        )));
    }
    Ok(format!(
        "{CYCLES} open/use/close cycles: file descriptors {fds} → {fds2}, threads {threads} → {threads2}"
    ))
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}
