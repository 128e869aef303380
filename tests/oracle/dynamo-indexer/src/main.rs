//! Dynamo's standalone KV indexer (dynamo-kv-router 1.6.1) as the test oracle:
//! the crate's own service (`AppState`, `create_router`, peer recovery), but
//! bound to 127.0.0.1 only (the crate's `run_server` binds 0.0.0.0) and on a
//! port the tests can learn: with `--port 0` the chosen port is printed on
//! stdout, once the listener is bound.

use std::io::Write;
use std::sync::Arc;

use clap::Parser;
use dynamo_kv_router::services::indexer::{recovery, server};
use tokio::net::TcpListener;

#[derive(Parser)]
#[command(about = "dynamo-kv-router 1.6.1's standalone KV indexer on 127.0.0.1")]
struct Args {
    /// TCP port on 127.0.0.1; 0 picks a free one and prints it on stdout.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Comma-separated peer URLs to recover from (their /dump) before serving.
    #[arg(long)]
    peers: Option<String>,
    /// Indexer threads per (model, routing group).
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let state = Arc::new(server::AppState::new(args.threads)?);
    let registry = &state.registry;
    let peers: Vec<String> = args
        .peers
        .as_deref()
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|peer| !peer.is_empty())
        .map(str::to_owned)
        .collect();
    if !peers.is_empty() {
        // As the crate's run_server does: a peer that cannot be reached
        // leaves the state empty, which the tests' comparison then shows.
        match recovery::recover_from_peers(&peers, registry).await {
            Ok(true) => {}
            Ok(false) => eprintln!("no reachable peer among {peers:?}; starting empty"),
            Err(error) => eprintln!("peer recovery failed: {error:#}; starting empty"),
        }
        for peer in &peers {
            registry.register_peer(peer.clone());
        }
    }
    registry.signal_ready();

    let listener = TcpListener::bind(("127.0.0.1", args.port)).await?;
    let port = listener.local_addr()?.port();
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{port}")?;
    stdout.flush()?;
    drop(stdout);

    axum::serve(listener, server::create_router(state)).await?;
    Ok(())
}
