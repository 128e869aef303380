//! A deliberately hostile backend, for tests only. It validates nothing and
//! does what the manifest name says, so tests can drive every attack through
//! the real C ABI:
//!
//! | `get_manifest(name)`   | behaviour                                          |
//! |------------------------|----------------------------------------------------|
//! | `ping`                 | returns `pong`                                     |
//! | `panic`                | panics (trap)                                      |
//! | `loop`                 | spins forever (deadline)                           |
//! | `alloc:<MiB>`          | allocates and touches that much memory             |
//! | `recurse`              | recurses until the stack overflows                 |
//! | `abs:<path>`           | reads an absolute guest path, e.g. `/etc/passwd`   |
//! | `env:<NAME>`           | returns the value of an environment variable       |
//! | `connect:<ip:port>`    | opens a TCP connection                             |
//! | `send:<ip:port>`       | connects and writes a plain-text `AUTH` line       |
//! | `resolve:<host>`       | resolves a host name                               |
//! | `hoard:<n>`            | creates and leaks n payloads of 1 MiB (host memory) |
//! | `readfile:<path>`      | payload-io `read-file` of `path` beneath `/data`   |
//! | `writefile:<path>`     | payload-io `write-file` of `path` beneath `/data`  |
//! | `publishfile:<tmp>,<path>` | payload-io `publish-file` of `tmp` to `path` beneath `/data` |
//! | `http:<url>`           | sends a wasi:http GET, returns the status and body |
//! | `http-opts:<url>`      | the same, passing request options to the host      |
//! | `tryalloc:<MiB>`       | asks for that much with `try_reserve`; survives a refusal |
//! | `sleep:<ms>`           | blocks in a `monotonic-clock` pollable              |
//! | `read-socket:<ip:port>`| connects and blocks reading a peer that never answers |
//! | `fds:<n>`              | opens `/data/fd-target` n times, keeping every descriptor; returns how many opened and the error that stopped it |
//! | `readat:<offset>:<len>`| payload-io `read-at` of `/data/fd-target` with a chosen offset and length; returns the payload's length |
//! | `errlog:<KiB>`         | fails with an error message of that size           |
//! | `stderr:<KiB>`         | writes that much to stderr, in lines, then `pong`  |
//! | `slowclose:<ms>`       | makes this store's destructor block that long      |
//! | `listdir`              | counts the entries of `/data`                      |
//! | `readexact:<ip:port>,<len>,<ms>,<head>` | connects over raw `wasi:sockets` and reads `len` bytes with `payload-streams.read-exact` (`head` first); the payload, or the error as text |
//! | `symlink:<target>`     | creates `/data/link` pointing at `target`          |
//! | anything else          | reads `/data/<name>` without validating the name   |
//!
//! While `/data/trap-on-open` exists, `open` panics (a constructor trap).
//! While `/data/keep-on-open` exists, `open` reads the file beneath `/data`
//! it names with payload-io `read-file` and keeps the payload, as `keep:`
//! below does.
//!
//! `get_chunk(hash)`, the hash read as text, tries what a guest could do
//! with a payload the host read into a `get_chunk_into` caller's buffer
//! (every `<file>` is read beneath `/data` with payload-io `read-file`):
//!
//! | `get_chunk(hash)`      | behaviour                                          |
//! |------------------------|----------------------------------------------------|
//! | `read:<file>`          | returns `<file>`'s payload                         |
//! | `keep:<file>`          | keeps `<file>`'s payload for later calls; not found |
//! | `kept`                 | returns the kept payload (not found if none)       |
//! | `peek`                 | returns a new payload of the kept payload's bytes, as the guest can read them now |
//! | `twice:<a>,<b>`        | reads `a`, then `b` while it still holds `a`; returns `a` |
//! | `reread:<a>,<b>`       | reads `a`, drops it, reads `b`; returns `b`        |
//! | `other:<file>`         | keeps `<file>`'s payload and returns a new one, `other` |
//! | `trap:<file>`          | reads `<file>`, then panics holding its payload    |
//! | anything else          | not found                                          |
//!
//! `put_manifest(name, data)` writes `/data/<name>`, so state outlives a
//! trapped instance; but for `writeall:<ip:port>,<ms>,<mode>,<times>`,
//! which connects over raw `wasi:sockets` and sends `data` `times` times
//! with `payload-streams.write-all` (each waiting at most `ms`): `mode`
//! `lent` sends the lent payload itself, `copy` a `payload-streams.copy`
//! of it, and `hoard` only makes `times` copies, kept until the call
//! returns. It fails with the first error, as text. And for
//! `pinhttp:<mib>,<times>`: `times` times, a copy of a new `<mib>` MiB
//! payload is written into the body of an HTTP request never sent (the
//! body takes two writes, then `write-all` times out), the request kept
//! and the copy dropped: the body still holds slices of it.

