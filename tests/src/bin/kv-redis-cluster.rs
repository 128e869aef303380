//! `kv-redis-cluster COMMAND [ARG...]`: start a Redis Cluster on loopback
//! (three masters with a replica each, as the tests start one:
//! `kvwasm_tests::servers::RedisCluster`), run COMMAND with every argument
//! `{nodes}` replaced by the nodes' comma-separated `host:port`s, then stop
//! the cluster and exit with COMMAND's status. The cluster requires the
//! password in `$KVWASM_BENCH_REDIS_PASSWORD` if it is set.
//! scripts/bench-remote.sh runs `kvwasm bench --remote --redis-cluster
//! {nodes}` under it.

use std::process::{Command, ExitCode};

use kvwasm_tests::servers::RedisCluster;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: kv-redis-cluster COMMAND [ARG...] ({{nodes}}: the cluster's nodes)");
        return ExitCode::from(2);
    };
    let password = std::env::var("KVWASM_BENCH_REDIS_PASSWORD").ok();
    let cluster = RedisCluster::start(3, password);
    let nodes = cluster
        .nodes
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let status = Command::new(&program)
        .args(args.map(|a| a.replace("{nodes}", &nodes)))
        .status();
    drop(cluster);
    match status {
        Ok(status) if status.success() => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("{program}: {status}");
            // Its own exit code; killed by a signal, 128 + the signal, as a shell reports it.
            let code = status.code().or_else(|| {
                std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s)
            });
            ExitCode::from(code.and_then(|c| u8::try_from(c).ok()).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("{program}: {e}");
            ExitCode::FAILURE
        }
    }
}
