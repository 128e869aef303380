//! Namespaces: `wasm://<backend>/<namespace>` names a store of its own.
//!
//! The C ABI leaves the shape of a URI to the backend, so these checks apply
//! to `wasm://` URIs naming a backend, where `wit/kv-store.wit` (`store.open`)
//! defines what a namespace is. Each derives namespaces below the one under
//! test (the empty namespace too), writes the same hash and manifest names
//! into all of them with bytes unique to each, and reads every one back.

use kv_store_abi::Handle;

use super::Check;
use crate::Level;
use crate::ctx::{Ctx, Finding, Outcome, short_hex, violated};

pub const NAMESPACE_SEPARATE: Check = Check {
    name: "namespace-separate",
    level: Level::Must,
    rule: "Namespaces are separate stores: the same hash or manifest name in two namespaces \
           holds two values, and put-chunk answers already-present only for a hash put in the \
           same namespace. (wit/kv-store.wit, store.open)",
    quick: true,
    run: namespace_separate,
};

fn namespace_separate(ctx: &Ctx<'_>) -> Outcome {
    let root = Root::of(ctx)?;
    let set = root.open_all(ctx, &["", "tenant-a", "tenant-b", "tenant-a/x"])?;
    let keys = Keys::new(ctx);
    keys.write_all(ctx, &set)?;
    keys.read_all(ctx, &set)?;
    keys.clean_up(&set);
    Ok(format!(
        "{} namespaces hold one hash and two manifest names each, apart",
        set.len()
    ))
}

pub const NAMESPACE_LOOK_ALIKES: Check = Check {
    name: "namespace-look-alikes",
    level: Level::Must,
    rule: "Namespaces apart whatever the two strings share: letter case, an empty, leading, \
           doubled or trailing `/` component (beyond the one trailing `/` the host trims), \
           components named like the backend's own directories or keys (`chunks`, `manifests`, \
           at any depth), `.`/`..` and their look-alikes. A backend that cannot keep a \
           namespace apart refuses it; it never maps two namespaces onto one. \
           (wit/kv-store.wit, store.open)",
    quick: true,
    run: namespace_look_alikes,
};

/// Namespaces (below the one under test) a careless layout merges with
/// `tenant-a` or lets reach into its chunks and manifests.
const LOOK_ALIKES: &[&str] = &[
    "",
    "tenant-a",
    // letter case
    "Tenant-A",
    "TENANT-A",
    // `/` placement
    "/tenant-a",
    "tenant-a//",
    "tenant-a/x",
    "tenant-a//x",
    "tenant-a/x//",
    // the store's own directories, at any depth, with its fan-out
    "chunks",
    "manifests",
    "tenant-a/chunks",
    "tenant-a/chunks/c",
    "tenant-a/chunks/chunks",
    "tenant-a/Chunks",
    "tenant-a/CHUNKS.",
    "tenant-a/manifests",
    "tenant-a/x/chunks",
    "tenant-a/x/chunks/c",
    // dots and look-alikes
    "tenant-a/.",
    "tenant-a/..",
    "tenant-a/x/..",
    "./tenant-a",
    "tenant-a/...",
    "tenant-a/.chunks",
    "tenant-a/%2e%2e",
    "tenant-a/\u{ff0e}\u{ff0e}",
    "tenant-a/\u{2024}\u{2024}",
    "tenant-a\u{2215}x",
];

fn namespace_look_alikes(ctx: &Ctx<'_>) -> Outcome {
    let root = Root::of(ctx)?;
    let set = root.open_some(ctx, LOOK_ALIKES)?;
    let keys = Keys::new(ctx);
    keys.write_all(ctx, &set)?;
    keys.read_all(ctx, &set)?;
    keys.clean_up(&set);
    let refused = LOOK_ALIKES.len() - set.len();
    Ok(format!(
        "{} look-alike namespaces apart, {refused} refused at open",
        set.len()
    ))
}

