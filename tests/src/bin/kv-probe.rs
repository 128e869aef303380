//! `kv-probe LIB URI OP...`: open URI through the kv_store_v1 library LIB
//! and run each OP, printing one line per step. Used by the tests to drive
//! the shim in a child process with its own environment.
//!
//! Lines: `open ok` / `open NULL`; `<op> <arg> -> <rc> [<utf8 output>]`.
//! OPs: `get-manifest:NAME`, `put-manifest:NAME=TEXT`, `delete-manifest:NAME`,
//! `put-chunk:HEX=TEXT`, `get-chunk:HEX`, `prefetch:HEX,HEX...`, `sleep:MS` (keeps the process alive),
//! `pause` (waits for a line on stdin, so a test can act between steps),
//! `stress:THREADS,ROUNDS,SEED` (see [`stress`]).

use kv_store_abi::Library;

fn main() {
    let mut args = std::env::args().skip(1);
    let (lib, uri) = (args.next().expect("LIB"), args.next().expect("URI"));
    let lib = Library::open(lib.as_ref()).unwrap_or_else(|e| panic!("{e}"));
    let Some(store) = lib.open_store(&uri) else {
        println!("open NULL");
        return;
    };
    println!("open ok");
    for op in args {
        let (verb, arg) = op.split_once(':').unwrap_or((&op, ""));
        let show = |r: Result<kv_store_abi::Buffer, i32>| match r {
            Ok(b) => format!("0 {}", String::from_utf8_lossy(&b)),
            Err(rc) => rc.to_string(),
        };
        let line = match verb {
            "get-manifest" => show(store.get_manifest(arg)),
            "put-manifest" => {
                let (name, text) = arg.split_once('=').unwrap_or((arg, ""));
                rc(store.put_manifest(name, text.as_bytes()))
            }
            "delete-manifest" => rc(store.delete_manifest(arg)),
            "put-chunk" => {
                let (hash, text) = arg.split_once('=').unwrap_or((arg, ""));
                match store.put_chunk(&unhex(hash), text.as_bytes()) {
                    Ok(dup) => i32::from(dup).to_string(),
                    Err(rc) => rc.to_string(),
                }
            }
            "get-chunk" => show(store.get_chunk(&unhex(arg))),
            "prefetch" => {
                let hashes: Vec<Vec<u8>> = arg.split(',').map(unhex).collect();
                let hashes: Vec<&[u8]> = hashes.iter().map(Vec::as_slice).collect();
                rc(store.prefetch_chunks(&hashes))
            }
            "sleep" => {
                let ms = arg.parse().expect("sleep:MILLISECONDS");
                std::thread::sleep(std::time::Duration::from_millis(ms));
                "0".into()
            }
            "stress" => stress(&store, arg),
            "pause" => {
                println!("pause");
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).expect("stdin");
                continue;
            }
            other => panic!("unknown op {other}"),
        };
        println!("{verb} {arg} -> {line}");
    }
}

/// THREADS threads share the one handle. Each does ROUNDS put/get round
/// trips of its own fresh chunks (1 to 16 KiB, derived from SEED), checking
/// every byte, then publishes a manifest of its hashes and reads it back;
/// finally every chunk is read again. Prints `0 ok` or the first failures
/// (`<thread>/<round> <what>`), as an independent multi-threaded consumer
/// sees them.
fn stress(store: &kv_store_abi::Handle<'_>, arg: &str) -> String {
    let nums: Vec<u64> = arg
        .split(',')
        .map(|n| n.parse().expect("stress:THREADS,ROUNDS,SEED"))
        .collect();
    let [threads, rounds, seed] = nums[..] else {
        panic!("stress:THREADS,ROUNDS,SEED")
    };
    let chunk = |t: u64, r: u64| {
        let data = kvwasm_tests::pattern(
            1024 + ((t * 7919 + r * 104_729) % 15_360) as usize,
            seed ^ (t << 32 | r),
        );
        (kvwasm_tests::xxh3_key(&data), data)
    };
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for t in 0..threads {
            let failures = &failures;
            s.spawn(move || {
                let fail =
                    |r: u64, what: String| failures.lock().unwrap().push(format!("{t}/{r} {what}"));
                let mut manifest = Vec::new();
                for r in 0..rounds {
                    let (hash, data) = chunk(t, r);
                    manifest.extend_from_slice(&hash);
                    if let Err(rc) = store.put_chunk(&hash, &data) {
                        fail(r, format!("put-chunk -> {rc}"));
                    }
                    match store.get_chunk(&hash) {
                        Ok(got) if *got == *data => {}
                        Ok(got) => fail(r, format!("get-chunk: {} wrong bytes", got.len())),
                        Err(rc) => fail(r, format!("get-chunk -> {rc}")),
                    }
                }
                let name = format!("stress-{t}");
                match store
                    .put_manifest(&name, &manifest)
                    .and_then(|()| store.get_manifest(&name))
                {
                    Ok(got) if *got == *manifest => {}
                    Ok(_) => fail(rounds, "manifest: wrong bytes".into()),
                    Err(rc) => fail(rounds, format!("manifest -> {rc}")),
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    for t in 0..threads {
        for r in 0..rounds {
            let (hash, data) = chunk(t, r);
            if !store.get_chunk(&hash).is_ok_and(|got| *got == *data) {
                failures.push(format!("{t}/{r} lost after the manifests"));
            }
        }
    }
    match failures.len() {
        0 => "0 ok".into(),
        n => format!("{n} failures: {}", failures[..n.min(5)].join("; ")),
    }
}

fn rc(r: Result<(), i32>) -> String {
    r.err().unwrap_or(0).to_string()
}

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("hex hash")
}
