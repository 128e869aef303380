//! `kvwasm`: run, check and operate sandboxed kv_store_v1 backends.

mod bench;
mod check;
mod check_config;
mod compile;
mod consumer;
mod demo;
mod fabric;
mod inspect;
mod metrics;
mod new;
mod serve;
mod tier;

use clap::{Parser, Subcommand};

/// Sandboxed WebAssembly storage backends for kv_store_v1 inference engines.
///
/// Engines load libkv_store_wasm.so and open `wasm:///dir` (the built-in
/// filesystem backend) or `wasm://<backend>/<namespace>` (a backend from the
/// config file, see KVWASM_CONFIG).
#[derive(Parser)]
#[command(name = "kvwasm", version, propagate_version = true, after_help = ENVIRONMENT)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

const ENVIRONMENT: &str = "\
Environment:
  KVWASM_CONFIG           config file naming backends (default: $XDG_CONFIG_HOME/kvwasm/config.toml,
                          then /etc/kvwasm/config.toml)
  KVWASM_CACHE_DIR        precompiled-component cache (default: $XDG_CACHE_HOME/kvwasm); `off` disables
  KVWASM_LOG              log filter, e.g. `debug` (default: warn)
  KVWASM_METRICS_ADDR     serve per-backend counters at http://ADDR/metrics (Prometheus text)
  KV_STORE_LIBRARY_PATH   where consumers look for libkv_store_wasm.so first";

#[derive(Subcommand)]
enum Command {
    Demo(demo::DemoArgs),
    Check(check::CheckArgs),
    // Boxed: its many options would make every command as large.
    Bench(Box<bench::BenchArgs>),
    Inspect(inspect::InspectArgs),
    CheckConfig(check_config::CheckConfigArgs),
    Metrics(metrics::MetricsArgs),
    Compile(compile::CompileArgs),
    Fabric(fabric::FabricArgs),
    Serve(serve::ServeArgs),
    Tier(tier::TierArgs),
    New(new::NewArgs),
    Wit(new::WitArgs),
}

fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVWASM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    // Every command may name any builtin (inspect, compile, check-config,
    // fabrics, serve); kvwasm-host embeds only the kv-store kind's, as the
    // shim does.
    kvwasm_fabric::builtins::install();
    kvwasm_kv_indexer_host::install();
    let result = match Cli::parse().command {
        Command::Demo(args) => demo::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Check(args) => check::run(args),
        Command::Bench(args) => bench::run(*args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Inspect(args) => inspect::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::CheckConfig(args) => check_config::run(args),
        Command::Metrics(args) => metrics::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Compile(args) => compile::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Fabric(args) => fabric::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Tier(args) => tier::run(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::New(args) => new::run_new(args).map(|()| std::process::ExitCode::SUCCESS),
        Command::Wit(args) => new::run_wit(args).map(|()| std::process::ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvwasm: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