use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_io;
use kvwasm_guest_support::bindings::wasi::filesystem::preopens;
use kvwasm_guest_support::bindings::wasi::filesystem::types::Descriptor;
use kvwasm_guest_support::{
    BackendInfo, Error, FsErrorExt, Guest, GuestStore, Payload, PayloadExt, PutOutcome, Result,
    Store, export_backend,
};

struct Hostile;

/// While this file exists, `open` traps: every new instance is lost while
/// it starts.
const TRAP_ON_OPEN: &str = "/data/trap-on-open";
/// While this file exists, `open` keeps the payload of the file it names.
const KEEP_ON_OPEN: &str = "/data/keep-on-open";

impl Guest for Hostile {
    type Store = HostileStore;

    fn info() -> BackendInfo {
        BackendInfo {
            name: "hostile".into(),
            version: "0".into(),
            shared_state: true,
        }
    }
}

#[derive(Default)]
struct HostileStore {
    /// Milliseconds the destructor blocks (`slowclose:<ms>`).
    slow_close_ms: std::cell::Cell<u64>,
    /// A payload kept past the call that read it (`keep:`, `other:`,
    /// `/data/keep-on-open`).
    kept: std::cell::RefCell<Option<Payload>>,
}

impl Drop for HostileStore {
    fn drop(&mut self) {
        std::thread::sleep(std::time::Duration::from_millis(self.slow_close_ms.get()));
    }
}

thread_local! {
    /// Descriptors opened by `fds:<n>`, kept open for the instance's life.
    static HOARDED_FILES: std::cell::RefCell<Vec<std::fs::File>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn number<T: std::str::FromStr>(text: &str, name: &str) -> Result<T> {
    text.parse()
        .map_err(|_| Error::InvalidArgument(name.to_owned()))
}

/// A raw `wasi:sockets` connection to `addr`, and `ms` as nanoseconds.
fn connect(addr: &str, ms: &str, name: &str) -> Result<(kvwasm_guest_support::net::Stream, u64)> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let stream = kvwasm_guest_support::net::connect_stream(addr, false, deadline)
        .map_err(Error::Unavailable)?;
    Ok((stream, number::<u64>(ms, name)?.saturating_mul(1_000_000)))
}

/// `readexact:<ip:port>,<len>,<ms>,<head>`: the value read into a
/// payload by the host, or what `read-exact` answered, as text.
fn read_exact_from(args: &str, name: &str) -> Result<Payload> {
    use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_streams::read_exact;
    let [addr, len, ms, head] = args.splitn(4, ',').collect::<Vec<_>>()[..] else {
        return Err(Error::InvalidArgument(name.to_owned()));
    };
    let (stream, timeout_ns) = connect(addr, ms, name)?;
    match read_exact(
        stream.input(),
        head.as_bytes(),
        number(len, name)?,
        timeout_ns,
    ) {
        Ok(payload) => Ok(payload),
        Err(e) => Ok(Payload::new(format!("{e:?}").as_bytes())),
    }
}

/// `writeall:<ip:port>,<ms>,<mode>,<times>` (see the module doc).
fn write_all_to(args: &str, name: &str, data: &Payload) -> Result<()> {
    use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_streams::{copy, write_all};
    let [addr, ms, mode, times] = args.splitn(4, ',').collect::<Vec<_>>()[..] else {
        return Err(Error::InvalidArgument(name.to_owned()));
    };
    let times: usize = number(times, name)?;
    let copy = |i: usize| copy(data).map_err(|e| Error::Other(format!("copy {i}: {e}")));
    if mode == "hoard" {
        let kept = (0..times).map(copy).collect::<Result<Vec<_>>>()?;
        std::hint::black_box(kept);
        return Ok(());
    }
    let (stream, timeout_ns) = connect(addr, ms, name)?;
    let copied;
    let source = match mode {
        "lent" => data,
        "copy" => {
            copied = copy(0)?;
            &copied
        }
        _ => return Err(Error::InvalidArgument(name.to_owned())),
    };
    for i in 0..times {
        if let Err(e) = write_all(stream.output(), source, timeout_ns) {
            // Dropping a socket stream waits for its pending write
            // (wasmtime's rule), which a peer that stopped reading never
            // lets end: leave it to the instance, answer now.
            std::mem::forget(stream);
            return Err(Error::Other(format!("write {i}: {e:?}")));
        }
    }
    stream
        .output()
        .blocking_flush()
        .map_err(|e| Error::Other(format!("flush: {e:?}")))
}

