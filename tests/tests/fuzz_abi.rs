//! The shim's C entry points under random arguments, against a model.
//!
//! Random operation sequences run on a fresh embedded-fs handle: hashes of
//! 0 to 100 bytes or NULL, data of random lengths or NULL, names that are
//! NULL, non-UTF-8, overlong or hold a NUL, NULL output pointers, and
//! prefetch lists whose `n_hashes × hash_len` may overflow. Every bad call
//! returns < 0, nothing crashes, and every good call answers as a plain
//! map of chunks and manifests would. Handles are always valid (garbage
//! handles are the handle registry's own test).
//!
//! One `#[test]` per binary: it sets `KVWASM_LOG` before the shim reads it,
//! so thousands of refused calls do not flood the test output.

use std::collections::HashMap;
use std::ffi::c_char;
use std::ptr::{null, null_mut};

use kv_store_abi::{KvStore, Vtable};
use kvwasm_tests::{hash_of_len, open_fs, shim};
use proptest::prelude::*;

/// A pointer argument: NULL with a claimed length, or real bytes.
#[derive(Clone, Debug)]
enum Buf {
    Null(usize),
    Bytes(Vec<u8>),
}

impl Buf {
    fn ptr(&self) -> *const u8 {
        match self {
            Buf::Null(_) => null(),
            Buf::Bytes(b) => b.as_ptr(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Buf::Null(len) => *len,
            Buf::Bytes(b) => b.len(),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    PutChunk {
        hash: Buf,
        data: Buf,
    },
    GetChunk {
        hash: Buf,
        out: Outs,
    },
    PutManifest {
        name: Option<Vec<u8>>,
        data: Buf,
    },
    GetManifest {
        name: Option<Vec<u8>>,
        out: Outs,
    },
    DeleteManifest {
        name: Option<Vec<u8>>,
    },
    Prefetch {
        hashes: Buf,
        hash_len: usize,
        n: usize,
    },
}

/// Which output pointers are NULL: (`out_data`, `out_len`).
type Outs = (bool, bool);

/// Hashes from a small pool (so puts and gets meet), 0 to 100 bytes, or NULL.
fn hash() -> impl Strategy<Value = Buf> {
    prop_oneof![
        8 => (0u64..4, prop_oneof![Just(8usize), Just(32), 0usize..=100])
            .prop_map(|(seed, len)| Buf::Bytes(hash_of_len(len, seed))),
        1 => (0usize..=100).prop_map(Buf::Null),
    ]
}

fn data() -> impl Strategy<Value = Buf> {
    prop_oneof![
        8 => proptest::collection::vec(any::<u8>(), 0..3000).prop_map(Buf::Bytes),
        1 => prop_oneof![Just(0usize), 1usize..=usize::MAX].prop_map(Buf::Null),
    ]
}

/// Names: from a small pool of good ones (so puts and gets meet), random
/// bytes (NULs, non-UTF-8, `/`, `..`), overlong, or NULL.
fn name() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        6 => "(slot|m|a.b|-_x)[0-2]".prop_map(|s| Some(s.into_bytes())),
        3 => proptest::collection::vec(any::<u8>(), 0..24).prop_map(Some),
        2 => "[./\\\\a\\x00\\x01é]{0,8}".prop_map(|s| Some(s.into_bytes())),
        1 => (250usize..70_000).prop_map(|n| Some(vec![b'n'; n])),
        1 => Just(None),
    ]
}

fn outs() -> impl Strategy<Value = Outs> {
    prop_oneof![6 => Just((false, false)), 1 => any::<Outs>()]
}

/// Prefetch lists: real lists (any hash length), NULL with any sizes, and
/// sizes whose product overflows (with a real or a NULL pointer).
fn prefetch() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..4, 0usize..=100, 0usize..6).prop_map(|(seed, hash_len, n)| {
            let flat: Vec<u8> = (0..n as u64)
                .flat_map(|i| hash_of_len(hash_len, (seed + i) % 4))
                .collect();
            Op::Prefetch {
                hashes: Buf::Bytes(flat),
                hash_len,
                n,
            }
        }),
        (0usize..=100, 0usize..1 << 20).prop_map(|(hash_len, n)| Op::Prefetch {
            hashes: Buf::Null(0),
            hash_len,
            n
        }),
        (2usize..=usize::MAX, any::<bool>()).prop_map(|(hash_len, null)| {
            // The smallest count that overflows `n × hash_len`.
            let n = usize::MAX / hash_len + 1;
            let hashes = if null {
                Buf::Null(0)
            } else {
                Buf::Bytes(vec![7; 8])
            };
            Op::Prefetch {
                hashes,
                hash_len,
                n,
            }
        }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (hash(), data()).prop_map(|(hash, data)| Op::PutChunk { hash, data }),
        4 => (hash(), outs()).prop_map(|(hash, out)| Op::GetChunk { hash, out }),
        3 => (name(), data()).prop_map(|(name, data)| Op::PutManifest { name, data }),
        3 => (name(), outs()).prop_map(|(name, out)| Op::GetManifest { name, out }),
        2 => name().prop_map(|name| Op::DeleteManifest { name }),
        2 => prefetch(),
    ]
}

