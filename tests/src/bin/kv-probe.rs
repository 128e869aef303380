//! `kv-probe LIB URI OP...`: open URI through the kv_store_v1 library LIB
//! and run each OP, printing one line per step. Used by the tests to drive
//! the shim in a child process with its own environment.
//!
//! Lines: `open ok` / `open NULL`; `<op> <arg> -> <rc> [<utf8 output>]`.
//! OPs: `get-manifest:NAME`, `put-manifest:NAME=TEXT`, `delete-manifest:NAME`,
//! `put-chunk:HEX=TEXT`, `get-chunk:HEX`, `prefetch:HEX,HEX...`, `sleep:MS`
//! (keeps the process alive), `pause` (waits for a line on stdin, so a test
//! can act between steps), `stress:THREADS,ROUNDS,SEED` (see [`stress`]),
//! `consumer-fds:N` (the consumer itself opens N files and a TCP socket:
//! prints `0` if it could), `close-during-calls:NAME` (4 threads call
//! `get_manifest(NAME)` on the handle while it is closed; prints each
//! thread's last return code, which must be -10, and the handle is closed),
//! `open:URI` (opens a second store in the same process, kept open),
//! `vm-peak` (prints the process's peak address space in KiB), and
//! `timed:<op>` (runs `<op>` and appends ` [<ms> ms]`).

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
    let mut others = Vec::new();
    for op in args {
        // `timed:<op>` appends how long the call took: ` [<ms> ms]`.
        let (timed, op) = match op.strip_prefix("timed:") {
            Some(inner) => (Some(std::time::Instant::now()), inner.to_owned()),
            None => (None, op),
        };
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
            "open" => match lib.open_store(arg) {
                Some(other) => {
                    others.push(other);
                    "ok".into()
                }
                None => "NULL".into(),
            },
            "sleep" => {
                let ms = arg.parse().expect("sleep:MILLISECONDS");
                std::thread::sleep(std::time::Duration::from_millis(ms));
                "0".into()
            }
            "consumer-fds" => consumer_fds(arg.parse().expect("consumer-fds:N")),
            "close-during-calls" => {
                let line = close_during_calls(&lib, &store, arg);
                std::mem::forget(store);
                println!("{verb} {arg} -> {line}");
                return;
            }
            "stress" => stress(&store, arg),
            "pause" => {
                println!("pause");
                let mut line = String::new();
                std::io::stdin().read_line(&mut line).expect("stdin");
                continue;
            }
            "vm-peak" => format!("0 {}", vm_peak_kib()),
            other => panic!("unknown op {other}"),
        };
        match timed {
            Some(started) => println!(
                "{verb} {arg} -> {line} [{} ms]",
                started.elapsed().as_millis()
            ),
            None => println!("{verb} {arg} -> {line}"),
        }
    }
}

/// The process's peak address-space size (`VmPeak`), in KiB.
fn vm_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmPeak")
}

/// Whether this process can still open `n` files and a socket.
fn consumer_fds(n: usize) -> String {
    let files: Result<Vec<_>, _> = (0..n).map(|_| std::fs::File::open("/dev/null")).collect();
    let socket = std::net::TcpListener::bind("127.0.0.1:0");
    match (files, socket) {
        (Ok(_), Ok(_)) => "0".into(),
        (files, socket) => format!("-1 files: {:?}, socket: {:?}", files.err(), socket.err()),
    }
}

/// Close the handle while 4 threads call `get_manifest(name)` on it; each
/// thread stops at its first -10 (closed) and reports its calls and last code.
fn close_during_calls(lib: &Library, store: &kv_store_abi::Handle<'_>, name: &str) -> String {
    let vtable = lib.vtable();
    let get = vtable.get_manifest.expect("get_manifest");
    let close = vtable.close.expect("close");
    // The handle is an opaque number to the consumer; threads share it.
    let handle = store.as_ptr() as usize;
    let name = std::ffi::CString::new(name).expect("name");
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let name = name.clone();
            std::thread::spawn(move || {
                let (mut calls, mut last) = (0, 0);
                let started = std::time::Instant::now();
                while started.elapsed() < std::time::Duration::from_secs(10) {
                    let (mut out, mut len) = (std::ptr::null_mut(), 0usize);
                    // SAFETY: the ABI's contract; the handle may be closed
                    // meanwhile, which the shim must answer with -10.
                    last = unsafe { get(handle as *mut _, name.as_ptr(), &mut out, &mut len) };
                    if last == 0 {
                        // SAFETY: a successful get hands over a malloc'd buffer.
                        unsafe { libc::free(out.cast()) };
                    }
                    calls += 1;
                    if last == -10 {
                        break;
                    }
                }
                format!("{calls}:{last}")
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(100));
    // SAFETY: closed once; the threads above are still calling.
    unsafe { close(handle as *mut _) };
    let results: Vec<String> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    format!("0 {}", results.join(" "))
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