/// `pinhttp:<mib>,<times>` (see the module doc).
fn pin_in_http_bodies(args: &str, name: &str) -> Result<()> {
    use kvwasm_guest_support::bindings::kvwasm::kv_store::payload_streams::{WriteError, copy};
    use wasip2::http::types::{Fields, OutgoingRequest};
    let [mib, times] = args.splitn(2, ',').collect::<Vec<_>>()[..] else {
        return Err(Error::InvalidArgument(name.to_owned()));
    };
    let (mib, times): (usize, usize) = (number(mib, name)?, number(times, name)?);
    for i in 0..times {
        let copied = copy(&Payload::new(&vec![b'x'; mib << 20]))
            .map_err(|e| Error::Other(format!("copy {i}: {e}")))?;
        let request = OutgoingRequest::new(Fields::new());
        let body = request.body().map_err(|()| Error::Other("body".into()))?;
        let stream = body.write().map_err(|()| Error::Other("stream".into()))?;
        let wrote = kvwasm_guest_support::write_all_by_handle(stream.handle(), &copied, 50_000_000);
        if !matches!(wrote, Err(WriteError::TimedOut)) {
            return Err(Error::Other(format!("write {i}: {wrote:?}")));
        }
        std::mem::forget((stream, body, request));
    }
    Ok(())
}

fn io_error(e: std::io::Error) -> Error {
    Error::Io(e.to_string())
}

#[allow(unconditional_recursion)]
fn recurse(depth: u64) -> u64 {
    let frame = [depth; 64];
    recurse(std::hint::black_box(frame)[3] + 1) + 1
}

impl GuestStore for HostileStore {
    fn open(_namespace: String) -> Result<Store> {
        if std::fs::exists(TRAP_ON_OPEN).unwrap_or(false) {
            panic!("hostile guest traps while opening, as {TRAP_ON_OPEN} asks");
        }
        let store = HostileStore::default();
        if let Ok(name) = std::fs::read_to_string(KEEP_ON_OPEN) {
            store.kept.replace(Some(read_data_file(name.trim())?));
        }
        Ok(Store::new(store))
    }

    fn put_chunk(&self, _hash: Vec<u8>, _data: &Payload) -> Result<PutOutcome> {
        Err(Error::Other("hostile guest stores no chunks".into()))
    }

    fn get_chunk(&self, hash: Vec<u8>) -> Result<Payload> {
        let name = String::from_utf8_lossy(&hash);
        match name.split_once(':') {
            Some(("read", file)) => read_data_file(file),
            Some(("keep", file)) => {
                self.kept.replace(Some(read_data_file(file)?));
                Err(Error::NotFound)
            }
            _ if name == "kept" => self.kept.take().ok_or(Error::NotFound),
            _ if name == "peek" => {
                let kept = self.kept.borrow();
                Ok(Payload::new(
                    &kept.as_ref().map(PayloadExt::to_vec).unwrap_or_default(),
                ))
            }
            Some(("twice", files)) => {
                let (a, b) = pair(files, &name)?;
                let first = read_data_file(a)?;
                std::hint::black_box(read_data_file(b)?);
                Ok(first)
            }
            Some(("reread", files)) => {
                let (a, b) = pair(files, &name)?;
                drop(read_data_file(a)?);
                read_data_file(b)
            }
            Some(("other", file)) => {
                self.kept.replace(Some(read_data_file(file)?));
                Ok(Payload::new(b"other"))
            }
            Some(("trap", file)) => {
                let held = read_data_file(file)?;
                panic!(
                    "hostile guest panics holding a payload of {} bytes",
                    held.len()
                )
            }
            _ => Err(Error::NotFound),
        }
    }