/// A hash the backend must accept: 1 to 64 bytes.
fn good_hash(hash: &Buf) -> Option<&[u8]> {
    match hash {
        Buf::Bytes(h) if (1..=64).contains(&h.len()) => Some(h),
        _ => None,
    }
}

/// Bytes a put must accept: real bytes, or NULL with length 0.
fn good_data(data: &Buf) -> Option<&[u8]> {
    match data {
        Buf::Bytes(d) => Some(d),
        Buf::Null(0) => Some(&[]),
        Buf::Null(_) => None,
    }
}

/// The name the C side sees (up to the first NUL), if the spec's naming
/// rules accept it: UTF-8, 1 to 255 bytes, one path component that is not
/// `.`, no `..`, `/`, `\` or control character.
fn good_name(name: &Option<Vec<u8>>) -> Option<String> {
    let bytes = name.as_ref()?;
    let seen = bytes.split(|b| *b == 0).next().unwrap_or_default();
    let name = std::str::from_utf8(seen).ok()?;
    let ok = (1..=255).contains(&name.len())
        && name != "."
        && !name.contains("..")
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || c.is_control());
    ok.then(|| name.to_owned())
}

/// `name` as the NUL-terminated string a C caller passes.
fn c_name(name: &Option<Vec<u8>>) -> Option<Vec<u8>> {
    name.as_ref().map(|n| [n.as_slice(), &[0]].concat())
}

fn c_ptr(name: &Option<Vec<u8>>) -> *const c_char {
    name.as_ref().map_or(null(), |n| n.as_ptr().cast())
}

/// What the store must hold.
#[derive(Default)]
struct Model {
    chunks: HashMap<Vec<u8>, Vec<u8>>,
    manifests: HashMap<String, Vec<u8>>,
}

/// Call a get entry point with the output pointers `out` asks for; the
/// result is freed as a consumer would.
fn get(out: Outs, call: impl FnOnce(*mut *mut u8, *mut usize) -> i32) -> (i32, Vec<u8>) {
    let (mut ptr, mut len) = (null_mut::<u8>(), 0usize);
    let rc = call(
        if out.0 { null_mut() } else { &mut ptr },
        if out.1 { null_mut() } else { &mut len },
    );
    let mut bytes = Vec::new();
    if rc == 0 && !ptr.is_null() {
        // SAFETY: on success the shim hands back `len` bytes from malloc.
        bytes = unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec();
        // SAFETY: ours to free, once.
        unsafe { libc::free(ptr.cast()) };
    }
    (rc, bytes)
}

