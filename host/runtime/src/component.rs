//! Loaded backend components: compiled code plus a pre-linked instance
//! template, shared by every handle in the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use wasmtime::component::{HasSelf, Linker};

use crate::artifact_cache::{self, Origin};
use crate::bindings::advisor::exports::kvwasm::events::{advisor, advisor_moves};
use crate::bindings::events::exports::kvwasm::events::{http_api, subscriber};
use crate::bindings::fabric::FabricPre;
use crate::bindings::kvwasm::kv_store::{known_chunks, payload_io, payload_streams, types};
use crate::bindings::{BackendExportsPre, BackendInfo};
use crate::engine::{Metering, engine, engine_for};
use crate::error::KvError;
pub use crate::guest_kind::GuestKind;
use crate::state::HostState;

/// Where a component's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ComponentSource {
    /// Embedded in this crate: `builtin:fs`, `builtin:memory`,
    /// `builtin:redis`, `builtin:s3`, `builtin:advisor`.
    Builtin(Builtin),
    /// `builtin:<name>` of another kind's crate (`builtin:tcp`,
    /// `builtin:synthetic`, `builtin:kv-indexer`), found among the
    /// installed extensions when loaded ([`crate::extension`]): a program
    /// that has not installed it (libkv_store_wasm.so) refuses it then, so
    /// a config file shared with `kvwasm` still parses.
    LinkedBuiltin(String),
    /// A `.wasm` file.
    File(std::path::PathBuf),
}

/// The components this crate embeds: what a `kv_store_v1` consumer can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Builtin {
    /// `guest-backends/fs`, the zero-configuration default.
    Fs,
    /// `guest-backends/memory`.
    Memory,
    /// `guest-backends/redis`: needs `net` and `settings.address`.
    Redis,
    /// `guest-backends/s3`: needs `http`, `env` credentials and
    /// `settings.endpoint` / `settings.bucket`.
    S3,
    /// `guest-backends/advisor`: the storage advisor of tiered stores
    /// (`[subscribers.NAME]`, named by a tiered backend's `advisor`).
    Advisor,
}

impl Builtin {
    /// The name used in configs: `builtin:<name>`.
    pub fn name(self) -> &'static str {
        match self {
            Builtin::Fs => "fs",
            Builtin::Memory => "memory",
            Builtin::Redis => "redis",
            Builtin::S3 => "s3",
            Builtin::Advisor => "advisor",
        }
    }

    /// The component's bytes, as embedded.
    pub fn bytes(self) -> &'static [u8] {
        match self {
            Builtin::Fs => kvwasm_guest_artifacts::FS,
            Builtin::Memory => kvwasm_guest_artifacts::MEMORY,
            Builtin::Redis => kvwasm_guest_artifacts::REDIS,
            Builtin::S3 => kvwasm_guest_artifacts::S3,
            Builtin::Advisor => kvwasm_guest_artifacts::ADVISOR,
        }
    }

    /// BLAKE3 of the embedded bytes, computed once per process: every
    /// `wasm:///dir` open looks the builtin up by it.
    fn hash(self) -> blake3::Hash {
        static HASHES: [OnceLock<blake3::Hash>; Builtin::ALL.len()] =
            [const { OnceLock::new() }; Builtin::ALL.len()];
        *HASHES[self as usize].get_or_init(|| blake3::hash(self.bytes()))
    }

    /// Every builtin of this crate.
    pub const ALL: [Builtin; 5] = [
        Builtin::Fs,
        Builtin::Memory,
        Builtin::Redis,
        Builtin::S3,
        Builtin::Advisor,
    ];
}

/// Every builtin this program can load: this crate's, then those of the
/// installed extensions (`kvwasm compile` compiles them all).
pub fn every_builtin() -> Vec<ComponentSource> {
    let own = Builtin::ALL.into_iter().map(ComponentSource::Builtin);
    let linked = crate::extension::linked_builtins()
        .into_iter()
        .map(|b| ComponentSource::LinkedBuiltin(b.name.to_owned()));
    own.chain(linked).collect()
}

