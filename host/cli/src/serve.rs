//! `kvwasm serve`: the KV event service (host/serve, docs/events.md).

use std::net::SocketAddr;
use std::path::PathBuf;

/// Feed KV-cache events to subscriber guests and serve the KV indexer's API.
///
/// Sources (ZMQ publishers registered through /register or [[serve.workers]],
/// NATS servers in [[serve.nats]]) deliver normalised events; each guest named
/// by [serve] gets them in batches through its own bounded queue. The guest
/// named by `indexer` answers the indexer API (/register, /unregister, /workers,
/// /query, /query_by_hash, /dump, /restore); the host answers /health,
/// /metrics, /register_peer, /deregister_peer and /peers. A guest instance
/// that traps is replaced and rebuilt from the event log.
#[derive(clap::Args)]
#[command(after_help = SERVE_TABLE)]
pub struct ServeArgs {
    /// Config file with [serve] and the [subscribers.NAME] it names.
    #[arg(long, env = "KVWASM_CONFIG")]
    config: PathBuf,
    /// Listen here instead of [serve].listen.
    #[arg(long)]
    listen: Option<SocketAddr>,
}

const SERVE_TABLE: &str = "\
The [serve] table (unknown keys are errors):
  listen = \"127.0.0.1:8090\"      HTTP listener
  indexer = \"idx\"                the [subscribers.idx] answering the API (exports http-api)
  subscribers = [\"advisor\"]      more [subscribers.NAME] fed the same events
  queue_events = 65536           events queued per guest; a batch that does not fit comes from the log
  batch_events = 1024            events per on-batch call at most
  pending_events = 65536         held for workers not registered yet, in all; past it dropped (counted)
  max_body_mib = 16              larger request bodies are answered 413
  max_response_mib = 256         larger guest answers are answered 503
  held_response_mib = 512        guest answers not yet read by their clients, in all; past it 503
  max_connections = 256          open client connections at most
  client_timeout_ms = 10000      a client reading nothing (or sending no request) is dropped
  log_events = 4000000           replay log size; past it the indexer's /dump becomes its base
  peers = [\"http://10.0.0.2:8090\"]  recovery at startup, and rebuilds of a diverged indexer,
                                 from the first reachable peer's /dump

  [[serve.workers]]              a worker registered at startup, like POST /register
  instance_id = 1
  dp_rank = 0
  endpoint = \"tcp://127.0.0.1:5557\"     optional: none for a worker fed over NATS
  replay_endpoint = \"tcp://127.0.0.1:5558\"   optional
  model_name = \"llama-3-8b\"
  tenant_id = \"default\"
  block_size = 16

  [[serve.nats]]                 a NATS server
  url = \"nats://127.0.0.1:4222\"
  subjects = [\"kvbm.events\"]     default: namespace.*.component.*.kv-events and kvbm.events
  model = \"llama-3-8b\"           optional: attribute its events to this (model, tenant)
  tenant = \"default\"
  block_size = 16                optional, with model: its events need no registration

Example:
  [subscribers.idx]
  component = \"builtin:kv-indexer\"
  [serve]
  indexer = \"idx\"";

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    kvwasm_serve::run(&args.config, args.listen)
}
