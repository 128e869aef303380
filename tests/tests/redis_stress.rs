//! An independent consumer's workload against `builtin:redis`, through the
//! shim in a child process: eight threads on one handle, each doing put/get
//! round trips of fresh chunks and publishing a manifest, every byte
//! checked (`kv-probe`'s `stress` op). Each run is a new process, handle
//! and namespace; enough runs to make a rare lost or wrong read show up.
//!
//! It catches two races in the handle's read-own-writes bookkeeping
//! (`host/runtime/src/handle.rs`), each a `get_chunk` of a chunk just put
//! answering -2: an instance that a flush (or `put_manifest`) had just
//! served was dropped from the unflushed set *after* going back to the
//! pool, forgetting a put another thread had made on it meanwhile; and a
//! get decided whether to flush other instances *after* its miss, when a
//! flush that completed during the get had already cleared them.

use std::time::Instant;

use kvwasm_tests::servers::RedisServer;
use kvwasm_tests::{Probe, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");
/// Runs of 8 threads × 150 round trips each.
const RUNS: u64 = 12;

#[test]
fn eight_threads_on_one_handle_read_back_every_byte() {
    let server = RedisServer::without_password();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\nmax_instances = 4\n\
             call_timeout_ms = 10000\nsettings = {{ address = \"{0}\", timeout_ms = 5000 }}\n",
            server.addr
        ),
    );
    let started = Instant::now();
    for run in 0..RUNS {
        let (out, stderr) = Probe::new(PROBE, &format!("wasm://redis/stress-{run}"))
            .config(&config)
            .env("KVWASM_LOG", "warn")
            .run(&[&format!("stress:8,150,{run}")]);
        assert_eq!(
            out,
            ["open ok".to_owned(), format!("stress 8,150,{run} -> 0 ok")],
            "run {run}: {stderr}"
        );
    }
    // Shown, not asserted: what this test checks is every byte, and a
    // loaded machine's time says nothing about the code.
    eprintln!("{RUNS} runs in {:?}", started.elapsed());
}
