//! Output buffers belong to the consumer and come from `malloc`.

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Outcome, violated};

pub const MALLOC_OUTPUTS: Check = Check {
    name: "malloc-outputs",
    level: Level::Must,
    rule: "get_chunk and get_manifest allocate *out_data with the C malloc function; the consumer \
           frees it with free. (Run under glibc's malloc checker: a foreign pointer aborts.)",
    quick: true,
    run: malloc_outputs,
};

fn malloc_outputs(ctx: &Ctx<'_>) -> Outcome {
    let h = ctx.open()?;
    let mut checked = 0;
    for (i, size) in [0usize, 1, 4096, 1 << 20].into_iter().enumerate() {
        let (hash, data) = (ctx.key("c", i as u64, 8), ctx.data("c", i as u64, size));
        ctx.put_new_chunk(&h, &hash, &data)?;
        let buffer = h
            .get_chunk(&hash)
            .map_err(|rc| violated(format!("get_chunk returned {rc}")))?;
        inspect_and_free(buffer, size, "get_chunk")?;
        checked += 1;
    }
    let name = ctx.name("m");
    for (i, size) in [0usize, 100].into_iter().enumerate() {
        ctx.put_manifest(&h, &name, &ctx.data("m", i as u64, size))?;
        let buffer = h
            .get_manifest(&name)
            .map_err(|rc| violated(format!("get_manifest returned {rc}")))?;
        inspect_and_free(buffer, size, "get_manifest")?;
        checked += 1;
    }
    let _ = h.delete_manifest(&name);
    Ok(format!(
        "{checked} outputs (0 B to 1 MiB) are malloc blocks of sufficient size, released with free"
    ))
}

fn inspect_and_free(
    buffer: kv_store_abi::Buffer,
    want: usize,
    op: &str,
) -> Result<(), crate::ctx::Finding> {
    let (ptr, len) = buffer.into_raw();
    if len != want {
        return Err(violated(format!(
            "{op}: *out_len is {len}, {want} bytes were put"
        )));
    }
    if ptr.is_null() {
        return if len == 0 {
            Ok(())
        } else {
            Err(violated(format!(
                "{op}: *out_data is NULL with *out_len {len}"
            )))
        };
    }
    // SAFETY: the rule under test says `ptr` came from malloc; if it did
    // not, these calls abort this child process under the malloc checker,
    // and the runner reports the crash as this check's failure.
    let usable = unsafe { libc::malloc_usable_size(ptr.cast()) };
    // SAFETY: as above.
    unsafe { libc::free(ptr.cast()) };
    if usable < len {
        return Err(violated(format!(
            "{op}: malloc_usable_size is {usable} for a {len}-byte output: not a malloc block"
        )));
    }
    Ok(())
}