impl ComponentSource {
    /// A builtin's bytes (`None` for a file), or why this program has
    /// none.
    pub fn builtin_bytes(&self) -> Option<wasmtime::Result<&'static [u8]>> {
        match self {
            ComponentSource::Builtin(b) => Some(Ok(b.bytes())),
            ComponentSource::LinkedBuiltin(name) => Some(linked(name).map(|b| b.bytes)),
            ComponentSource::File(_) => None,
        }
    }
}

/// The installed builtin `name`, or why there is none: a builtin of an
/// extension this program has not installed (all of them in
/// libkv_store_wasm.so, which runs no fabric or subscriber), or a name
/// nothing ships.
fn linked(name: &str) -> wasmtime::Result<&'static crate::extension::LinkedBuiltin> {
    use crate::extension::SHIPPED_BUILTINS;
    crate::extension::linked_builtin(name).ok_or_else(|| {
        let known: Vec<String> = every_builtin().iter().map(|s| s.to_string()).collect();
        let known = known.join(", ");
        let shipped = SHIPPED_BUILTINS.iter().any(|(shipped, _)| *shipped == name);
        if shipped && crate::extension::installed().is_empty() {
            wasmtime::format_err!(
                "builtin:{name} is not linked into this program, which links {known}: a \
                 kv_store_v1 library (libkv_store_wasm.so) embeds only the kv-store backends and \
                 the storage advisor; fabrics and event subscribers run in `kvwasm`"
            )
        } else if shipped {
            wasmtime::format_err!(
                "builtin:{name} is not linked into this program, which links {known}; `kvwasm` \
                 runs it"
            )
        } else {
            let elsewhere: Vec<String> = SHIPPED_BUILTINS
                .iter()
                .filter(|(shipped, _)| crate::extension::linked_builtin(shipped).is_none())
                .map(|(shipped, _)| format!("builtin:{shipped}"))
                .collect();
            let elsewhere = if elsewhere.is_empty() {
                String::new()
            } else {
                format!("; in `kvwasm` also {}", elsewhere.join(", "))
            };
            wasmtime::format_err!(
                "unknown builtin component {name:?} (this program links {known}{elsewhere})"
            )
        }
    })
}

impl std::str::FromStr for ComponentSource {
    type Err = String;
    fn from_str(s: &str) -> Result<ComponentSource, String> {
        let Some(name) = s.strip_prefix("builtin:") else {
            return Ok(ComponentSource::File(s.into()));
        };
        if let Some(own) = Builtin::ALL.into_iter().find(|b| b.name() == name) {
            return Ok(ComponentSource::Builtin(own));
        }
        let well_formed = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if well_formed {
            Ok(ComponentSource::LinkedBuiltin(name.to_owned()))
        } else {
            Err(format!(
                "unknown builtin component {name:?}: builtin names are lowercase letters, \
                 digits and '-'"
            ))
        }
    }
}

