//! `kvwasm compile`: fill the artifact cache ahead of time.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use kvwasm_host::artifact_cache::{self, Origin};
use kvwasm_host::component::{ComponentSource, LoadedComponent};
use kvwasm_host::config::{self, Config};

/// Precompile components into the artifact cache, so the first `open` of a
/// process loads machine code instead of compiling (~0.2 s per component).
///
/// With no arguments: the built-in backends and every component in the
/// config file (if one is found).
#[derive(Args)]
pub struct CompileArgs {
    /// Component files to compile, in addition to the defaults.
    components: Vec<PathBuf>,
    /// Config file whose components to compile (default: KVWASM_CONFIG, then
    /// the standard locations).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: CompileArgs) -> anyhow::Result<()> {
    let dir = artifact_cache::cache_dir().context(
        "the artifact cache is disabled (KVWASM_CACHE_DIR=off) or no home directory is known",
    )?;
    println!("artifact cache: {}", dir.display());

    let mut sources: Vec<ComponentSource> = kvwasm_host::component::every_builtin();
    let config_path = args.config.clone().map(Ok).unwrap_or_else(config::locate);
    match config_path {
        Ok(path) => {
            let config = Config::load(&path).map_err(anyhow::Error::msg)?;
            // A tiered entry has no component of its own.
            for backend in config.backends.values().filter(|b| b.tiers.is_empty()) {
                sources.push(
                    config
                        .component_source(backend)
                        .map_err(anyhow::Error::msg)?,
                );
            }
        }
        Err(why) if args.config.is_none() => {
            println!("no config file ({why}); compiling built-ins only")
        }
        Err(why) => anyhow::bail!(why),
    }
    sources.extend(args.components.into_iter().map(ComponentSource::File));
    sources.dedup();

    for source in sources {
        let started = Instant::now();
        let loaded = LoadedComponent::load(&source)
            .map_err(|e| anyhow::anyhow!("compiling {source}: {e:#}"))?;
        let state = match loaded.origin {
            Origin::Cached => "already cached",
            Origin::Compiled => "compiled",
            Origin::CompiledUncached => "compiled, NOT cached (cache not writable)",
        };
        println!(
            "  {:<40} {:>8} KiB  {state:<16} {:>7.1} ms  blake3 {}",
            source.to_string(),
            loaded.size / 1024,
            started.elapsed().as_secs_f64() * 1e3,
            &loaded.hash.to_hex()[..16]
        );
    }
    Ok(())
}