pub const NAMESPACE_DELETE_OVERWRITE: Check = Check {
    name: "namespace-overwrite",
    level: Level::Must,
    rule: "Nothing put, replaced or deleted through one namespace is visible through another. \
           (wit/kv-store.wit, store.open)",
    quick: true,
    run: namespace_delete_overwrite,
};

fn namespace_delete_overwrite(ctx: &Ctx<'_>) -> Outcome {
    let root = Root::of(ctx)?;
    let set = root.open_some(ctx, LOOK_ALIKES)?;
    let keys = Keys::new(ctx);
    keys.write_all(ctx, &set)?;
    // One namespace at a time replaces its manifest, then (in a second
    // pass) deletes it; every other namespace must still read its own.
    for (i, ns) in set.iter().enumerate() {
        let replaced = keys.manifest_bytes("replaced", i);
        ctx.put_manifest(&ns.handle, &keys.name, &replaced)?;
        for (j, other) in set.iter().enumerate() {
            let want = if j <= i {
                keys.manifest_bytes("replaced", j)
            } else {
                keys.manifest_bytes("name", j)
            };
            keys.expect_manifest(ctx, &set, j, &keys.name, &want)
                .map_err(|f| after(f, "replacing", ns, other))?;
        }
    }
    for (i, ns) in set.iter().enumerate() {
        ns.handle.delete_manifest(&keys.name).map_err(|rc| {
            violated(format!(
                "namespace {:?}: delete_manifest of a present name returned {rc}",
                ns.namespace
            ))
        })?;
        for (j, other) in set.iter().enumerate().skip(i + 1) {
            let want = keys.manifest_bytes("replaced", j);
            keys.expect_manifest(ctx, &set, j, &keys.name, &want)
                .map_err(|f| after(f, "deleting", ns, other))?;
        }
        if let Ok(got) = ctx.get_manifest(&ns.handle, &keys.name) {
            return Err(violated(format!(
                "namespace {:?}: get_manifest after delete_manifest returned 0 with {} bytes",
                ns.namespace,
                got.len()
            )));
        }
    }
    keys.clean_up(&set);
    Ok(format!(
        "{} namespaces each replaced and deleted a manifest the others kept",
        set.len()
    ))
}

fn after(finding: Finding, what: &str, changed: &Namespace<'_>, reader: &Namespace<'_>) -> Finding {
    match finding {
        Finding::Violated(why) => violated(format!(
            "after {what} it in namespace {:?}, namespace {:?}: {why}",
            changed.namespace, reader.namespace
        )),
        not_applicable => not_applicable,
    }
}

pub const EMPTY_NAMESPACE: Check = Check {
    name: "empty-namespace",
    level: Level::Must,
    rule: "The empty namespace (`wasm://<backend>`) is a namespace like any other, apart from \
           all of them. (wit/kv-store.wit, store.open)",
    quick: true,
    run: empty_namespace,
};

fn empty_namespace(ctx: &Ctx<'_>) -> Outcome {
    let root = Root::of(ctx)?;
    let empty = Root {
        backend: root.backend.clone(),
        namespace: String::new(),
    };
    let mut set = empty.open_all(ctx, &["", "chunks", "manifests"])?;
    // The namespace under test, when it is not the empty one already.
    if !root.namespace.is_empty() {
        set.extend(root.open_all(ctx, &["", "chunks"])?);
    }
    let keys = Keys::new(ctx);
    keys.write_all(ctx, &set)?;
    keys.read_all(ctx, &set)?;
    keys.clean_up(&set);
    Ok(format!(
        "the empty namespace and {} others apart",
        set.len() - 1
    ))
}

/// The backend and namespace of the URI under test.
struct Root {
    /// `wasm://<backend>`
    backend: String,
    /// The namespace under test, one trailing `/` trimmed.
    namespace: String,
}

/// One opened namespace.
struct Namespace<'a> {
    namespace: String,
    handle: Handle<'a>,
}

