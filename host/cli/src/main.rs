//! `kvwasm`: run, check and operate sandboxed kv_store_v1 backends.

mod compile;
mod consumer;
mod demo;

use clap::{Parser, Subcommand};

/// Sandboxed WebAssembly storage backends for kv_store_v1 inference engines.
///
/// Engines load libkv_store_wasm.so and open `wasm:///dir` (the built-in
/// filesystem backend) or `wasm://<backend>/<namespace>` (a backend from the
/// config file, see KVWASM_CONFIG).
#[derive(Parser)]
#[command(name = "kvwasm", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Demo(demo::DemoArgs),
    Compile(compile::CompileArgs),
}

fn main() -> std::process::ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KVWASM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    let result = match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Compile(args) => compile::run(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kvwasm: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
