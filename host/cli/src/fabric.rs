//! `kvwasm fabric serve` and `kvwasm fabric send`: hand a slot (a manifest and its chunks) from
//! one store to another over an MRDN fabric, sending only the chunks the receiver lacks
//! (docs/fabric.md, "Slot handoff").

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use kvwasm_fabric::{ChunkHash, Key, Limits, SendOptions, Server};
use kvwasm_mrdn::Tier;

/// Hand slots between stores over an MRDN fabric.
#[derive(Args)]
pub struct FabricArgs {
    #[command(subcommand)]
    command: FabricCommand,
}

#[derive(Subcommand)]
enum FabricCommand {
    Serve(ServeArgs),
    Send(SendArgs),
}

/// Receive slots: verify every frame pushed over the link (the `tcp` fabric's peer) and store
/// its chunk or manifest. Prints `listening on ADDR`, then runs until killed.
#[derive(Args)]
struct ServeArgs {
    /// Address to listen on, e.g. 127.0.0.1:7070 (port 0 picks a free one).
    #[arg(long)]
    listen: String,
    /// The store to write into (`wasm:///dir` or `wasm://backend/namespace`).
    #[arg(long)]
    into: String,
    /// Largest frame accepted; a larger PUSH is refused and its connection closed.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_frame_mib: u32,
    /// Connections served at once; more are refused.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Close a connection with no request for this long.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    idle_timeout_s: u64,
    /// Close a connection stalled this long inside a request (or not reading responses).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    io_timeout_ms: u64,
    /// Slowest a request may arrive or a response be read: each must be done within the I/O
    /// timeout plus its length at this rate.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    min_kib_per_s: u64,
    /// Accept only messages tagged with the key (64 hex characters) held by this environment
    /// variable; the sender needs the same key. Without it, any client may store.
    #[arg(long, value_name = "NAME")]
    key_env: Option<String>,
    /// Check that each chunk's bytes are what its name says before storing it, for senders
    /// whose chunks are named this way (xxh3-64: 8 bytes, little-endian, as llama.cpp slots and
    /// `kvwasm demo` name them); a chunk that does not match is refused.
    #[arg(long, value_enum, value_name = "HASH")]
    verify_hash: Option<VerifyHashArg>,
}

#[derive(Clone, Copy, ValueEnum)]
enum VerifyHashArg {
    #[value(name = "xxh3-64")]
    Xxh3_64,
}

impl From<VerifyHashArg> for ChunkHash {
    fn from(hash: VerifyHashArg) -> ChunkHash {
        match hash {
            VerifyHashArg::Xxh3_64 => ChunkHash::Xxh3_64,
        }
    }
}

/// Send a slot: ask the receiver which chunks it lacks, send those, then the manifest, over
/// the fabric `[fabrics.NAME]` of the config file. Prints one JSON line.
#[derive(Args)]
struct SendArgs {
    /// The source store (`wasm:///dir` or `wasm://backend/namespace`).
    #[arg(long)]
    from: String,
    /// The manifest to send (its chunks are read from the demo manifest format unless
    /// --hashes is given).
    #[arg(long)]
    manifest: String,
    /// The fabric to send over: `[fabrics.NAME]` in the config file.
    #[arg(long)]
    fabric: String,
    /// A file listing the manifest's chunks, one hex hash per line.
    #[arg(long)]
    hashes: Option<PathBuf>,
    /// The tier every frame is labelled with.
    #[arg(long, value_enum, default_value_t = TierArg::ThinkComplete)]
    tier: TierArg,
    /// Tag every message with the key (64 hex characters) held by this environment variable,
    /// and accept only replies the receiver tagged with it (`fabric serve --key-env`). The
    /// fabric guest never sees it.
    #[arg(long, value_name = "NAME")]
    key_env: Option<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum TierArg {
    ThinkComplete,
    ThinkActive,
    OutputCritical,
}

impl From<TierArg> for Tier {
    fn from(tier: TierArg) -> Tier {
        match tier {
            TierArg::ThinkComplete => Tier::ThinkComplete,
            TierArg::ThinkActive => Tier::ThinkActive,
            TierArg::OutputCritical => Tier::OutputCritical,
        }
    }
}

pub fn run(args: FabricArgs) -> anyhow::Result<()> {
    match args.command {
        FabricCommand::Serve(args) => serve(args),
        FabricCommand::Send(args) => send(args),
    }
}

/// The key `--key-env NAME` names, if given (never in argv or the config file; errors name the
/// variable, never its value).
fn key(key_env: Option<&str>) -> anyhow::Result<Option<Key>> {
    key_env
        .map(Key::from_env)
        .transpose()
        .map_err(anyhow::Error::msg)
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let key = key(args.key_env.as_deref())?;
    let store = kvwasm_host::open(&args.into).with_context(|| format!("open {}", args.into))?;
    let limits = Limits {
        max_frame_bytes: (args.max_frame_mib as usize) << 20,
        max_connections: args.max_connections as usize,
        idle_timeout: Duration::from_secs(args.idle_timeout_s),
        io_timeout: Duration::from_millis(args.io_timeout_ms),
        min_bytes_per_s: args.min_kib_per_s << 10,
        verify_hash: args.verify_hash.map(ChunkHash::from),
        ..Limits::default()
    };
    let server = Server::bind_keyed(&args.listen, store, limits, key)
        .with_context(|| format!("listen on {}", args.listen))?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", server.local_addr()?)?;
    out.flush()?;
    drop(out);
    Ok(server.run()?)
}

fn send(args: SendArgs) -> anyhow::Result<()> {
    let key = key(args.key_env.as_deref())?;
    let hashes = match &args.hashes {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("read {}", path.display()))?;
            let hashes = kvwasm_fabric::send::parse_hash_list(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            Some(hashes)
        }
        None => None,
    };
    let source = kvwasm_host::open(&args.from).with_context(|| format!("open {}", args.from))?;
    let fabric = open_fabric(&args.fabric, args.key_env.as_deref())
        .with_context(|| format!("open fabric {:?}", args.fabric))?;
    let options = SendOptions {
        manifest: args.manifest,
        hashes,
        tier: args.tier.into(),
    };
    let report = kvwasm_fabric::send_keyed(&source, &fabric, &options, key.as_ref())
        .with_context(|| format!("send {:?} over fabric {:?}", options.manifest, args.fabric))?;
    println!("{}", report.to_json());
    Ok(())
}

/// The fabric `[fabrics.NAME]` of the config file, as `Fabric::open` starts it, refused if its
/// `env` grant would hand the guest the key's variable.
fn open_fabric(name: &str, key_env: Option<&str>) -> anyhow::Result<kvwasm_host::fabric::Fabric> {
    let path = kvwasm_host::config::locate().map_err(anyhow::Error::msg)?;
    let config = kvwasm_host::config::Config::load(&path).map_err(anyhow::Error::msg)?;
    let policy = config.fabric(name).map_err(anyhow::Error::msg)?;
    if let Some(var) = key_env
        && policy.grants.env.names.iter().any(|n| n == var)
    {
        anyhow::bail!(
            "its `env` grant includes {var}, the --key-env variable: the guest would see the key"
        );
    }
    kvwasm_host::metrics::serve_from_env();
    Ok(kvwasm_host::fabric::Fabric::start(Arc::new(policy))?)
}
