//! `kvwasm check`: the kv_store_v1 conformance suite against a native
//! backend library or a WebAssembly component behind the shim.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use kvwasm_conformance::child::ChildArgs;
use kvwasm_conformance::{CHECKS, Runner, Target, report};

/// Run the kv_store_v1 conformance suite against a backend.
///
/// Native backend:       kvwasm check --lib ./libkv_store_foo.so --uri foo://...
/// WebAssembly backend:  kvwasm check --component backend.wasm [--config kvwasm.toml]
///
/// Every check runs in its own child process under glibc's malloc checker,
/// so a backend that crashes or hangs fails that check, not the run. Exit
/// status: 0 when every MUST holds (SHOULD failures are warnings unless
/// --strict), 1 otherwise, 2 on command-line errors.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct CheckArgs {
    /// Backend library to load with dlopen. With --component: the shim
    /// (default: $KV_STORE_LIBRARY_PATH/libkv_store_wasm.so, else the one
    /// next to this executable).
    #[arg(long, value_name = "PATH")]
    lib: Option<PathBuf>,
    /// URI passed to open(). Required with a native --lib; with --component
    /// it defaults to wasm://<backend>/kvwasm-check.
    #[arg(long)]
    uri: Option<String>,
    /// WebAssembly backend to check through libkv_store_wasm.so: a .wasm
    /// component, builtin:fs / builtin:memory, or a config file (`*.toml`,
    /// such as a project's kvwasm.toml) whose backend entry names one.
    #[arg(long, value_name = "FILE")]
    component: Option<String>,
    /// Config file whose backend entry supplies the component's grants and
    /// limits (default: a fresh temporary directory granted at /data).
    #[arg(long, value_name = "FILE", requires = "component")]
    config: Option<PathBuf>,
    /// Which backend entry of the config file (--config, or a `*.toml`
    /// --component) to use (default: the only one).
    #[arg(long, value_name = "NAME", requires = "component")]
    backend: Option<String>,
    /// Print the report as JSON on stdout (for CI).
    #[arg(long)]
    json: bool,
    /// Run only these checks (comma-separated names; see --list).
    #[arg(long, value_delimiter = ',', value_name = "CHECKS")]
    only: Vec<String>,
    /// Skip these checks (comma-separated names).
    #[arg(long, value_delimiter = ',', value_name = "CHECKS")]
    skip: Vec<String>,
    /// A fast subset: quick checks only, smaller sizes and fewer iterations.
    #[arg(long)]
    quick: bool,
    /// Fail on SHOULD violations too.
    #[arg(long)]
    strict: bool,
    /// Seconds before a check's process is killed and the check failed.
    #[arg(long, default_value_t = 300, value_name = "SECS")]
    timeout: u64,
    /// List the checks and the rules they enforce, then exit.
    #[arg(long)]
    list: bool,
    /// Internal: run one check in this process (the runner's child).
    #[arg(long, hide = true)]
    run_one: Option<String>,
    #[arg(long, hide = true)]
    run_id: Option<String>,
    #[arg(long, hide = true)]
    leak_outputs: bool,
}

