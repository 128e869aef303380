//! `kv-probe LIB URI OP...`: open URI through the kv_store_v1 library LIB
//! and run each OP, printing one line per step. Used by the tests to drive
//! the shim in a child process with its own environment.
//!
//! Lines: `open ok` / `open NULL`; `<op> <arg> -> <rc> [<utf8 output>]`.
//! OPs: `get-manifest:NAME`, `put-manifest:NAME=TEXT`, `delete-manifest:NAME`,
//! `put-chunk:HEX=TEXT`, `get-chunk:HEX`, `sleep:MS` (keeps the process alive),
//! `pause` (waits for a line on stdin, so a test can act between steps),
//! `consumer-fds:N` (the consumer itself opens N files and a TCP socket:
//! prints `0` if it could), `close-during-calls:NAME` (4 threads call
//! `get_manifest(NAME)` on the handle while it is closed; prints each
//! thread's last return code, which must be -10, and the handle is closed),
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

fn rc(r: Result<(), i32>) -> String {
    r.err().unwrap_or(0).to_string()
}

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("hex hash")
}
