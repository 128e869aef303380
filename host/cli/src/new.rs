//! `kvwasm new`: a storage vendor's backend project, complete and buildable
//! wherever it is written; and `kvwasm wit`: the contract it builds against.
//!
//! Both carry the WIT package inside this executable, so a vendor needs no
//! kvwasm checkout. `examples/vendor-starter` is what
//! `kvwasm new --lang rust --kind fs kvwasm-vendor-starter` writes
//! (`tests/tests/vendor_new.rs` keeps the two identical).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The `kvwasm:kv-store` WIT package (`wit/` of the kvwasm source), as
/// `kvwasm wit` writes it: the package and the WASI packages it uses.
pub const WIT_FILES: &[(&str, &str)] = &[
    ("README.md", include_str!("../../../wit/README.md")),
    ("kv-store.wit", include_str!("../../../wit/kv-store.wit")),
    (
        "tls-client.wit",
        include_str!("../../../wit/tls-client.wit"),
    ),
    (
        "deps/clocks.wit",
        include_str!("../../../wit/deps/clocks.wit"),
    ),
    (
        "deps/config.wit",
        include_str!("../../../wit/deps/config.wit"),
    ),
    (
        "deps/filesystem.wit",
        include_str!("../../../wit/deps/filesystem.wit"),
    ),
    ("deps/io.wit", include_str!("../../../wit/deps/io.wit")),
    (
        "deps/sockets.wit",
        include_str!("../../../wit/deps/sockets.wit"),
    ),
    ("deps/tls.wit", include_str!("../../../wit/deps/tls.wit")),
];

/// Write a new backend project: a store, the WIT package, a README, a
/// build script and a config.
///
///   kvwasm new --lang rust acme-kv            # ./acme-kv, a memory-backed store
///   kvwasm new --lang rust --kind fs acme-kv  # files in the directory the operator grants
///   kvwasm new --lang c|python|js [--kind fs] acme-kv
///
/// Then `cd acme-kv && ./build.sh && kvwasm check --component acme-kv.wasm --config kvwasm.toml`.
/// The build scripts of C, Python and JavaScript install their toolchains
/// from the package registries into ~/.cache/kvwasm-tools, once.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct NewArgs {
    /// The language of the store.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Where the data lives: the instance's memory, or files in the
    /// directory the operator grants (moved with payload-io in C, Python
    /// and JavaScript; std::fs in Rust).
    #[arg(long, value_enum, default_value_t = Kind::Memory)]
    kind: Kind,
    /// The project's directory, created (or empty); its last component is
    /// the backend's name: lowercase letters, digits and '-'.
    path: PathBuf,
}

