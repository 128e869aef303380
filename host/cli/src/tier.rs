//! `kvwasm tier`: operate tiered stores (docs/tiering.md).

use std::path::PathBuf;

use kvwasm_host::tiering::{self, AdviceSink, TierStatus};

/// Operate a tiered store ([backends.NAME] tiers = [...]).
#[derive(clap::Args)]
pub struct TierArgs {
    #[command(subcommand)]
    command: TierCommand,
}

#[derive(clap::Subcommand)]
enum TierCommand {
    Status(StatusArgs),
}

/// Bytes and chunks per tier (listed now), and the figures the last process
/// using the store recorded: reads served per tier, misses, moves, refused
/// advice and the advisor's last decisions.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
struct StatusArgs {
    /// The config file (default: $KVWASM_CONFIG, then the XDG and /etc locations).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The namespace (what follows the name in wasm://NAME/NAMESPACE).
    #[arg(long, default_value = "")]
    namespace: String,
    /// The tiered backend entry.
    name: String,
}

pub fn run(args: TierArgs) -> anyhow::Result<()> {
    let TierCommand::Status(args) = args.command;
    let path = match args.config {
        Some(path) => path,
        None => kvwasm_host::config::locate().map_err(anyhow::Error::msg)?,
    };
    if !tiering::is_tiered(&path, &args.name).map_err(anyhow::Error::msg)? {
        anyhow::bail!("backend {:?} is not a tiered store", args.name);
    }
    let handle = tiering::open_tiered(&path, &args.name, &args.namespace)?;
    let store = handle.tiered().expect("a tiered store's handle");
    let usage = store.usage();
    let saved = store.saved_status();
    print!("{}", render(&usage, saved.as_ref()));
    Ok(())
}

/// The report: one row per tier, then the recorded figures.
fn render(usage: &[tiering::TierUsage], saved: Option<&TierStatus>) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let reads: u64 = saved.map_or(0, |s| s.hits.iter().sum::<u64>() + s.misses);
    let _ = writeln!(
        out,
        "{:<4} {:<16} {:>14} {:>14} {:>10} {:>10} {:>9}",
        "tier", "backend", "used bytes", "capacity", "chunks", "hits", "hit ratio"
    );
    for (i, u) in usage.iter().enumerate() {
        let hits = saved.and_then(|s| s.hits.get(i).copied()).unwrap_or(0);
        let ratio = if reads == 0 {
            "-".to_owned()
        } else {
            format!("{:.1}%", 100.0 * hits as f64 / reads as f64)
        };
        let _ = writeln!(
            out,
            "{i:<4} {:<16} {:>14} {:>14} {:>10} {hits:>10} {ratio:>9}",
            u.name,
            u.used_bytes,
            u.capacity_bytes
                .map_or("unbounded".into(), |c| c.to_string()),
            u.chunks,
        );
    }
    let Some(s) = saved else {
        let _ = writeln!(
            out,
            "\nno figures recorded yet (no process has used this store)"
        );
        return out;
    };
    let _ = writeln!(
        out,
        "\nreads {reads}, misses {}\nmoves: {} promotions, {} demotions, {} evictions, {} bytes moved, \
         {} verify failures\nadvice refused: {}",
        s.misses,
        s.promotions,
        s.demotions,
        s.evictions,
        s.moved_bytes,
        s.verify_failures,
        s.refused
    );
    let _ = writeln!(out, "advisor's last decisions:");
    if s.decisions.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for d in &s.decisions {
        let _ = writeln!(out, "  {d}");
    }
    out
}
