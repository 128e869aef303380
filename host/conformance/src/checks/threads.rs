//! One handle, many threads.

use std::sync::Barrier;

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Finding, Outcome, violated};

pub const THREAD_SAFETY: Check = Check {
    name: "thread-safety",
    level: Level::Must,
    rule: "A single kv_store_v1 handle MUST be safe to call from multiple threads concurrently.",
    quick: true,
    run: thread_safety,
};

fn thread_safety(ctx: &Ctx<'_>) -> Outcome {
    let threads = ctx.pick(4u64, 8);
    let per_thread = ctx.pick(12u64, 32);
    let h = ctx.open()?;
    let start = Barrier::new(threads as usize);
    let chunk = |t: u64, i: u64| {
        let n = t * per_thread + i;
        let size = 4096 * (1 + (n as usize * 37) % 64);
        (ctx.key("c", n, 8), ctx.data("c", n, size))
    };
    let results: Vec<Result<(), Finding>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (h, start) = (&h, &start);
                s.spawn(move || -> Result<(), Finding> {
                    start.wait();
                    // Interleave writes, reads of our own chunks, misses and
                    // manifests with the other threads doing the same.
                    for i in 0..per_thread {
                        let (hash, data) = chunk(t, i);
                        ctx.put_new_chunk(h, &hash, &data)?;
                        ctx.expect_chunk(h, &hash, &data)?;
                        if ctx.get_chunk(h, &ctx.key("never-put", t, 8)).is_ok() {
                            return Err(violated("a never-put hash was found"));
                        }
                        let name = ctx.name(&format!("t{t}"));
                        ctx.put_manifest(h, &name, &hash)?;
                        ctx.expect_manifest(h, &name, &hash)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(violated("a checker thread panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    // Every thread's chunks, read back after all threads finished.
    for t in 0..threads {
        for i in 0..per_thread {
            let (hash, data) = chunk(t, i);
            ctx.expect_chunk(&h, &hash, &data)?;
        }
        let _ = h.delete_manifest(&ctx.name(&format!("t{t}")));
    }
    Ok(format!(
        "{threads} threads × {per_thread} puts, gets, misses and manifests on one handle: all exact"
    ))
}
