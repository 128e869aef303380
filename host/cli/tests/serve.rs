//! `kvwasm serve` as operators run it: two replica processes with the
//! builtin KV indexer, one restarted and rebuilt from the other's `/dump`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");

/// A `kvwasm serve` process, killed on drop.
struct Replica {
    child: Child,
    url: String,
}

impl Replica {
    /// Start on a free port (`--listen` overrides the config's address) and
    /// wait until it listens, which is after any recovery.
    fn start(config: &Path) -> Replica {
        let mut child = Command::new(KVWASM)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(config)
            .env_remove("KVWASM_CONFIG")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Replica { child, url }
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let response = client
            .request(
                reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
                format!("{}{path}", self.url),
            )
            .body(body.to_string())
            .send()
            .unwrap();
        let status = response.status().as_u16();
        let body = response.bytes().unwrap();
        // /health answers an empty body.
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&body).unwrap()
        };
        (status, value)
    }

    /// The answer to a `/query` of tokens 0..64 (four blocks of 16).
    fn query(&self) -> Value {
        let (status, answer) = self.call(
            "POST",
            "/query",
            &json!({"token_ids": (0..64).collect::<Vec<u32>>(), "model_name": "m"}),
        );
        assert_eq!(status, 200, "{answer}");
        answer
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn config(dir: &Path, name: &str, serve: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!(
            "[subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\n\
             [serve]\nindexer = \"idx\"\n\
             # Not this machine's: only --listen makes it start.\n\
             listen = \"192.0.2.1:80\"\n{serve}"
        ),
    )
    .unwrap();
    path
}

/// Local hashes (seed 1337, block size 16) of tokens 0..16 and 16..32
/// (interop-facts §4).
const TOKENS_HASHES: [u64; 2] = [15310707395893867146, 15292316782987903195];

/// A `/dump` document: each worker holds the first `blocks` blocks of
/// tokens 0.. of model m.
fn dump(workers: &[(u64, usize)]) -> Value {
    let events: Vec<Value> = workers
        .iter()
        .map(|&(worker, blocks)| {
            let blocks: Vec<Value> = (0..blocks)
                .map(|b| json!({"block_hash": 100 + b, "tokens_hash": TOKENS_HASHES[b]}))
                .collect();
            json!({"worker_id": worker, "event": {"event_id": 1, "dp_rank": 0,
                   "data": {"stored": {"parent_hash": null, "blocks": blocks}}}})
        })
        .collect();
    json!({"m:default": {"block_size": 16, "events": events}})
}

#[test]
fn a_restarted_replica_is_rebuilt_from_its_peers_dump() {
    let dir = tempfile::tempdir().unwrap();
    let a = Replica::start(&config(dir.path(), "a.toml", ""));
    let (status, answer) = a.call("POST", "/restore", &dump(&[(1, 2)]));
    assert_eq!(status, 200, "{answer}");
    let first = a.query();
    assert_eq!(first["scores"], json!({"1": {"0": 32}}), "{first}");

    let b_config = config(
        dir.path(),
        "b.toml",
        &format!(
            "peers = [\"http://127.0.0.1:9\", {:?}]\n\
             [[serve.workers]]\ninstance_id = 7\nendpoint = \"tcp://127.0.0.1:9\"\n\
             model_name = \"m\"\nblock_size = 16\n",
            a.url
        ),
    );
    let b = Replica::start(&b_config);
    assert_eq!(b.query(), first);
    let (_, workers) = b.call("GET", "/workers", &json!(null));
    assert_eq!(workers[0]["instance_id"], 7, "{workers}");

    // While B is down A's state moves on; the new B starts from it.
    drop(b);
    let (status, _) = a.call("POST", "/restore", &dump(&[(1, 2), (2, 1)]));
    assert_eq!(status, 200);
    let second = a.query();
    assert_eq!(
        second["scores"],
        json!({"1": {"0": 32}, "2": {"0": 16}}),
        "{second}"
    );
    let b = Replica::start(&b_config);
    assert_eq!(b.query(), second);
    assert_eq!(
        b.call("GET", "/dump", &json!(null)),
        a.call("GET", "/dump", &json!(null))
    );
    assert_eq!(b.call("GET", "/health", &json!(null)), (200, Value::Null));
}

#[test]
fn serve_help_documents_the_table_and_bad_tables_are_refused() {
    let out = Command::new(KVWASM)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for key in [
        "listen",
        "indexer",
        "subscribers",
        "queue_events",
        "batch_events",
        "max_body_mib",
        "log_events",
        "peers",
        "[[serve.workers]]",
        "replay_endpoint",
        "[[serve.nats]]",
    ] {
        assert!(help.contains(key), "{key} missing:\n{help}");
    }
    let dir = tempfile::tempdir().unwrap();
    for (serve, expected) in [
        ("queue_event = 5\n", "unknown field `queue_event`"),
        ("", ""),
    ] {
        let path = config(dir.path(), "bad.toml", serve);
        let out = Command::new(KVWASM)
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        if expected.is_empty() {
            // Without --listen the config's unreachable address is used.
            assert!(text.contains("cannot listen on 192.0.2.1:80"), "{text}");
        } else {
            assert!(text.contains(expected), "{text}");
        }
    }
}
