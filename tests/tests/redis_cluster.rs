//! `builtin:redis` in cluster mode (`mode = "cluster"`) against a real
//! Redis Cluster on loopback: three masters with a replica each, started
//! by the test (`kvwasm_tests::servers::RedisCluster`). Every wait polls the
//! cluster's state with a generous deadline; no verdict depends on timing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvwasm_host::config::Config;
use kvwasm_host::{Backend, KvError, StoreHandle};
use kvwasm_tests::servers::RedisCluster;
use kvwasm_tests::tls::Pki;
use kvwasm_tests::{Probe, assert_open_refused, pattern, write_config};

const PROBE: &str = env!("CARGO_BIN_EXE_kv-probe");

/// `"a", "b"` for a TOML list of `addrs`.
fn toml_list<'a>(addrs: impl IntoIterator<Item = &'a std::net::SocketAddr>) -> String {
    addrs
        .into_iter()
        .map(|a| format!("\"{a}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The backend `redis` in cluster mode on `cluster` (every node granted,
/// two seeds), with `settings` pairs added, for handles in this process.
fn in_process(dir: &Path, cluster: &RedisCluster, entry: &str, settings: &str) -> Arc<Backend> {
    granted_as(dir, cluster, &toml_list(&cluster.nodes), entry, settings)
}

/// [`in_process`] with `net = [<net>]`.
fn granted_as(
    dir: &Path,
    cluster: &RedisCluster,
    net: &str,
    entry: &str,
    settings: &str,
) -> Arc<Backend> {
    let text = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [{net}]\n\
         call_timeout_ms = 120000\nidle_release_ms = 0\nmax_instances = 1\n{entry}\
         settings = {{ mode = \"cluster\", addresses = [{}], timeout_ms = 20000{settings} }}\n",
        toml_list(&cluster.nodes[..2]),
    );
    let config = Config::parse(&text, dir).unwrap();
    Arc::new(config.backend("redis").unwrap())
}

/// The chunks of save `save`: a few short ones (written through with `SET
/// NX`) and long ones (staged, then written by the manifest's flush).
fn save_chunks(save: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    [1000, 3000, 70_000, 200_000, 5000, 100_000]
        .iter()
        .enumerate()
        .map(|(j, &len)| {
            let seed = save * 16 + j as u64;
            (pattern(12, seed ^ 0x5EED), pattern(len, seed))
        })
        .collect()
}

/// A manifest naming `chunks`: their hashes, in order.
fn manifest(chunks: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    chunks.iter().flat_map(|(h, _)| h.clone()).collect()
}

/// Save `save`: its chunks, then manifest `m<save>`.
fn save(store: &StoreHandle, save: u64) -> Result<(), KvError> {
    let chunks = save_chunks(save);
    for (hash, data) in &chunks {
        store.put_chunk(hash, data)?;
    }
    store.put_manifest(&format!("m{save}"), &manifest(&chunks))
}

/// Restore save `save` and compare every byte; `Ok(false)` if its
/// manifest is not there.
fn restore(store: &StoreHandle, save: u64) -> Result<bool, String> {
    let chunks = save_chunks(save);
    match store.get_manifest(&format!("m{save}")) {
        Ok(bytes) => assert_eq!(bytes.as_slice(), manifest(&chunks), "manifest m{save}"),
        Err(KvError::NotFound) => return Ok(false),
        Err(e) => return Err(format!("get-manifest m{save}: {e:?}")),
    }
    for (hash, data) in &chunks {
        let got = store
            .get_chunk(hash)
            .map_err(|e| format!("m{save} names a chunk that is gone: {e:?}"))?;
        assert!(
            got.as_slice() == data.as_slice(),
            "chunk of m{save} differs"
        );
    }
    Ok(true)
}

#[test]
fn chunks_spread_over_every_master_and_restore_exactly() {
    let cluster = RedisCluster::start(3, None);
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &cluster, "", "");
    let store = StoreHandle::open(backend.clone(), "team/model").unwrap();
    for i in 0..8 {
        save(&store, i).unwrap();
    }
    // No hash tag: the keys of one namespace land on every master.
    let masters = cluster.masters().expect("the nodes agree");
    assert_eq!(masters.len(), 3);
    for &m in &masters {
        assert!(cluster.dbsize(m) > 0, "master {m} holds nothing");
    }
    let total: u64 = masters.iter().map(|&m| cluster.dbsize(m)).sum();
    assert_eq!(total, 8 * 6 + 8, "every chunk and manifest once");
    let reader = StoreHandle::open(backend, "team/model").unwrap();
    for i in 0..8 {
        assert_eq!(restore(&reader, i), Ok(true));
    }
    // Batched prefetch, split per node, then the gets drain it.
    let hashes: Vec<Vec<u8>> = (0..8).flat_map(save_chunks).map(|(h, _)| h).collect();
    reader.prefetch_chunks(&hashes).unwrap();
    for i in 0..8 {
        assert_eq!(restore(&reader, i), Ok(true));
    }
}

/// An operator grants a cluster as an address range (`<cidr>:<ports>`)
/// instead of listing its nodes.
#[test]
fn a_cluster_granted_as_an_address_range_is_reached_on_every_master() {
    let cluster = RedisCluster::start(3, None);
    let ports = cluster.nodes.iter().map(|a| a.port());
    let (low, high) = (ports.clone().min().unwrap(), ports.max().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let net = format!("\"127.0.0.0/8:{low}-{high}\"");
    let backend = granted_as(dir.path(), &cluster, &net, "", "");
    let store = StoreHandle::open(backend, "ns").unwrap();
    for i in 0..8 {
        save(&store, i).unwrap();
    }
    for i in 0..8 {
        assert_eq!(restore(&store, i), Ok(true));
    }
    for m in cluster.masters().expect("the nodes agree") {
        assert!(cluster.dbsize(m) > 0, "master {m} holds nothing");
    }
}

#[test]
fn a_resharding_during_saves_and_restores_loses_no_byte() {
    saves_and_restores_through_a_resharding("");
}

/// As above with the short chunks written behind (`SET NX` pipelined as
/// they are put): a write the resharding redirects (`MOVED`, `ASK`) is
/// handed back and written by the manifest's flush, which follows the
/// redirection.
#[test]
fn in_write_mode_a_resharding_during_saves_and_restores_loses_no_byte() {
    saves_and_restores_through_a_resharding(", dedup_check = \"write\"");
}

/// Saves and restores on one stale handle, before, during and after a
/// resharding of 3,000 slots, every byte compared; `settings` pairs are
/// added to the backend's.
fn saves_and_restores_through_a_resharding(settings: &str) {
    let cluster = RedisCluster::start(3, None);
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(dir.path(), &cluster, "", settings);
    // One instance, kept (idle_release_ms = 0): its slot map predates the
    // resharding, so it must follow the cluster's redirections.
    let store = StoreHandle::open(backend, "ns").unwrap();
    for i in 0..16 {
        save(&store, i).unwrap();
    }
    let masters = cluster.masters().expect("the nodes agree");
    let (from, to) = (masters[0], masters[1]);
    let owner_before: BTreeMap<u64, Vec<Option<usize>>> =
        (0..16).map(|i| (i, chunk_owners(&cluster, i))).collect();

    let mut reshard = cluster.reshard(from, to, 3000);
    let mut next = 16;
    let mut rounds_during = 0;
    let resharded = loop {
        if let Some(out) = reshard.try_finish() {
            break out;
        }
        save(&store, next).unwrap();
        for i in [next, next / 2, 0] {
            assert_eq!(restore(&store, i), Ok(true), "save {i}");
        }
        next += 1;
        rounds_during += 1;
    };
    assert!(
        resharded.status.success(),
        "redis-cli --cluster reshard failed: {}",
        String::from_utf8_lossy(&resharded.stderr)
    );
    eprintln!("{rounds_during} save/restore rounds ran during the resharding");

    // Some chunks of the first saves changed master; every save restores
    // through the same (stale) handle, byte for byte.
    let moved = (0..16)
        .flat_map(|i| owner_before[&i].iter().zip(chunk_owners(&cluster, i)))
        .filter(|(before, after)| **before != *after)
        .count();
    assert!(moved > 0, "the resharding moved none of the saved chunks");
    save(&store, next).unwrap();
    for i in 0..=next {
        assert_eq!(restore(&store, i), Ok(true), "save {i}");
    }
}

/// The master serving each chunk of save `save`, now.
fn chunk_owners(cluster: &RedisCluster, save: u64) -> Vec<Option<usize>> {
    let asked = cluster.masters().expect("the nodes agree")[0];
    save_chunks(save)
        .iter()
        .map(|(hash, _)| {
            let key = format!("kvwasm/ns/chunks/{}", hex(hash));
            cluster.owner(asked, cluster.keyslot(&key))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a save loop through failovers left.
struct Outcome {
    acknowledged: usize,
    /// Acknowledged saves whose manifest is gone.
    lost: usize,
    /// Visible manifests naming a chunk that is gone.
    dangling: usize,
}

/// A save loop on its own thread while each master in turn is killed
/// (`SIGKILL`), its replica promoted, and the killed node restarted (it
/// rejoins as the new master's replica); then every save is restored.
/// `settings` pairs are added to the backend's.
fn saves_through_failovers(wait_replicas: u32, settings: &str) -> Outcome {
    let mut cluster = RedisCluster::start(3, None);
    let dir = tempfile::tempdir().unwrap();
    let backend = in_process(
        dir.path(),
        &cluster,
        "",
        &format!(", wait_replicas = {wait_replicas}, wait_timeout_ms = 20000{settings}"),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let attempted = Arc::new(AtomicUsize::new(0));
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let saver = {
        let (backend, stop) = (backend.clone(), stop.clone());
        let (attempted, acknowledged) = (attempted.clone(), acknowledged.clone());
        std::thread::spawn(move || {
            let mut store = None;
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                attempted.store(i as usize + 1, Ordering::SeqCst);
                let handle = match &store {
                    Some(handle) => handle,
                    None => match StoreHandle::open(backend.clone(), "ns") {
                        Ok(handle) => store.insert(handle),
                        Err(_) => {
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                    },
                };
                // A failed save is not acknowledged (its manifest may be
                // visible or not; if it is, it must restore) and is tried
                // again, as a consumer would: putting its chunks again
                // settles what the handle owes for them.
                match save(handle, i) {
                    Ok(()) => {
                        acknowledged.lock().unwrap().push(i);
                        i += 1;
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        })
    };
    let acked = || acknowledged.lock().unwrap().len();
    let mut killed = Vec::new();
    for _round in 0..3 {
        let base = acked();
        cluster.wait_for("5 saves further", || acked() >= base + 5);
        let masters = cluster.masters().expect("the nodes agree");
        let victim = *masters
            .iter()
            .find(|m| !killed.contains(*m))
            .expect("a master not killed yet");
        cluster.kill(victim);
        killed.push(victim);
        cluster.wait_for("failed over", || {
            cluster
                .masters()
                .is_some_and(|m| m.len() == 3 && !m.contains(&victim))
        });
        cluster.restart(victim);
        cluster.wait_healthy();
        let base = acked();
        cluster.wait_for("5 saves after the failover", || acked() >= base + 5);
    }
    stop.store(true, Ordering::SeqCst);
    saver.join().unwrap();

    let store = StoreHandle::open(backend, "ns").unwrap();
    let acknowledged = acknowledged.lock().unwrap().clone();
    let mut outcome = Outcome {
        acknowledged: acknowledged.len(),
        lost: 0,
        dangling: 0,
    };
    for i in 0..attempted.load(Ordering::SeqCst) as u64 {
        match restore(&store, i) {
            Ok(true) => {}
            Ok(false) => outcome.lost += usize::from(acknowledged.contains(&i)),
            Err(why) => {
                eprintln!("{why}");
                outcome.dangling += 1;
            }
        }
    }
    outcome
}

/// [`saves_through_failovers`] with `wait_replicas = 1` and `settings`:
/// nothing acknowledged is lost, no visible manifest dangles.
fn every_manifest_survives_failovers(label: &str, settings: &str) {
    let outcome = saves_through_failovers(1, settings);
    eprintln!(
        "{label}wait_replicas = 1: {} acknowledged saves, {} lost, {} dangling",
        outcome.acknowledged, outcome.lost, outcome.dangling
    );
    assert!(outcome.acknowledged >= 30);
    assert_eq!(outcome.lost, 0, "an acknowledged save was lost");
    assert_eq!(outcome.dangling, 0, "a visible manifest names a lost chunk");
}

#[test]
fn with_wait_replicas_every_manifest_survives_failovers_of_every_master() {
    every_manifest_survives_failovers("", "");
}

/// As above with the short chunks written behind (plain `SET`s with
/// `wait_replicas`, so each is replicated and a `WAIT` counts it); the
/// `WAIT` is sent once every write behind of its connection is answered,
/// so its reply is not taken for theirs.
#[test]
fn in_write_mode_with_wait_replicas_every_manifest_survives_failovers_of_every_master() {
    every_manifest_survives_failovers("write mode, ", ", dedup_check = \"write\"");
}

/// Without `WAIT` an acknowledged write may be lost with its master; the
/// count is reported, not asserted (it depends on replication lag).
#[test]
fn without_wait_replicas_failovers_may_lose_saves_and_the_count_is_reported() {
    let outcome = saves_through_failovers(0, "");
    eprintln!(
        "wait_replicas = 0: {} acknowledged saves, {} lost, {} dangling",
        outcome.acknowledged, outcome.lost, outcome.dangling
    );
    assert!(outcome.acknowledged >= 30);
}

#[test]
fn an_announced_node_that_is_not_granted_is_refused_logged_and_sent_nothing() {
    let cluster = RedisCluster::start(3, None);
    let masters = cluster.masters().expect("the nodes agree");
    let hidden = masters[2];
    // Hashes whose keys land on the hidden master, and on another one.
    let on = |want_hidden: bool| {
        (0u64..)
            .map(|i| hex(&pattern(8, i)))
            .find(|h| {
                let slot = cluster.keyslot(&format!("kvwasm/ns/chunks/{h}"));
                (cluster.owner(masters[0], slot) == Some(hidden)) == want_hidden
            })
            .unwrap()
    };
    let (hidden_hash, visible_hash) = (on(true), on(false));
    let dir = tempfile::tempdir().unwrap();
    let granted: Vec<_> = (0..cluster.nodes.len())
        .filter(|&n| n != hidden)
        .map(|n| cluster.nodes[n])
        .collect();
    let config = write_config(
        dir.path(),
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [{}]\n\
             [backends.redis.settings]\nmode = \"cluster\"\naddresses = [{}]\n",
            toml_list(&granted),
            toml_list(&granted[..1]),
        ),
    );
    let connections = || cluster.info_stat(hidden, "total_connections_received");
    // Each reading is one redis-cli connection of its own.
    let before = connections();
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns").config(&config).run(&[
        &format!("put-chunk:{visible_hash}=seen"),
        &format!("put-chunk:{hidden_hash}=hidden"),
        &format!("put-chunk:{hidden_hash}=hidden"),
        &format!("get-chunk:{visible_hash}"),
    ]);
    assert_eq!(out[0], "open ok", "{stderr}");
    assert_eq!(out[1], format!("put-chunk {visible_hash}=seen -> 0"));
    for line in &out[2..4] {
        assert!(
            line.starts_with(&format!("put-chunk {hidden_hash}=hidden -> -")),
            "{out:?}"
        );
    }
    assert_eq!(out[4], format!("get-chunk {visible_hash} -> 0 seen"));
    let announced = format!(
        "node {}, announced by the cluster, is not granted in `net`",
        cluster.nodes[hidden]
    );
    assert_eq!(
        stderr.matches(&announced).count(),
        1,
        "logged once: {stderr}"
    );
    assert!(stderr.contains("nothing was sent to it"), "{stderr}");
    assert_eq!(
        connections(),
        before + 1,
        "the hidden node saw a connection"
    );
}

/// The secret variable the TLS cluster tests grant in `env`.
const PASSWORD_VAR: &str = "KVWASM_TEST_REDIS_PASSWORD";

/// A config file for cluster mode on `cluster` (every node granted, two
/// seeds) with the backend's `tls` table `tls` and `settings` pairs added.
fn cluster_config(dir: &Path, cluster: &RedisCluster, tls: &str, settings: &str) -> PathBuf {
    write_config(
        dir,
        &format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [{}]\n\
             env = [\"{PASSWORD_VAR}\"]\ncall_timeout_ms = 120000\n{tls}\n\
             [backends.redis.settings]\nmode = \"cluster\"\naddresses = [{}]\n\
             password_env = \"{PASSWORD_VAR}\"\ntimeout_ms = 20000\n{settings}\n",
            toml_list(&cluster.nodes),
            toml_list(&cluster.nodes[..2]),
        ),
    )
}

/// The operator's CA in the backend's `tls` grant.
fn trusting(ca: &Path) -> String {
    format!("tls = {{ ca_file = \"{}\" }}", ca.display())
}

/// Keys on every node of `cluster`, masters and replicas.
fn keys_on_every_node(cluster: &RedisCluster) -> Vec<u64> {
    (0..cluster.nodes.len())
        .map(|n| cluster.dbsize(n))
        .collect()
}

/// Nodes that speak only TLS, to clients and to each other, with the
/// operator's CA in the `tls` grant: chunks land on every master (through
/// the TLS ports the cluster announces) and restore byte for byte.
#[test]
fn over_tls_chunks_spread_over_every_master_and_restore_exactly() {
    let pki = Pki::new();
    let cluster = RedisCluster::start_tls(3, &pki, None, None);
    let dir = tempfile::tempdir().unwrap();
    let entry = format!("{}\n", trusting(&pki.ca));
    let backend = in_process(dir.path(), &cluster, &entry, "");
    let store = StoreHandle::open(backend.clone(), "team/model").unwrap();
    for i in 0..8 {
        save(&store, i).unwrap();
    }
    let masters = cluster.masters().expect("the nodes agree");
    assert_eq!(masters.len(), 3);
    for &m in &masters {
        assert!(cluster.dbsize(m) > 0, "master {m} holds nothing");
    }
    let total: u64 = masters.iter().map(|&m| cluster.dbsize(m)).sum();
    assert_eq!(total, 8 * 6 + 8, "every chunk and manifest once");
    let reader = StoreHandle::open(backend, "team/model").unwrap();
    let hashes: Vec<Vec<u8>> = (0..8).flat_map(save_chunks).map(|(h, _)| h).collect();
    reader.prefetch_chunks(&hashes).unwrap();
    for i in 0..8 {
        assert_eq!(restore(&reader, i), Ok(true));
    }
}

/// A TLS cluster with an ACL user: the guest authenticates as that user
/// on every master with the password from an `env` secret (the default
/// user's password is another one), through the shim; the wrong password
/// is refused at `open` with the server's reason, and is never logged.
#[test]
fn over_tls_an_acl_user_with_a_password_from_an_env_secret_reaches_every_master() {
    let pki = Pki::new();
    let (user, secret) = ("kvcache", "kvcache-pw-42");
    let cluster =
        RedisCluster::start_tls(3, &pki, Some("default-pw-42".into()), Some((user, secret)));
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(
        dir.path(),
        &cluster,
        &trusting(&pki.ca),
        &format!("user = \"{user}\""),
    );
    let names: Vec<String> = (0..24).map(|i| format!("m{i}")).collect();
    let mut ops: Vec<String> = names
        .iter()
        .map(|n| format!("put-manifest:{n}=v {n}"))
        .collect();
    ops.extend(names.iter().map(|n| format!("get-manifest:{n}")));
    let ops: Vec<&str> = ops.iter().map(String::as_str).collect();
    let (out, stderr) = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, secret)
        .run(&ops);
    let mut expected = vec!["open ok".to_owned()];
    expected.extend(names.iter().map(|n| format!("put-manifest {n}=v {n} -> 0")));
    expected.extend(names.iter().map(|n| format!("get-manifest {n} -> 0 v {n}")));
    assert_eq!(out, expected, "{stderr}");
    assert!(
        !stderr.contains(secret),
        "the password was logged: {stderr}"
    );
    let masters = cluster.masters().expect("the nodes agree");
    for &m in &masters {
        assert!(cluster.dbsize(m) > 0, "master {m} holds nothing");
    }

    // Masters only: a client's write lands on a master, and a replica may
    // still be copying the writes above when its count is read.
    let keys_on_masters = || -> Vec<u64> { masters.iter().map(|&m| cluster.dbsize(m)).collect() };
    let before = keys_on_masters();
    let started = std::time::Instant::now();
    let outcome = Probe::new(PROBE, "wasm://redis/ns")
        .config(&config)
        .env(PASSWORD_VAR, "not-the-password")
        .run(&["put-manifest:refused=x"]);
    assert_open_refused(
        outcome,
        started.elapsed(),
        &["WRONGPASS"],
        "not-the-password",
    );
    assert_eq!(keys_on_masters(), before, "nothing stored");
}

/// A CA that did not sign the nodes' certificates, or plain text to nodes
/// that speak only TLS: `open` fails with the reason logged, and nothing
/// reaches the cluster.
#[test]
fn a_wrong_ca_or_plain_text_to_a_tls_cluster_is_refused_logged_and_stores_nothing() {
    let pki = Pki::new();
    let cluster = RedisCluster::start_tls(3, &pki, None, None);
    let dir = tempfile::tempdir().unwrap();
    let refused = |tls: &str, reasons: &[&str]| {
        let config = cluster_config(dir.path(), &cluster, tls, "");
        let started = std::time::Instant::now();
        let outcome = Probe::new(PROBE, "wasm://redis/ns")
            .config(&config)
            .run(&["put-manifest:refused=x"]);
        assert_open_refused(outcome, started.elapsed(), reasons, "no secret here");
    };
    refused(
        &trusting(&pki.other_ca),
        &["TLS handshake failed", "UnknownIssuer"],
    );
    // Reset or closed, depending on timing: either way the node is named.
    refused("", &["redis at 127.0.0.1"]);
    assert_eq!(
        keys_on_every_node(&cluster),
        vec![0; cluster.nodes.len()],
        "nothing stored"
    );
}

/// Calls of `command` node `node` served (`INFO commandstats`).
fn calls(cluster: &RedisCluster, node: usize, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:calls=");
    cluster
        .cli(node, &["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

/// `dedup_check = "flush"` on the cluster: `put_chunk` asks nothing; the
/// manifest's flush is one existence check and one write of the missing
/// chunks, each split into a pipeline per master and sent to every master
/// before any reply is read, then a `WAIT` on each master written to, the
/// manifest and its `WAIT`: five round trips for the whole save, however
/// many chunks. The same save from a new process writes no chunk again,
/// and a third restores every byte.
#[test]
fn in_flush_mode_a_save_is_one_check_and_one_write_per_master_confirmed_by_wait() {
    let cluster = RedisCluster::start(3, None);
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(
        dir.path(),
        &cluster,
        "",
        "dedup_check = \"flush\"\nwait_replicas = 1\nwait_timeout_ms = 30000",
    );
    let count = 48;
    let puts: Vec<String> = (0..count)
        .map(|i| format!("put-chunk:{i:04x}=chunk {i}"))
        .collect();
    let save: Vec<&str> = puts
        .iter()
        .map(String::as_str)
        .chain(["put-manifest:m=48 chunks"])
        .collect();
    let probe = || Probe::new(PROBE, "wasm://redis/ns").config(&config);
    let (out, stderr) = probe().run(&save);
    assert!(
        out[1..=count].iter().all(|l| l.ends_with("-> 0")),
        "{out:?}"
    );
    assert_eq!(out[count + 1], "put-manifest m=48 chunks -> 0", "{stderr}");
    assert!(
        stderr.contains("48 staged chunks (0 already stored), 5 round trips"),
        "{stderr}"
    );
    let masters = cluster.masters().expect("the nodes agree");
    assert_eq!(masters.len(), 3);
    let total =
        |command: &str| -> u64 { masters.iter().map(|&m| calls(&cluster, m, command)).sum() };
    for &m in &masters {
        for command in ["exists", "set", "wait"] {
            assert!(calls(&cluster, m, command) > 0, "master {m}: no {command}");
        }
    }
    assert_eq!((total("exists"), total("set")), (48, 49));

    let (out, stderr) = probe().run(&save);
    assert_eq!(out[count + 1], "put-manifest m=48 chunks -> 0", "{stderr}");
    assert!(
        stderr.contains("48 staged chunks (48 already stored)"),
        "{stderr}"
    );
    assert_eq!(
        (total("exists"), total("set")),
        (96, 50),
        "only the manifest written again"
    );

    let gets: Vec<String> = (0..count).map(|i| format!("get-chunk:{i:04x}")).collect();
    let restore: Vec<&str> = ["get-manifest:m"]
        .into_iter()
        .chain(gets.iter().map(String::as_str))
        .collect();
    let (out, stderr) = probe().run(&restore);
    let mut expected = vec![
        "open ok".to_owned(),
        "get-manifest m -> 0 48 chunks".to_owned(),
    ];
    expected.extend((0..count).map(|i| format!("get-chunk {i:04x} -> 0 chunk {i}")));
    assert_eq!(out, expected, "{stderr}");
}

/// The harness's commands have deadlines: a `redis-cli` talking to a
/// "node" that accepts connections and never answers (a listener nobody
/// accepts on; the kernel completes the handshake) is killed at its
/// deadline, and the failure names the command. A command that never ends
/// ends this test only through that deadline.
#[test]
fn a_harness_command_past_its_deadline_is_killed_and_named() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port().to_string();
    let mut cmd = std::process::Command::new("redis-cli");
    cmd.args(["-h", "127.0.0.1", "-p", &port, "CLUSTER", "INFO"]);
    let bounded = kvwasm_tests::servers::Bounded::start(
        &mut cmd,
        "redis-cli CLUSTER INFO against a silent node",
        Duration::from_millis(300),
    );
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bounded.finish()))
        .expect_err("the command cannot finish: nothing ever answers it");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.starts_with(
            "redis-cli CLUSTER INFO against a silent node did not finish within 300ms and was killed"
        ),
        "{message}"
    );
    drop(silent);
}
