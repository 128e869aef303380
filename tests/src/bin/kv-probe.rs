//! `kv-probe LIB URI OP...`: open URI through the kv_store_v1 library LIB
//! and run each OP, printing one line per step. Used by the tests to drive
//! the shim in a child process with its own environment.
//!
//! Lines: `open ok` / `open NULL`; `<op> <arg> -> <rc> [<utf8 output>]`.
//! OPs: `get-manifest:NAME`, `put-manifest:NAME=TEXT`, `delete-manifest:NAME`,
//! `put-chunk:HEX=TEXT`, `get-chunk:HEX`, `sleep:MS` (keeps the process alive),
//! `pause` (waits for a line on stdin, so a test can act between steps),
//! `open:URI` (opens a second store in the same process, kept open).

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

fn rc(r: Result<(), i32>) -> String {
    r.err().unwrap_or(0).to_string()
}

fn unhex(s: &str) -> Vec<u8> {
    hex::decode(s).expect("hex hash")
}