/// Run `op` on `s`, check its result against `model`, and update it.
fn run(vt: &Vtable, s: *mut KvStore, model: &mut Model, op: &Op) -> Result<(), TestCaseError> {
    match op {
        Op::PutChunk { hash, data } => {
            // SAFETY: every pointer is NULL or points at its claimed length.
            let rc = unsafe {
                (vt.put_chunk.expect("v1"))(s, hash.ptr(), hash.len(), data.ptr(), data.len())
            };
            match (good_hash(hash), good_data(data)) {
                (Some(h), Some(d)) => {
                    // The fs backend trusts a chunk file of the right size
                    // (a hash names its content); one of another size is
                    // left over from a crash, and rewritten.
                    let present = model.chunks.get(h).is_some_and(|old| old.len() == d.len());
                    prop_assert_eq!(rc, i32::from(present), "{:?}", op);
                    if !present {
                        model.chunks.insert(h.to_vec(), d.to_vec());
                    }
                }
                _ => prop_assert!(rc < 0, "accepted {:?} → {}", op, rc),
            }
        }
        Op::GetChunk { hash, out } => {
            // SAFETY: as above; output pointers are NULL or live.
            let (rc, bytes) = get(*out, |p, l| unsafe {
                (vt.get_chunk.expect("v1"))(s, hash.ptr(), hash.len(), p, l)
            });
            match good_hash(hash).filter(|_| *out == (false, false)) {
                Some(h) => match model.chunks.get(h) {
                    Some(want) => {
                        prop_assert_eq!(rc, 0, "{:?}", op);
                        prop_assert_eq!(&bytes, want);
                    }
                    None => prop_assert!(rc < 0, "a missing chunk: {:?} → {}", op, rc),
                },
                None => prop_assert!(rc < 0, "accepted {:?} → {}", op, rc),
            }
        }
        Op::PutManifest { name, data } => {
            let c = c_name(name);
            // SAFETY: a NUL-terminated name or NULL; data as above.
            let rc =
                unsafe { (vt.put_manifest.expect("v1"))(s, c_ptr(&c), data.ptr(), data.len()) };
            match (good_name(name), good_data(data)) {
                (Some(n), Some(d)) => {
                    prop_assert_eq!(rc, 0, "{:?}", op);
                    model.manifests.insert(n, d.to_vec());
                }
                _ => prop_assert!(rc < 0, "accepted {:?} → {}", op, rc),
            }
        }
        Op::GetManifest { name, out } => {
            let c = c_name(name);
            // SAFETY: as above.
            let (rc, bytes) = get(*out, |p, l| unsafe {
                (vt.get_manifest.expect("v1"))(s, c_ptr(&c), p, l)
            });
            match good_name(name).filter(|_| *out == (false, false)) {
                Some(n) => match model.manifests.get(&n) {
                    Some(want) => {
                        prop_assert_eq!(rc, 0, "{:?}", op);
                        prop_assert_eq!(&bytes, want);
                    }
                    None => prop_assert!(rc < 0, "a missing manifest: {:?} → {}", op, rc),
                },
                None => prop_assert!(rc < 0, "accepted {:?} → {}", op, rc),
            }
        }
        Op::DeleteManifest { name } => {
            let c = c_name(name);
            // SAFETY: as above.
            let rc = unsafe { (vt.delete_manifest.expect("v1"))(s, c_ptr(&c)) };
            match good_name(name) {
                Some(n) => {
                    prop_assert_eq!(rc, 0, "{:?}", op);
                    model.manifests.remove(&n);
                }
                None => prop_assert!(rc < 0, "accepted {:?} → {}", op, rc),
            }
        }
        Op::Prefetch {
            hashes,
            hash_len,
            n,
        } => {
            // SAFETY: `hashes` is NULL, or holds `n × hash_len` bytes, or
            // that product overflows (checked before any read).
            let rc = unsafe { (vt.prefetch_chunks.expect("v1"))(s, hashes.ptr(), *hash_len, *n) };
            // A hint: success or failure, never a positive code...
            prop_assert!(rc <= 0, "{:?} → {}", op, rc);
            // ...but bad arguments are always refused.
            let total = hash_len.checked_mul(*n);
            let readable = matches!(hashes, Buf::Bytes(_)) && total.is_some();
            if *n > 0 && (*hash_len == 0 || !readable) {
                prop_assert!(rc < 0, "accepted {:?} → {}", op, rc);
            }
        }
    }
    Ok(())
}

/// Everything in the model reads back exact.
fn check_model(vt: &Vtable, s: *mut KvStore, model: &Model) -> Result<(), TestCaseError> {
    let all = (false, false);
    for (hash, want) in &model.chunks {
        // SAFETY: a live hash buffer and output pointers.
        let (rc, bytes) = get(all, |p, l| unsafe {
            (vt.get_chunk.expect("v1"))(s, hash.as_ptr(), hash.len(), p, l)
        });
        prop_assert_eq!(rc, 0);
        prop_assert_eq!(&bytes, want);
    }
    for (name, want) in &model.manifests {
        let c = c_name(&Some(name.clone().into_bytes()));
        // SAFETY: a NUL-terminated name and live output pointers.
        let (rc, bytes) = get(all, |p, l| unsafe {
            (vt.get_manifest.expect("v1"))(s, c_ptr(&c), p, l)
        });
        prop_assert_eq!(rc, 0);
        prop_assert_eq!(&bytes, want);
    }
    Ok(())
}

#[test]
fn random_calls_through_the_c_abi_never_crash_and_match_a_model() {
    // SAFETY: the only test of this binary, before any thread or the shim
    // reads the environment.
    unsafe { std::env::set_var("KVWASM_LOG", "error") };
    let vt = shim().vtable();
    const CASES: u32 = 300;
    let config = ProptestConfig {
        cases: CASES,
        // Every case must be reproducible from its printed inputs.
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let started = std::time::Instant::now();
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..40))| {
        let dir = tempfile::tempdir().unwrap();
        let store = open_fs(dir.path());
        let mut model = Model::default();
        for op in &ops {
            run(vt, store.as_ptr(), &mut model, op)?;
        }
        check_model(vt, store.as_ptr(), &model)?;
    });
    eprintln!("{CASES} random call sequences in {:?}", started.elapsed());
}