/// Write the WIT package backends build against into a directory.
///
///   kvwasm wit ./wit
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct WitArgs {
    /// Directory to write into (created if missing).
    dir: PathBuf,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Lang {
    Rust,
    C,
    Python,
    Js,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Kind {
    Memory,
    Fs,
}

/// One file of a project: its path, its template, and whether it is a
/// script to run.
struct Template {
    path: &'static str,
    text: &'static str,
    executable: bool,
}

const fn file(path: &'static str, text: &'static str) -> Template {
    Template {
        path,
        text,
        executable: false,
    }
}

const fn script(path: &'static str, text: &'static str) -> Template {
    Template {
        path,
        text,
        executable: true,
    }
}

const RUST: &[Template] = &[
    file("Cargo.toml", include_str!("../templates/rust/Cargo.toml")),
    file("Cargo.lock", include_str!("../templates/rust/Cargo.lock")),
    file("README.md", include_str!("../templates/rust/README.md")),
    file(".gitignore", include_str!("../templates/rust/gitignore")),
    script("build.sh", include_str!("../templates/rust/build.sh")),
];
const RUST_MEMORY: &[Template] = &[
    file(
        "src/lib.rs",
        include_str!("../templates/rust/lib_memory.rs"),
    ),
    file(
        "kvwasm.toml",
        include_str!("../templates/rust/kvwasm_memory.toml"),
    ),
];
const RUST_FS: &[Template] = &[
    file("src/lib.rs", include_str!("../templates/rust/lib_fs.rs")),
    FS_CONFIG,
];

/// The config of every `--kind fs` project: the directory it is granted.
const FS_CONFIG: Template = file("kvwasm.toml", include_str!("../templates/kvwasm_fs.toml"));

const C: &[Template] = &[
    file("README.md", include_str!("../templates/c/README.md")),
    file(".gitignore", include_str!("../templates/c/gitignore")),
    script("build.sh", include_str!("../templates/c/build.sh")),
];
const C_MEMORY: &[Template] = &[
    file("store.c", include_str!("../templates/c/store.c")),
    file("kvwasm.toml", include_str!("../templates/c/kvwasm.toml")),
];
const C_FS: &[Template] = &[
    file("store.c", include_str!("../templates/c/store_fs.c")),
    FS_CONFIG,
];

const PYTHON: &[Template] = &[
    file("README.md", include_str!("../templates/python/README.md")),
    file(".gitignore", include_str!("../templates/python/gitignore")),
    script("build.sh", include_str!("../templates/python/build.sh")),
];
const PYTHON_MEMORY: &[Template] = &[
    file("app.py", include_str!("../templates/python/app.py")),
    file("store.py", include_str!("../templates/python/store.py")),
    file(
        "kvwasm.toml",
        include_str!("../templates/python/kvwasm.toml"),
    ),
];
const PYTHON_FS: &[Template] = &[
    file("app.py", include_str!("../templates/python/app_fs.py")),
    file("store.py", include_str!("../templates/python/store_fs.py")),
    FS_CONFIG,
];

const JS: &[Template] = &[
    file("README.md", include_str!("../templates/js/README.md")),
    file(".gitignore", include_str!("../templates/js/gitignore")),
    script("build.sh", include_str!("../templates/js/build.sh")),
];
const JS_MEMORY: &[Template] = &[
    file("store.js", include_str!("../templates/js/store.js")),
    file("kvwasm.toml", include_str!("../templates/js/kvwasm.toml")),
];
const JS_FS: &[Template] = &[
    file("store.js", include_str!("../templates/js/store_fs.js")),
    FS_CONFIG,
];

/// The templates of a language and kind, and the WIT world the project
/// builds: a memory store needs only payloads; a file store also imports
/// `payload-io` and the granted directories.
fn templates(lang: Lang, kind: Kind) -> (Vec<&'static Template>, &'static str) {
    let (common, kind_files): (&[Template], &[Template]) = match (lang, kind) {
        (Lang::Rust, Kind::Memory) => (RUST, RUST_MEMORY),
        (Lang::Rust, Kind::Fs) => (RUST, RUST_FS),
        (Lang::C, Kind::Memory) => (C, C_MEMORY),
        (Lang::C, Kind::Fs) => (C, C_FS),
        (Lang::Python, Kind::Memory) => (PYTHON, PYTHON_MEMORY),
        (Lang::Python, Kind::Fs) => (PYTHON, PYTHON_FS),
        (Lang::Js, Kind::Memory) => (JS, JS_MEMORY),
        (Lang::Js, Kind::Fs) => (JS, JS_FS),
    };
    let world = match kind {
        Kind::Memory => "backend",
        Kind::Fs => "filesystem-backend",
    };
    (common.iter().chain(kind_files).collect(), world)
}

pub fn run_new(args: NewArgs) -> anyhow::Result<()> {
    let name = args
        .path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no name to give the backend", args.path.display()))?
        .to_owned();
    check_name(&name)?;
    let (templates, world) = templates(args.lang, args.kind);
    let dir = &args.path;
    if dir.exists() && std::fs::read_dir(dir)?.next().is_some() {
        bail!("{} exists and is not empty", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let crate_name = name.replace('-', "_");
    for template in templates {
        let mut text = template
            .text
            .replace("{{name}}", &name)
            .replace("{{crate}}", &crate_name)
            .replace("{{world}}", world)
            .replace("{{world_c}}", &world.replace('-', "_"));
        if template.path == "Cargo.lock" {
            text = with_own_package(&text, &name);
        }
        write(&dir.join(template.path), &text, template.executable)?;
    }
    write_wit(&dir.join("wit"))?;
    eprintln!(
        "wrote {}: cd {} && ./build.sh && kvwasm check --component {name}.wasm --config kvwasm.toml",
        dir.display(),
        dir.display()
    );
    Ok(())
}

pub fn run_wit(args: WitArgs) -> anyhow::Result<()> {
    write_wit(&args.dir)?;
    eprintln!(
        "wrote the kvwasm:kv-store package to {} (world `backend`: see kv-store.wit)",
        args.dir.display()
    );
    Ok(())
}

/// The Rust template's `Cargo.lock` (its dependencies) with the project's
/// own package added where Cargo sorts it, so `cargo build --locked`
/// accepts it as written.
fn with_own_package(lock: &str, name: &str) -> String {
    const SEPARATOR: &str = "\n[[package]]\n";
    let own =
        format!("name = \"{name}\"\nversion = \"0.1.0\"\ndependencies = [\n \"wit-bindgen\",\n]\n");
    let mut parts: Vec<&str> = lock.split(SEPARATOR).collect();
    let head = parts.remove(0);
    let package_name = |block: &str| {
        let rest = block.strip_prefix("name = \"").unwrap_or_default();
        rest[..rest.find('"').unwrap_or(rest.len())].to_owned()
    };
    let at = parts
        .iter()
        .position(|block| package_name(block).as_str() > name)
        .unwrap_or(parts.len());
    parts.insert(at, &own);
    let mut out = head.to_owned();
    for block in parts {
        out.push_str(SEPARATOR);
        out.push_str(block);
    }
    out
}

fn write_wit(dir: &Path) -> anyhow::Result<()> {
    for (path, text) in WIT_FILES {
        write(&dir.join(path), text, false)?;
    }
    Ok(())
}

fn write(path: &Path, text: &str, executable: bool) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    if executable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// A backend name is also a package, file and config-key name: lowercase
/// ASCII letters, digits and '-', starting with a letter.
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!(
            "{name:?} cannot name a backend: use lowercase letters, digits and '-', starting with a letter"
        );
    }
    Ok(())
}