impl std::fmt::Display for ComponentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComponentSource::Builtin(b) => write!(f, "builtin:{}", b.name()),
            ComponentSource::LinkedBuiltin(name) => write!(f, "builtin:{name}"),
            ComponentSource::File(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A component's exports, typed for its kind and pre-linked.
enum Exports {
    KvStore(BackendExportsPre<HostState>),
    Fabric(FabricPre<HostState>),
    Subscriber(SubscriberExports),
}

/// An event subscriber's exports: `subscriber`, `http-api` if it serves
/// one, and `advisor` if it is a storage advisor.
pub(crate) struct SubscriberExports {
    pub(crate) pre: wasmtime::component::InstancePre<HostState>,
    pub(crate) subscriber: subscriber::GuestIndices,
    pub(crate) http_api: Option<http_api::GuestIndices>,
    pub(crate) advisor: Option<advisor::GuestIndices>,
    /// An advisor told the store's own moves (events 0.1.1).
    pub(crate) advisor_moves: Option<advisor_moves::GuestIndices>,
}

impl SubscriberExports {
    fn new(pre: wasmtime::component::InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(SubscriberExports {
            subscriber: subscriber::GuestIndices::new(&pre)?,
            http_api: http_api::GuestIndices::new(&pre).ok(),
            advisor: advisor::GuestIndices::new(&pre).ok(),
            advisor_moves: advisor_moves::GuestIndices::new(&pre).ok(),
            pre,
        })
    }
}

/// A compiled component, linked against the host and ready to instantiate.
pub struct LoadedComponent {
    /// BLAKE3 of the component bytes.
    pub hash: blake3::Hash,
    /// Hex SHA-256 of the component bytes (what a config's `sha256` pins).
    pub sha256: String,
    /// Size of the component in bytes.
    pub size: usize,
    /// How the compiled code was obtained.
    pub origin: Origin,
    pre: Exports,
    /// What a kv-store guest says about itself; asked once, on first
    /// instantiation.
    pub(crate) info: OnceLock<BackendInfo>,
    /// The engine the code was compiled for.
    pub(crate) engine: &'static wasmtime::Engine,
    /// Whether that engine meters fuel (then every store needs a budget).
    pub(crate) metering: Metering,
}

impl LoadedComponent {
    /// Load (or reuse, within this process) the component from `source`,
    /// compiled for the ordinary (unmetered) engine.
    pub fn load(source: &ComponentSource) -> wasmtime::Result<Arc<LoadedComponent>> {
        LoadedComponent::load_for(source, Metering::Off)
    }

    /// As [`LoadedComponent::load`], compiled for `metering`'s engine.
    pub fn load_for(
        source: &ComponentSource,
        metering: Metering,
    ) -> wasmtime::Result<Arc<LoadedComponent>> {
        LoadedComponent::load_with(source, metering, Compile::IfNotCached)?
            .ok_or_else(|| wasmtime::format_err!("{source}: no component was produced"))
    }

    /// As [`LoadedComponent::load`], but only if its compiled code is in
    /// the artifact cache (or already loaded): `None` when it would have
    /// to be compiled.
    pub fn load_if_cached(source: &ComponentSource) -> wasmtime::Result<Option<Arc<Self>>> {
        LoadedComponent::load_with(source, Metering::Off, Compile::Never)
    }

    fn load_with(
        source: &ComponentSource,
        metering: Metering,
        compile: Compile,
    ) -> wasmtime::Result<Option<Arc<LoadedComponent>>> {
        let bytes = read(source)?;
        let hash = match source {
            ComponentSource::Builtin(b) => b.hash(),
            ComponentSource::LinkedBuiltin(name) => linked(name)?.hash(),
            ComponentSource::File(_) => blake3::hash(&bytes),
        };

        // Components are shared by content, so two config entries naming the
        // same file (or a builtin) compile and link once per process: once
        // per set of extensions, so an extension installed after a load
        // (a test, an embedding program) is seen by the loads that follow.
        type Loaded = HashMap<(blake3::Hash, Metering, usize), Arc<LoadedComponent>>;
        static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
        let loaded = LOADED.get_or_init(Default::default);
        let extensions = crate::extension::installed().len();
        if let Some(found) = loaded.lock().unwrap().get(&(hash, metering, extensions)) {
            return Ok(Some(found.clone()));
        }
        let engine = engine_for(metering);
        let (component, origin) = match compile {
            Compile::IfNotCached => artifact_cache::load(engine, &bytes, &hash)?,
            Compile::Never => match artifact_cache::load_cached(engine, &hash) {
                Some(component) => (component, Origin::Cached),
                None => return Ok(None),
            },
        };
        let (extensions, linker) = linker(metering)?;
        let pre = linker.instantiate_pre(&component)?;
        let pre = match BackendExportsPre::new(pre.clone()) {
            Ok(store) => Exports::KvStore(store),
            Err(not_store) => match FabricPre::new(pre.clone()) {
                Ok(fabric) => Exports::Fabric(fabric),
                Err(not_fabric) => match SubscriberExports::new(pre) {
                    Ok(subscriber) => Exports::Subscriber(subscriber),
                    Err(not_subscriber) => wasmtime::bail!(
                        "{source} is not a kvwasm guest: not a kv-store backend (exporting \
                         kvwasm:kv-store/store: {not_store}), a fabric (exporting \
                         kvwasm:fabric/transport: {not_fabric}) or an event subscriber \
                         (exporting kvwasm:events/subscriber: {not_subscriber})"
                    ),
                },
            },
        };
        tracing::debug!(%source, ?origin, size = bytes.len(), "component loaded");
        let sha256 = sha256_hex(&bytes);
        let component = Arc::new(LoadedComponent {
            hash,
            sha256,
            size: bytes.len(),
            origin,
            pre,
            info: OnceLock::new(),
            engine,
            metering,
        });
        Ok(Some(
            loaded
                .lock()
                .unwrap()
                .entry((hash, metering, extensions))
                .or_insert(component)
                .clone(),
        ))
    }
}

/// Whether loading a component may compile it.
#[derive(Clone, Copy)]
enum Compile {
    IfNotCached,
    Never,
}

impl LoadedComponent {
    /// Which kind of guest this is.
    pub fn kind(&self) -> GuestKind {
        match self.pre {
            Exports::KvStore(_) => GuestKind::KvStore,
            Exports::Fabric(_) => GuestKind::Fabric,
            Exports::Subscriber(_) => GuestKind::Subscriber,
        }
    }

    /// Whether this is a storage advisor (an event subscriber exporting
    /// `kvwasm:events/advisor`).
    pub fn is_advisor(&self) -> bool {
        self.subscriber_exports().is_ok_and(|e| e.advisor.is_some())
    }

    /// The kv-store exports, or an error naming what the component is.
    pub(crate) fn store_pre(&self) -> Result<&BackendExportsPre<HostState>, KvError> {
        match &self.pre {
            Exports::KvStore(pre) => Ok(pre),
            _ => Err(self.not_a(GuestKind::KvStore)),
        }
    }

    /// The fabric exports, or an error naming what the component is.
    pub(crate) fn fabric_pre(&self) -> Result<&FabricPre<HostState>, KvError> {
        match &self.pre {
            Exports::Fabric(pre) => Ok(pre),
            _ => Err(self.not_a(GuestKind::Fabric)),
        }
    }

    /// The event subscriber exports, or an error naming what the component is.
    pub(crate) fn subscriber_exports(&self) -> Result<&SubscriberExports, KvError> {
        match &self.pre {
            Exports::Subscriber(exports) => Ok(exports),
            _ => Err(self.not_a(GuestKind::Subscriber)),
        }
    }

    /// Why this component cannot serve as a `wanted`.
    fn not_a(&self, wanted: GuestKind) -> KvError {
        KvError::Host(format!(
            "the component is a {}, not a {wanted}: configure it under [{}.NAME], not [{}.NAME]",
            self.kind(),
            self.kind().config_table(),
            wanted.config_table()
        ))
    }
}

/// What an operator reads before granting anything (`kvwasm inspect`).
#[derive(Clone, Debug)]
pub struct Description {
    pub size: usize,
    pub sha256: String,
    /// Interfaces the component imports: what it could ask for.
    pub imports: Vec<String>,
    /// Interfaces (and functions) it exports.
    pub exports: Vec<String>,
}

impl Description {
    /// Whether it exports the kv-store `store` interface.
    pub fn is_kv_store_backend(&self) -> bool {
        self.exports
            .iter()
            .any(|e| e.starts_with("kvwasm:kv-store/store@"))
    }

    /// Whether it exports the event `subscriber` interface.
    pub fn is_subscriber(&self) -> bool {
        self.exports
            .iter()
            .any(|e| e.starts_with("kvwasm:events/subscriber@"))
    }

    /// Whether it exports the storage `advisor` interface (it is then also
    /// a subscriber).
    pub fn is_advisor(&self) -> bool {
        self.exports
            .iter()
            .any(|e| e.starts_with("kvwasm:events/advisor@"))
    }

    /// Whether it exports the fabric `transport` interface.
    pub fn is_fabric(&self) -> bool {
        self.exports
            .iter()
            .any(|e| e.starts_with("kvwasm:fabric/transport@"))
    }
}

/// Describe the component at `source` without linking or running it.
pub fn describe(source: &ComponentSource) -> wasmtime::Result<Description> {
    let bytes = read(source)?;
    let (component, _) = artifact_cache::load(engine(), &bytes, &blake3::hash(&bytes))?;
    let ty = component.component_type();
    let names = |items: &mut dyn Iterator<Item = &str>| {
        let mut v: Vec<String> = items.map(str::to_owned).collect();
        v.sort();
        v
    };
    let engine = engine();
    Ok(Description {
        size: bytes.len(),
        sha256: sha256_hex(&bytes),
        imports: names(&mut ty.imports(engine).map(|(name, _)| name)),
        exports: names(&mut ty.exports(engine).map(|(name, _)| name)),
    })
}

fn read(source: &ComponentSource) -> wasmtime::Result<std::borrow::Cow<'static, [u8]>> {
    Ok(match source {
        ComponentSource::Builtin(b) => b.bytes().into(),
        ComponentSource::LinkedBuiltin(name) => linked(name)?.bytes.into(),
        ComponentSource::File(path) => std::fs::read(path)
            .map_err(|e| wasmtime::format_err!("cannot read component {}: {e}", path.display()))?
            .into(),
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex_string(&sha2::Sha256::digest(bytes))
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Everything a backend may import: WASI 0.2, wasi:http and wasi:config
/// (each capability inert unless granted in its context) and the kv-store
/// host interfaces; WASI with kvwasm's guards in place of the functions
/// that could block or escape (`guards::dirs::add_to_linker`); then the
/// imports of the installed extensions ([`crate::extension`]), which may
/// replace the block-hash refusal. Built once per engine and set of
/// extensions: one installed later (a test, a tool) gets a new linker.
/// Returns it with how many extensions it links (extensions are only
/// ever added, so the count names the set).
fn linker(metering: Metering) -> wasmtime::Result<(usize, &'static Linker<HostState>)> {
    type Built = Option<(usize, &'static Linker<HostState>)>;
    static LINKERS: [Mutex<Built>; 2] = [Mutex::new(None), Mutex::new(None)];
    let mut slot = LINKERS[metering as usize].lock().unwrap();
    // Read under the slot's lock: a thread holding an older set cannot
    // store a linker without an extension another thread already linked.
    let extensions = crate::extension::installed();
    if let Some((built_with, linker)) = *slot
        && built_with == extensions.len()
    {
        return Ok((built_with, linker));
    }
    let mut linker = Linker::new(engine_for(metering));
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
    wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)?;
    let mut tls = wasmtime_wasi_tls::p2::LinkOptions::default();
    tls.tls(true);
    wasmtime_wasi_tls::p2::add_to_linker(&mut linker, &tls)?;
    types::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    payload_io::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    payload_streams::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    known_chunks::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
    crate::block_hash_refusal::add_to_linker(&mut linker)?;
    wasmtime_wasi_config::add_to_linker(&mut linker, |s: &mut HostState| {
        wasmtime_wasi_config::WasiConfig::from(&*s.settings)
    })?;
    crate::guards::dirs::add_to_linker(&mut linker)?;
    crate::guards::http::add_to_linker(&mut linker)?;
    crate::guards::tls::add_to_linker(&mut linker)?;
    linker.allow_shadowing(true);
    for extension in &extensions {
        if let Some(add) = extension.host_imports {
            add(&mut linker)?;
        }
    }
    linker.allow_shadowing(false);
    // A few linkers per process at most (one per engine and extension
    // installed), each shared by every component loaded with it.
    let linker: &'static Linker<HostState> = Box::leak(Box::new(linker));
    *slot = Some((extensions.len(), linker));
    Ok((extensions.len(), linker))
}