    fn put_manifest(&self, name: String, data: &Payload) -> Result<()> {
        if let Some(args) = name.strip_prefix("writeall:") {
            return write_all_to(args, &name, data);
        }
        if let Some(args) = name.strip_prefix("pinhttp:") {
            return pin_in_http_bodies(args, &name);
        }
        std::fs::write(format!("/data/{name}"), data.to_vec()).map_err(io_error)
    }

    fn get_manifest(&self, name: String) -> Result<Payload> {
        if let Some(args) = name.strip_prefix("readexact:") {
            return read_exact_from(args, &name);
        }
        let bytes = match name.split_once(':') {
            _ if name == "ping" => b"pong".to_vec(),
            _ if name == "panic" => panic!("hostile guest panics on purpose"),
            _ if name == "loop" => loop {
                std::hint::spin_loop();
            },
            _ if name == "recurse" => recurse(0).to_le_bytes().to_vec(),
            Some(("alloc", mib)) => {
                let mib: usize = mib
                    .parse()
                    .map_err(|_| Error::InvalidArgument(name.clone()))?;
                let block = vec![1u8; mib << 20];
                std::hint::black_box(&block);
                b"allocated".to_vec()
            }
            Some(("abs", path)) => std::fs::read(path).map_err(io_error)?,
            // The host's one-call file read and write, steered at `path`
            // beneath /data.
            Some(("readfile", path)) => {
                return payload_io::read_file(&data_dir()?, path).fs_context("readfile");
            }
            Some(("writefile", path)) => {
                let bytes = Payload::new(b"escaped");
                payload_io::write_file(&data_dir()?, path, &bytes, false)
                    .fs_context("writefile")?;
                b"written".to_vec()
            }
            Some(("publishfile", paths)) => {
                let (tmp, path) = paths
                    .split_once(',')
                    .ok_or_else(|| Error::InvalidArgument(name.clone()))?;
                let bytes = Payload::new(b"published");
                payload_io::publish_file(&data_dir()?, tmp, path, &bytes, true)
                    .fs_context("publishfile")?;
                b"published".to_vec()
            }
            Some(("hoard", n)) => {
                let n: usize = n
                    .parse()
                    .map_err(|_| Error::InvalidArgument(name.clone()))?;
                let block = vec![7u8; 1 << 20];
                for _ in 0..n {
                    std::mem::forget(Payload::new(&block));
                }
                b"hoarded".to_vec()
            }
            Some(("connect", addr)) => {
                std::net::TcpStream::connect(addr).map_err(io_error)?;
                b"connected".to_vec()
            }
            Some(("send", addr)) => {
                use std::io::Write;
                let mut stream = std::net::TcpStream::connect(addr).map_err(io_error)?;
                stream
                    .write_all(b"AUTH plain-text-secret\r\n")
                    .and_then(|()| stream.flush())
                    .map_err(io_error)?;
                b"sent".to_vec()
            }
            Some(("resolve", host)) => {
                use std::net::ToSocketAddrs;
                let found = (host, 80).to_socket_addrs().map_err(io_error)?;
                format!("{:?}", found.collect::<Vec<_>>()).into_bytes()
            }
            Some(("http", url)) => http_get(url, false)?,
            Some(("http-opts", url)) => http_get(url, true)?,
            Some(("tryalloc", mib)) => {
                let mut block: Vec<u8> = Vec::new();
                match block.try_reserve(number::<usize>(mib, &name)? << 20) {
                    Ok(()) => b"reserved".to_vec(),
                    Err(_) => b"refused".to_vec(),
                }
            }
            Some(("sleep", ms)) => {
                std::thread::sleep(std::time::Duration::from_millis(number(ms, &name)?));
                b"slept".to_vec()
            }
            Some(("read-socket", addr)) => {
                use std::io::Read;
                let mut stream = std::net::TcpStream::connect(addr).map_err(io_error)?;
                let mut byte = [0u8; 1];
                stream.read_exact(&mut byte).map_err(io_error)?;
                b"read".to_vec()
            }
            Some(("fds", n)) => {
                let n: usize = number(n, &name)?;
                let mut opened = 0;
                let mut stopped = String::from("none");
                for _ in 0..n {
                    match std::fs::File::open("/data/fd-target") {
                        Ok(file) => {
                            HOARDED_FILES.with(|files| files.borrow_mut().push(file));
                            opened += 1;
                        }
                        Err(e) => {
                            stopped = e.to_string();
                            break;
                        }
                    }
                }
                format!("opened {opened}, stopped by: {stopped}").into_bytes()
            }
            Some(("readat", args)) => {
                use kvwasm_guest_support::bindings::wasi::filesystem::types::{
                    DescriptorFlags, OpenFlags, PathFlags,
                };
                let (offset, len) = args
                    .split_once(':')
                    .ok_or_else(|| Error::InvalidArgument(name.clone()))?;
                let file = data_dir()?
                    .open_at(
                        PathFlags::empty(),
                        "fd-target",
                        OpenFlags::empty(),
                        DescriptorFlags::READ,
                    )
                    .fs_context("open")?;
                let payload =
                    payload_io::read_at(&file, number(offset, &name)?, number(len, &name)?)
                        .fs_context("readat")?;
                payload.len().to_string().into_bytes()
            }
            Some(("errlog", kib)) => {
                let kib: usize = number(kib, &name)?;
                return Err(Error::Other("e".repeat(kib << 10)));
            }
            Some(("stderr", kib)) => {
                let kib: usize = number(kib, &name)?;
                let line = "x".repeat(1023);
                for _ in 0..kib {
                    eprintln!("{line}");
                }
                b"pong".to_vec()
            }
            Some(("slowclose", ms)) => {
                self.slow_close_ms.set(number(ms, &name)?);
                b"armed".to_vec()
            }
            _ if name == "listdir" => std::fs::read_dir("/data")
                .map_err(io_error)?
                .count()
                .to_string()
                .into_bytes(),
            Some(("symlink", target)) => {
                data_dir()?
                    .symlink_at(target, "link")
                    .fs_context("symlink")?;
                b"linked".to_vec()
            }
            Some(("env", var)) => std::env::var(var)
                .map_err(|_| Error::NotFound)?
                .into_bytes(),
            _ => std::fs::read(format!("/data/{name}")).map_err(io_error)?,
        };
        Ok(Payload::new(&bytes))
    }

