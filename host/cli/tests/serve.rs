//! `kvwasm serve` as operators run it: two replica processes with the
//! builtin KV indexer, one restarted and rebuilt from the other's `/dump`;
//! fed by real publishers (`tests/scripts/kv_publisher.py` in the vLLM and
//! SGLang shapes, registered through `/register`, each with a forced gap)
//! and by a real `nats-server` killed and restarted mid-stream.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kvwasm_tests::servers::{KvPublisher, NatsServer};
use serde_json::{Value, json};

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");
/// The longest any one wait in these tests may take.
const PATIENCE: Duration = Duration::from_secs(15);

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
        "pending_events",
        "max_response_mib",
        "held_response_mib",
        "max_connections",
        "client_timeout_ms",
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

/// Dynamo's local hash of one block (interop-facts §4), computed here, not
/// by the indexer core: xxh3-64 of the tokens as LE u32, seed 1337.
fn local_hash(tokens: &[u32]) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, 1337)
}

/// Call `answer` until it returns `expected` (events reach the indexer
/// asynchronously); panics with the last answer after [`PATIENCE`].
fn eventually(expected: &Value, mut answer: impl FnMut() -> Value) {
    let started = Instant::now();
    loop {
        let mut got = answer();
        // Dynamo 1.6.1's `instances` summary (checked against Dynamo's own
        // indexer in indexer_parity.rs) when the expectation leaves it out.
        if expected.get("instances").is_none()
            && let Some(fields) = got.as_object_mut()
        {
            fields.remove("instances");
        }
        if got == *expected {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "after {PATIENCE:?}:\n{got}\nexpected\n{expected}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One kv_publisher.py run (see its docstring) registered as `instance`.
struct Run {
    instance: u64,
    /// The rank its events carry (vllm-map batches say 1, the others
    /// none: the registered 0).
    rank: u32,
    shape: &'static str,
    hashes: &'static str,
    batches: u64,
    /// Batches published only through the replay (a forced gap).
    dropped: &'static [u64],
    remove_from: u64,
    reply_topic: bool,
}

/// kv_publisher.py's block size.
const PUBLISHED_BLOCK: usize = 4;

impl Run {
    fn start(&self) -> KvPublisher {
        let (batches, remove_from) = (self.batches.to_string(), self.remove_from.to_string());
        let drop: Vec<String> = self.dropped.iter().map(u64::to_string).collect();
        let drop = drop.join(",");
        let mut args = vec![
            "--shape",
            self.shape,
            "--hashes",
            self.hashes,
            "--batches",
            &batches,
            "--drop",
            &drop,
            "--remove-from",
            &remove_from,
            "--no-clear",
            "--serve-for",
            "20",
        ];
        if self.reply_topic {
            args.push("--reply-topic");
        }
        KvPublisher::start(&args)
    }

    /// The blocks the worker ends up holding, by index i (tokens 4i..4i+4,
    /// each after block i-1): batch k stores 2k and 2k+1, and an odd k
    /// from `remove_from` on removes 2k-2.
    fn held(&self) -> BTreeSet<usize> {
        let mut held = BTreeSet::new();
        for k in 0..self.batches as usize {
            held.extend([2 * k, 2 * k + 1]);
            if k % 2 == 1 && k as u64 >= self.remove_from {
                held.remove(&(2 * k - 2));
            }
        }
        held
    }

    /// Blocks of `query` matched: the leading full blocks whose local hash
    /// is that of the block the worker holds at the same depth.
    fn matched(&self, query: &[u32]) -> usize {
        let held = self.held();
        query
            .chunks_exact(PUBLISHED_BLOCK)
            .enumerate()
            .take_while(|&(i, block)| {
                let stored: Vec<u32> = (4 * i as u32..4 * i as u32 + 4).collect();
                held.contains(&i) && local_hash(block) == local_hash(&stored)
            })
            .count()
    }
}

/// The `/query` answer the runs' workers should give for `query`.
fn expected_scores(runs: &[Run], query: &[u32]) -> Value {
    let mut scores = BTreeMap::new();
    let mut sizes = BTreeMap::new();
    for run in runs {
        let matched = run.matched(query);
        if matched > 0 {
            let id = run.instance.to_string();
            let rank = run.rank.to_string();
            scores.insert(id.clone(), json!({&rank: matched * PUBLISHED_BLOCK}));
            sizes.insert(id, json!({rank: run.held().len()}));
        }
    }
    json!({"scores": scores, "frequencies": [], "tree_sizes": sizes})
}

#[test]
fn vllm_and_sglang_publishers_with_forced_gaps_are_indexed_as_computed() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Replica::start(&config(dir.path(), "pub.toml", ""));
    let runs = [
        // Seqs 3, 4 come only through the replay (vLLM 0.33 replies).
        Run {
            instance: 1,
            rank: 1,
            shape: "vllm-map",
            hashes: "signed",
            batches: 8,
            dropped: &[3, 4],
            remove_from: 5,
            reply_topic: true,
        },
        // The first seq is missing: a gap from 0.
        Run {
            instance: 2,
            rank: 0,
            shape: "vllm-array",
            hashes: "bytes",
            batches: 6,
            dropped: &[0],
            remove_from: 3,
            reply_topic: false,
        },
        Run {
            instance: 3,
            rank: 0,
            shape: "sglang",
            hashes: "int",
            batches: 5,
            dropped: &[2],
            remove_from: 5,
            reply_topic: false,
        },
    ];
    let mut publishers = Vec::new();
    for run in &runs {
        let publisher = run.start();
        let (status, answer) = serve.call(
            "POST",
            "/register",
            &json!({"instance_id": run.instance, "endpoint": publisher.endpoint,
                    "replay_endpoint": publisher.replay_endpoint, "model_name": "m",
                    "block_size": PUBLISHED_BLOCK}),
        );
        assert_eq!(status, 201, "{answer}");
        publishers.push(publisher);
    }
    for (run, publisher) in runs.iter().zip(&mut publishers) {
        assert_eq!(publisher.line(), "published");
        let from = run.dropped[0];
        assert_eq!(
            publisher.line(),
            format!("replayed {from} {}", run.batches - from)
        );
    }
    let query = |tokens: &[u32]| {
        let (status, answer) = serve.call(
            "POST",
            "/query",
            &json!({"token_ids": tokens, "model_name": "m"}),
        );
        assert_eq!(status, 200, "{answer}");
        let mut answer = answer;
        // Dynamo 1.6.1's `instances` summary is checked against Dynamo's
        // own indexer in indexer_parity.rs; `expected_scores` leaves it out.
        if let Some(fields) = answer.as_object_mut() {
            fields.remove("instances");
        }
        answer
    };
    let whole: Vec<u32> = (0..64).collect();
    let expected = expected_scores(&runs, &whole);
    // Workers 1 and 2 stop where their first removal is, 3 holds it all.
    assert_eq!(
        expected["scores"],
        json!({"1": {"1": 32}, "2": {"0": 16}, "3": {"0": 40}})
    );
    eventually(&expected, || query(&whole));
    // Full blocks only; a prompt that diverges matches nothing.
    let partial: Vec<u32> = (0..30).collect();
    assert_eq!(query(&partial), expected_scores(&runs, &partial));
    let other: Vec<u32> = (1..65).collect();
    assert_eq!(query(&other), expected_scores(&runs, &other));
    assert_eq!(expected_scores(&runs, &other)["scores"], json!({}));
}

/// A NATS client on its own runtime (the test itself is synchronous).
struct NatsClient {
    runtime: tokio::runtime::Runtime,
    client: async_nats::Client,
}

impl NatsClient {
    fn connect(server: &NatsServer) -> NatsClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime.block_on(async_nats::connect(server.url())).unwrap();
        NatsClient { runtime, client }
    }

    fn publish(&self, subject: &str, json: Value) {
        self.runtime.block_on(async {
            let payload = json.to_string().into_bytes();
            self.client
                .publish(subject.to_owned(), payload.into())
                .await
                .unwrap();
            self.client.flush().await.unwrap();
        });
    }
}

const ROUTER_SUBJECT: &str = "namespace.dyn.component.backend.kv-events";

/// A RouterEvent storing blocks (engine hash, tokens) of 16 tokens.
fn router_stored(
    worker: u64,
    event_id: u64,
    parent: Option<i64>,
    blocks: &[(i64, &[u32])],
) -> Value {
    let blocks: Vec<Value> = blocks
        .iter()
        .map(|(hash, tokens)| json!({"block_hash": hash, "tokens_hash": local_hash(tokens)}))
        .collect();
    json!({"worker_id": worker, "event": {"event_id": event_id, "dp_rank": 0,
           "data": {"stored": {"parent_hash": parent, "blocks": blocks}}}})
}

#[test]
fn nats_events_published_after_a_server_restart_are_indexed() {
    let mut nats = NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    // Worker 3's registration makes the tree of model m (block size 16);
    // nothing listens on its endpoint.
    let serve = Replica::start(&config(
        dir.path(),
        "nats.toml",
        &format!(
            "[[serve.nats]]\nurl = \"{}\"\nmodel = \"m\"\n\
             [[serve.workers]]\ninstance_id = 3\nendpoint = \"tcp://127.0.0.1:9\"\n\
             model_name = \"m\"\nblock_size = 16\n",
            nats.url()
        ),
    ));
    let by_hash = |hashes: &[i64]| {
        let (status, answer) = serve.call(
            "POST",
            "/query_by_hash",
            &json!({"block_hashes": hashes, "model_name": "m"}),
        );
        assert_eq!(status, 200, "{answer}");
        answer
    };
    let query = |tokens: std::ops::Range<u32>| {
        let tokens: Vec<u32> = tokens.collect();
        let (status, answer) = serve.call(
            "POST",
            "/query",
            &json!({"token_ids": tokens, "model_name": "m"}),
        );
        assert_eq!(status, 200, "{answer}");
        answer
    };
    // The service subscribes in its own time: republish a marker from
    // worker 9 until it is indexed (its block is tokens 1000..1016).
    let marker = |client: &NatsClient, first: u32| {
        let tokens: Vec<u32> = (first..first + 16).collect();
        let started = Instant::now();
        loop {
            client.publish(
                ROUTER_SUBJECT,
                router_stored(9, 0, None, &[(first as i64, &tokens)]),
            );
            std::thread::sleep(Duration::from_millis(100));
            if query(first..first + 16)["scores"]["9"]["0"] == 16 {
                return;
            }
            assert!(started.elapsed() < PATIENCE, "the marker never arrived");
        }
    };
    let tokens: Vec<u32> = (0..48).collect();
    let client = NatsClient::connect(&nats);
    marker(&client, 1000);
    client.publish(
        ROUTER_SUBJECT,
        router_stored(3, 1, None, &[(-11, &tokens[..16]), (12, &tokens[16..32])]),
    );
    client.publish(
        "kvbm.events",
        json!({"events": {"Create": [21]}, "instance_id": 42}),
    );
    eventually(
        &json!({"scores": {"3": {"0": 32}}, "frequencies": [], "tree_sizes": {"3": {"0": 2}}}),
        || query(0..48),
    );
    // KVBM's blocks carry no tokens: found by their hashes, signed.
    eventually(
        &json!({"scores": {"42": {"0": 16}}, "frequencies": [], "tree_sizes": {"42": {"0": 1}}}),
        || by_hash(&[21]),
    );

    // The server goes away mid-stream and comes back on its port; the
    // service reconnects and resubscribes by itself.
    drop(client);
    nats.kill();
    nats.restart();
    let client = NatsClient::connect(&nats);
    marker(&client, 2000);
    client.publish(
        ROUTER_SUBJECT,
        router_stored(3, 2, Some(12), &[(13, &tokens[32..48])]),
    );
    client.publish(
        "namespace.other.component.worker.kv-events",
        json!({"worker_id": 3, "event": {"event_id": 3, "data": {"removed": {"block_hashes": [12]}}}}),
    );
    client.publish(
        "kvbm.events",
        json!({"events": {"Create": [-31]}, "instance_id": 42}),
    );
    // Worker 3's third block arrived, then its second went: the prefix
    // stops at one block, the tree holds two.
    eventually(
        &json!({"scores": {"3": {"0": 16}}, "frequencies": [], "tree_sizes": {"3": {"0": 2}}}),
        || query(0..48),
    );
    eventually(
        &json!({"scores": {"42": {"0": 16}}, "frequencies": [], "tree_sizes": {"42": {"0": 2}}}),
        || by_hash(&[-31]),
    );
    assert_eq!(by_hash(&[21])["tree_sizes"], json!({"42": {"0": 2}}));
}