impl Root {
    fn of(ctx: &Ctx<'_>) -> Result<Root, Finding> {
        let not_applicable = || {
            Finding::NotApplicable(format!(
                "{:?} is not a wasm://<backend>/<namespace> URI: namespaces are the component \
                 contract's (the C ABI leaves URI shapes to the backend)",
                ctx.uri
            ))
        };
        let rest = ctx.uri.strip_prefix("wasm://").ok_or_else(not_applicable)?;
        if rest.starts_with('/') {
            return Err(not_applicable()); // wasm:///dir: a directory, not a namespace
        }
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (backend, namespace) = rest.split_once('/').unwrap_or((rest, ""));
        Ok(Root {
            backend: format!("wasm://{backend}"),
            namespace: namespace.to_owned(),
        })
    }

    /// The URI of `child` below this namespace (`""`: this one).
    fn uri(&self, child: &str) -> (String, String) {
        let namespace = match (self.namespace.as_str(), child) {
            (ns, "") => ns.to_owned(),
            ("", child) => child.to_owned(),
            (ns, child) => format!("{ns}/{child}"),
        };
        (format!("{}/{namespace}", self.backend), namespace)
    }

    /// Open every child; each must open.
    fn open_all<'a>(
        &self,
        ctx: &Ctx<'a>,
        children: &[&str],
    ) -> Result<Vec<Namespace<'a>>, Finding> {
        children
            .iter()
            .map(|child| {
                let (uri, namespace) = self.uri(child);
                Ok(Namespace {
                    handle: ctx.open_uri(&uri)?,
                    namespace,
                })
            })
            .collect()
    }

    /// Open the children the backend accepts; the first two (this
    /// namespace and `tenant-a`) must open.
    fn open_some<'a>(
        &self,
        ctx: &Ctx<'a>,
        children: &[&str],
    ) -> Result<Vec<Namespace<'a>>, Finding> {
        let mut opened = self.open_all(ctx, &children[..2])?;
        for child in &children[2..] {
            let (uri, namespace) = self.uri(child);
            if let Some(handle) = ctx.lib.open_store(&uri) {
                opened.push(Namespace { namespace, handle });
            }
        }
        Ok(opened)
    }
}

/// What every namespace of a check writes: one hash and two manifest
/// names, the second spelled as the hash's hex (the name a chunk file or key
/// of a careless layout has).
struct Keys {
    hash: Vec<u8>,
    name: String,
    hex_name: String,
    tag: String,
}

impl Keys {
    fn new(ctx: &Ctx<'_>) -> Keys {
        let mut hash = ctx.key("ns", 0, 8);
        // First hex digit `c`: the fan-out directory `chunks/c` is among the
        // look-alike namespaces.
        hash[0] = 0xc0 | (hash[0] & 0x0f);
        let hex_name: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        Keys {
            hash,
            name: ctx.name("ns"),
            hex_name,
            tag: ctx.check.to_owned(),
        }
    }

    fn chunk_bytes(&self, i: usize) -> Vec<u8> {
        self.bytes("chunk", i)
    }

    fn manifest_bytes(&self, kind: &str, i: usize) -> Vec<u8> {
        self.bytes(kind, i)
    }

    /// Bytes saying which namespace wrote them, and what.
    fn bytes(&self, kind: &str, i: usize) -> Vec<u8> {
        format!("{} {kind} of namespace #{i}", self.tag).into_bytes()
    }