pub fn run(args: CheckArgs) -> anyhow::Result<std::process::ExitCode> {
    if args.list {
        list();
        return Ok(std::process::ExitCode::SUCCESS);
    }
    if let Some(check) = args.run_one {
        let (Some(lib), Some(uri)) = (args.lib, args.uri) else {
            bail!("--run-one needs --lib and --uri");
        };
        return Ok(kvwasm_conformance::child::run(&ChildArgs {
            lib,
            uri,
            check,
            run_id: args.run_id.unwrap_or_else(|| "manual".into()),
            quick: args.quick,
            leak_outputs: args.leak_outputs,
        }));
    }

    // Kept alive until the run ends: the temporary config and data dir.
    let mut scratch = None;
    let target = match (&args.component, &args.lib, &args.uri) {
        (Some(component), lib, uri) => {
            let dir = tempfile::Builder::new().prefix("kvwasm-check-").tempdir()?;
            let target = component_target(component, &args, lib.clone(), uri.clone(), dir.path())?;
            scratch = Some(dir);
            target
        }
        (None, Some(lib), Some(uri)) => Target {
            lib: absolute(lib)?,
            uri: uri.clone(),
            env: Vec::new(),
        },
        (None, _, _) => {
            bail!("say what to check: --lib PATH --uri URI (a native backend) or --component FILE")
        }
    };

    let runner = Runner {
        exe: std::env::current_exe().context("locating this executable")?,
        exe_args: vec!["check".into()],
        quick: args.quick,
        only: args.only,
        skip: args.skip,
        timeout: Duration::from_secs(args.timeout),
    };
    if !args.json {
        println!("kvwasm check: {} via {}", target.uri, target.lib.display());
        println!("{}", report::table_header());
    }
    let json = args.json;
    let report = runner
        .run(&target, |result| {
            if !json {
                println!("{}", report::table_row(result));
                let _ = std::io::stdout().flush();
            }
        })
        .map_err(anyhow::Error::msg)?;
    drop(scratch);
    if json {
        println!("{}", report.to_json());
    } else {
        println!("\n{}", report.summary());
        if !report.malloc_checker {
            println!(
                "note: glibc's libc_malloc_debug.so.0 was not found; malloc-outputs relied on malloc_usable_size alone"
            );
        }
    }
    let warned = report.count(kvwasm_conformance::Verdict::Warn) > 0;
    Ok(if report.ok() && !(args.strict && warned) {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// The shim plus a config naming the component, in `scratch`.
fn component_target(
    component: &str,
    args: &CheckArgs,
    lib: Option<PathBuf>,
    uri: Option<String>,
    scratch: &Path,
) -> anyhow::Result<Target> {
    let lib = match lib {
        Some(lib) => absolute(&lib)?,
        None => crate::consumer::locate_shim().context(
            "libkv_store_wasm.so not found: pass --lib, set KV_STORE_LIBRARY_PATH, or build it",
        )?,
    };
    // A project's kvwasm.toml names its component: check what it configures.
    if component.ends_with(".toml") {
        if args.config.is_some() {
            bail!("--component {component} is a config file: pass either it or --config, not both");
        }
        let (backend, text) = operator_config(Path::new(component), args.backend.as_deref(), None)?;
        return write_target(lib, uri, scratch, backend, text);
    }
    let component = if component.starts_with("builtin:") {
        component.to_owned()
    } else {
        let path = absolute(Path::new(component))?;
        refuse_non_wasm(&path)?;
        path.display().to_string()
    };
    let (backend, text) = match &args.config {
        Some(path) => operator_config(path, args.backend.as_deref(), Some(&component))?,
        None if args.backend.is_some() => {
            bail!(
                "--backend picks an entry of a config file: pass --config or a *.toml --component"
            )
        }
        None => {
            let mut table = toml::Table::new();
            table.insert("component".into(), component.into());
            table.insert(
                "dir".into(),
                scratch.join("data").display().to_string().into(),
            );
            let mut backends = toml::Table::new();
            backends.insert("check".into(), table.into());
            let mut root = toml::Table::new();
            root.insert("backends".into(), backends.into());
            ("check".to_owned(), toml::to_string(&root)?)
        }
    };
    write_target(lib, uri, scratch, backend, text)
}

/// The shim, opening `wasm://<backend>/...` under the config `text`
/// written into `scratch`.
fn write_target(
    lib: PathBuf,
    uri: Option<String>,
    scratch: &Path,
    backend: String,
    text: String,
) -> anyhow::Result<Target> {
    let config = scratch.join("kvwasm.toml");
    std::fs::write(&config, text)?;
    Ok(Target {
        lib,
        uri: uri.unwrap_or_else(|| format!("wasm://{backend}/kvwasm-check")),
        env: vec![(
            OsString::from(kvwasm_host::config::CONFIG_ENV),
            config.into_os_string(),
        )],
    })
}

/// Refuse up front a file that is not WebAssembly (a config or a script
/// passed by mistake), rather than failing every check on its parse error.
fn refuse_non_wasm(path: &Path) -> anyhow::Result<()> {
    let mut magic = [0u8; 4];
    let read =
        std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    match read {
        Ok(()) if &magic == b"\0asm" => Ok(()),
        // Shorter than the magic number (an empty file): not one either.
        Err(e) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
            Err(e).with_context(|| format!("reading {}", path.display()))
        }
        _ => bail!(
            "{} is not a WebAssembly component (build it first, or pass the project's \
             kvwasm.toml to check what it configures)",
            path.display()
        ),
    }
}

/// The operator's config with `backend`'s component replaced (`None`:
/// kept), relative paths still anchored at the original file's directory.
fn operator_config(
    path: &Path,
    backend: Option<&str>,
    component: Option<&str>,
) -> anyhow::Result<(String, String)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut root: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let base = absolute(path)?
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("/"));
    let declared = root
        .get("base_dir")
        .and_then(|v| v.as_str())
        .map(PathBuf::from);
    let base = declared.map_or(base.clone(), |d| base.join(d));
    root.insert("base_dir".into(), base.display().to_string().into());
    let backends = root
        .get_mut("backends")
        .and_then(|b| b.as_table_mut())
        .with_context(|| format!("{} has no [backends.<name>] entry", path.display()))?;
    let name = match backend {
        Some(name) => name.to_owned(),
        None if backends.len() == 1 => backends.keys().next().expect("one").clone(),
        None => bail!(
            "{} names {} backends; pick one with --backend",
            path.display(),
            backends.len()
        ),
    };
    let entry = backends
        .get_mut(&name)
        .and_then(|b| b.as_table_mut())
        .with_context(|| format!("no [backends.{name}] in {}", path.display()))?;
    match component {
        Some(component) => {
            entry.insert("component".into(), component.into());
        }
        None if !entry.contains_key("component") => {
            bail!("[backends.{name}] in {} names no component", path.display())
        }
        None => {}
    }
    // Validate now, so a bad file is one clear error rather than every
    // check failing to open.
    let out = toml::to_string(&root)?;
    let config =
        kvwasm_host::config::Config::parse(&out, Path::new("/")).map_err(anyhow::Error::msg)?;
    if let Some(spec) = config.backends.get(&name)
        && let Ok(kvwasm_host::component::ComponentSource::File(file)) =
            config.component_source(spec)
    {
        refuse_non_wasm(&file)?;
    }
    Ok((name, out))
}

fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

fn list() {
    for check in CHECKS {
        println!(
            "{:<24} {:<6} {}",
            check.name,
            check.level.to_string(),
            if check.quick { "quick" } else { "full only" }
        );
        println!("    {}", check.rule);
    }
}