    fn delete_manifest(&self, _name: String) -> Result<()> {
        Ok(())
    }

    fn prefetch_chunks(&self, _hashes: Vec<Vec<u8>>) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }
}

/// GET `url` (`http://host:port/path`) over wasi:http: `<status> <body>`;
/// `with_options` hands a `request-options` resource to the host too.
fn http_get(url: &str, with_options: bool) -> Result<Vec<u8>> {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
    let bad = || Error::InvalidArgument(format!("bad url {url:?}"));
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_owned()), |(a, p)| (a, format!("/{p}")));
    let request = OutgoingRequest::new(Fields::new());
    request
        .set_scheme(Some(&Scheme::Http))
        .map_err(|()| bad())?;
    request.set_authority(Some(authority)).map_err(|()| bad())?;
    request
        .set_path_with_query(Some(&path))
        .map_err(|()| bad())?;
    let denied = |e: &dyn std::fmt::Debug| Error::Denied(format!("http request failed: {e:?}"));
    let options = with_options.then(wasip2::http::types::RequestOptions::new);
    let future = outgoing_handler::handle(request, options).map_err(|e| denied(&e))?;
    future.subscribe().block();
    let response = future
        .get()
        .ok_or_else(|| Error::Io("no response".into()))?
        .map_err(|()| Error::Io("response taken twice".into()))?
        .map_err(|e| denied(&e))?;
    let status = response.status();
    let body = response
        .consume()
        .map_err(|()| Error::Io("no body".into()))?;
    let stream = body
        .stream()
        .map_err(|()| Error::Io("no body stream".into()))?;
    let mut bytes = format!("{status} ").into_bytes();
    while let Ok(chunk) = stream.blocking_read(64 * 1024) {
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// `<a>,<b>` of a `get_chunk` mode named `name`.
fn pair<'a>(files: &'a str, name: &str) -> Result<(&'a str, &'a str)> {
    files
        .split_once(',')
        .ok_or_else(|| Error::InvalidArgument(name.to_owned()))
}

/// Payload-io `read-file` of `path` beneath /data.
fn read_data_file(path: &str) -> Result<Payload> {
    payload_io::read_file(&data_dir()?, path).fs_context("read-file")
}

/// The descriptor of the directory granted at /data.
fn data_dir() -> Result<Descriptor> {
    preopens::get_directories()
        .into_iter()
        .find(|(_, path)| path == "/data")
        .map(|(dir, _)| dir)
        .ok_or(Error::NotFound)
}

export_backend!(Hostile);