    /// Which namespace's write `got` is, for the message.
    fn whose(&self, set: &[Namespace<'_>], got: &[u8]) -> String {
        for (i, ns) in set.iter().enumerate() {
            for kind in ["chunk", "name", "hex-name", "replaced"] {
                if got == self.bytes(kind, i).as_slice() {
                    let what = match kind {
                        "chunk" => format!("its chunk {}", short_hex(&self.hash)),
                        "name" | "replaced" => format!("its manifest {:?}", self.name),
                        _ => format!("its manifest {:?}", self.hex_name),
                    };
                    return format!("what namespace {:?} put as {what}", ns.namespace);
                }
            }
        }
        format!("{} bytes nobody put", got.len())
    }

    fn write_all(&self, ctx: &Ctx<'_>, set: &[Namespace<'_>]) -> Result<(), Finding> {
        for (i, ns) in set.iter().enumerate() {
            match ns.handle.put_chunk(&self.hash, &self.chunk_bytes(i)) {
                Ok(false) => {}
                Ok(true) => {
                    return Err(violated(format!(
                        "namespace {:?}: put_chunk({}) returned 1 (already present), but only \
                         other namespaces ({}) had put that hash",
                        ns.namespace,
                        short_hex(&self.hash),
                        names(&set[..i])
                    )));
                }
                Err(rc) => {
                    return Err(violated(format!(
                        "namespace {:?}: put_chunk({}) returned {rc}",
                        ns.namespace,
                        short_hex(&self.hash)
                    )));
                }
            }
            ctx.put_manifest(&ns.handle, &self.name, &self.manifest_bytes("name", i))
                .map_err(|f| in_namespace(f, ns))?;
            ctx.put_manifest(
                &ns.handle,
                &self.hex_name,
                &self.manifest_bytes("hex-name", i),
            )
            .map_err(|f| in_namespace(f, ns))?;
        }
        Ok(())
    }

    fn read_all(&self, ctx: &Ctx<'_>, set: &[Namespace<'_>]) -> Result<(), Finding> {
        for (i, ns) in set.iter().enumerate() {
            match ctx.get_chunk(&ns.handle, &self.hash) {
                Ok(got) if got == self.chunk_bytes(i) => {}
                Ok(got) => {
                    return Err(violated(format!(
                        "namespace {:?}: get_chunk({}) read {}",
                        ns.namespace,
                        short_hex(&self.hash),
                        self.whose(set, &got)
                    )));
                }
                Err(rc) => {
                    return Err(violated(format!(
                        "namespace {:?}: get_chunk({}) returned {rc} for a chunk it put",
                        ns.namespace,
                        short_hex(&self.hash)
                    )));
                }
            }
            self.expect_manifest(ctx, set, i, &self.name, &self.manifest_bytes("name", i))?;
            self.expect_manifest(
                ctx,
                set,
                i,
                &self.hex_name,
                &self.manifest_bytes("hex-name", i),
            )?;
        }
        Ok(())
    }

    fn expect_manifest(
        &self,
        ctx: &Ctx<'_>,
        set: &[Namespace<'_>],
        i: usize,
        name: &str,
        want: &[u8],
    ) -> Result<(), Finding> {
        let ns = &set[i];
        match ctx.get_manifest(&ns.handle, name) {
            Ok(got) if got == want => Ok(()),
            Ok(got) => Err(violated(format!(
                "namespace {:?}: get_manifest({name:?}) read {}",
                ns.namespace,
                self.whose(set, &got)
            ))),
            Err(rc) => Err(violated(format!(
                "namespace {:?}: get_manifest({name:?}) returned {rc} for a manifest it put",
                ns.namespace
            ))),
        }
    }

    fn clean_up(&self, set: &[Namespace<'_>]) {
        for ns in set {
            let _ = ns.handle.delete_manifest(&self.name);
            let _ = ns.handle.delete_manifest(&self.hex_name);
        }
    }
}

fn in_namespace(finding: Finding, ns: &Namespace<'_>) -> Finding {
    match finding {
        Finding::Violated(why) => violated(format!("namespace {:?}: {why}", ns.namespace)),
        not_applicable => not_applicable,
    }
}

fn names(set: &[Namespace<'_>]) -> String {
    set.iter()
        .map(|ns| format!("{:?}", ns.namespace))
        .collect::<Vec<_>>()
        .join(", ")
}
