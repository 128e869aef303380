//! `kvwasm check` end to end: the shipped backends (native C, and the
//! WebAssembly guests behind the shim, the remote ones against real Redis
//! and S3 servers) pass; each deliberately broken backend in
//! tests/broken-backends fails exactly the check it breaks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The native libraries, built once per test process with their Makefiles.
fn native_libs() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        for makefile_dir in ["examples/native-backend", "tests/broken-backends"] {
            let status = Command::new("make")
                .arg("-s")
                .arg("-C")
                .arg(repo().join(makefile_dir))
                .arg(format!("OUT={}", dir.path().display()))
                .status()
                .expect("run make (scripts/setup.sh installs it)");
            assert!(status.success(), "building {makefile_dir} failed");
        }
        dir
    })
    .path()
}

/// A finished run: exit status and the parsed `--json` report.
struct Run {
    ok: bool,
    json: serde_json::Value,
}

impl Run {
    fn with(&self, verdict: &str) -> BTreeSet<String> {
        self.json["report"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["verdict"] == verdict)
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn detail(&self, check: &str) -> String {
        self.json["report"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == check)
            .map(|r| r["detail"].as_str().unwrap().to_owned())
            .unwrap_or_default()
    }
}

fn check(args: &[&str]) -> Run {
    check_with_env(args, &[])
}

/// `kvwasm check` with extra environment variables (credentials).
fn check_with_env(args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = Command::new(KVWASM)
        .arg("check")
        .arg("--json")
        .args(args)
        .env_remove("KVWASM_CONFIG")
        .envs(env.iter().copied())
        .output()
        .expect("run kvwasm check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "kvwasm check {args:?}: no JSON report ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Run {
        ok: out.status.success(),
        json,
    }
}

fn native(scheme: &str) -> Run {
    let data = tempfile::tempdir().unwrap();
    let lib = native_libs().join(format!("libkv_store_{scheme}.so"));
    check(&[
        "--lib",
        lib.to_str().unwrap(),
        "--uri",
        &format!("{scheme}://{}", data.path().display()),
    ])
}

fn component(component: &str) -> Run {
    let shim = kvwasm_tests::shim_path();
    check(&["--lib", shim.to_str().unwrap(), "--component", component])
}

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_native_c_backend_passes_everything() {
    let run = native("cfs");
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
    // Namespaces are the component contract's: a native URI has none.
    assert_eq!(run.with("skip"), set(NAMESPACE_CHECKS));
    assert!(run.ok);
    assert_eq!(
        run.with("pass").len(),
        kvwasm_conformance::CHECKS.len() - NAMESPACE_CHECKS.len()
    );
}

/// The checks of `wit/kv-store.wit`'s namespace rule.
const NAMESPACE_CHECKS: &[&str] = &[
    "namespace-separate",
    "namespace-look-alikes",
    "namespace-overwrite",
    "empty-namespace",
];

#[test]
fn the_shim_with_the_fs_guest_passes_everything() {
    let run = component("builtin:fs");
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
    assert!(run.ok);
}

#[test]
fn the_shim_with_the_memory_guest_passes_and_is_not_durable() {
    let run = component("builtin:memory");
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    // Honest about what it is: nothing survives the last handle's close.
    assert_eq!(run.with("warn"), set(&["durable-across-reopen"]));
    assert!(run.ok, "a SHOULD warning does not fail the run");
}

/// A config file holding one backend entry, `text`.
fn config_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvwasm.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// `kvwasm check` of `component` under the backend entry `entry` (written
/// to a config file), with `env` set: every check passes, none warns.
fn assert_passes_everything(component: &str, entry: &str, env: &[(&str, &str)]) {
    let run = check_config(component, entry, env, &[]);
    assert_eq!(run.with("pass").len(), kvwasm_conformance::CHECKS.len());
}

/// `kvwasm check --quick`, as [`assert_passes_everything`]: for the TLS
/// runs, which repeat the full runs' checks over another transport.
fn assert_passes_quick(component: &str, entry: &str, env: &[(&str, &str)]) {
    let run = check_config(component, entry, env, &["--quick"]);
    assert!(run.with("pass").len() > 10, "{:#}", run.json);
}

/// `kvwasm check` of `component` under the backend entry `entry`, with
/// `extra` arguments: no check fails or warns.
fn check_config(component: &str, entry: &str, env: &[(&str, &str)], extra: &[&str]) -> Run {
    let (_dir, config) = config_file(entry);
    let shim = kvwasm_tests::shim_path();
    let args = [
        "--lib",
        shim.to_str().unwrap(),
        "--component",
        component,
        "--config",
        config.to_str().unwrap(),
    ];
    let run = check_with_env(&[&args[..], extra].concat(), env);
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
    assert!(run.ok);
    run
}

#[test]
fn the_redis_guest_passes_everything_against_a_real_redis_server() {
    // A conformance verdict, not a deadline test: the server syncs its AOF
    // on every write, and on a loaded machine one fsync took over the
    // default 5 s reply deadline (a CI run with both cores busy).
    let server = kvwasm_tests::servers::RedisServer::start();
    let entry = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n\
         env = [\"REDIS_PASSWORD\"]\ncall_timeout_ms = 60000\n\
         settings = {{ address = \"{0}\", timeout_ms = 30000 }}\n",
        server.addr
    );
    let password = server.password.as_deref().unwrap();
    assert_passes_everything("builtin:redis", &entry, &[("REDIS_PASSWORD", password)]);
}

/// Cluster mode: three masters with a replica each, a password, chunks
/// and manifests routed by slot, writes confirmed on a replica before a
/// manifest is published (`wait_replicas = 1`).
#[test]
fn the_redis_guest_passes_everything_against_a_real_redis_cluster() {
    let cluster = kvwasm_tests::servers::RedisCluster::start(3, Some("cluster-pw-42".into()));
    let list = |nodes: &[std::net::SocketAddr]| {
        nodes
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let entry = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [{}]\n\
         env = [\"REDIS_PASSWORD\"]\ncall_timeout_ms = 120000\n\
         settings = {{ mode = \"cluster\", addresses = [{}], timeout_ms = 30000, \
         wait_replicas = 1, wait_timeout_ms = 30000 }}\n",
        list(&cluster.nodes),
        list(&cluster.nodes[..2])
    );
    assert_passes_everything(
        "builtin:redis",
        &entry,
        &[("REDIS_PASSWORD", "cluster-pw-42")],
    );
    let masters = cluster.masters().expect("the nodes agree");
    assert!(
        masters.iter().all(|&m| {
            let stats = cluster.cli(m, &["INFO", "commandstats"]);
            stats.contains("cmdstat_set:") && stats.contains("cmdstat_wait:")
        }),
        "every master took writes and confirmed them"
    );
}

/// The same over TLS: nodes that speak only TLS, to clients and to each
/// other, with the operator's CA in the backend's `tls` grant, a password,
/// and `wait_replicas = 1`. Every check passes through the shim, and every
/// master took the writes (through the TLS ports the cluster announces)
/// and confirmed them.
#[test]
fn the_redis_guest_passes_everything_against_a_real_redis_cluster_over_tls() {
    let pki = kvwasm_tests::tls::Pki::new();
    let cluster =
        kvwasm_tests::servers::RedisCluster::start_tls(3, &pki, Some("cluster-pw-42".into()), None);
    let list = |nodes: &[std::net::SocketAddr]| {
        nodes
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let entry = format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [{}]\n\
         env = [\"REDIS_PASSWORD\"]\ncall_timeout_ms = 120000\n\
         settings = {{ mode = \"cluster\", addresses = [{}], timeout_ms = 30000, \
         wait_replicas = 1, wait_timeout_ms = 30000 }}\n\
         tls = {{ ca_file = \"{}\" }}\n",
        list(&cluster.nodes),
        list(&cluster.nodes[..2]),
        pki.ca.display()
    );
    assert_passes_everything(
        "builtin:redis",
        &entry,
        &[("REDIS_PASSWORD", "cluster-pw-42")],
    );
    let masters = cluster.masters().expect("the nodes agree");
    assert_eq!(masters.len(), 3);
    assert!(
        masters.iter().all(|&m| {
            let stats = cluster.cli(m, &["INFO", "commandstats"]);
            stats.contains("cmdstat_set:") && stats.contains("cmdstat_wait:")
        }),
        "every master took writes and confirmed them"
    );
}

#[test]
fn the_s3_guest_passes_everything_against_a_real_s3_server() {
    let server = kvwasm_tests::servers::S3Server::start();
    // Generous timeouts, as over https below: `s3s-fs` shares two cores
    // with the rest of the suite, and one of its answers once took over
    // the 5 s default in CI. The checks are about the contract, not speed.
    let entry = format!(
        "[backends.s3]\ncomponent = \"builtin:s3\"\nhttp = [\"{0}\"]\n\
         env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n\
         call_timeout_ms = 60000\n\
         settings = {{ endpoint = \"{0}\", bucket = \"{1}\", timeout_ms = 30000 }}\n",
        server.endpoint, server.bucket
    );
    let credentials = [
        ("AWS_ACCESS_KEY_ID", server.access_key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", server.secret_key.as_str()),
    ];
    assert_passes_everything("builtin:s3", &entry, &credentials);
}

/// The backend entry of `builtin:redis` at `server` over TLS, trusting
/// `ca` only, with `settings` added.
fn redis_tls_entry(
    server: &kvwasm_tests::servers::RedisServer,
    ca: &Path,
    settings: &str,
) -> String {
    format!(
        "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n\
         env = [\"REDIS_PASSWORD\"]\nsettings = {{ address = \"{0}\", timeout_ms = 30000{settings} }}\n\
         tls = {{ ca_file = \"{1}\" }}\n",
        server.addr,
        ca.display()
    )
}

#[test]
fn the_redis_guest_passes_the_quick_checks_over_tls_with_a_password_and_an_acl_user() {
    let pki = kvwasm_tests::tls::Pki::new();
    let server = kvwasm_tests::servers::RedisServer::start_tls(&pki, &pki.server, true, false);
    // The server has no plain-text listener: every connection below is TLS.
    assert_eq!(
        server.cli(&["CONFIG", "GET", "port"]).lines().nth(1),
        Some("0")
    );
    let password = server.password.as_deref().unwrap();
    let entry = redis_tls_entry(&server, &pki.ca, "");
    assert_passes_quick("builtin:redis", &entry, &[("REDIS_PASSWORD", password)]);

    let acl = server.cli(&[
        "ACL",
        "SETUSER",
        "kvcache",
        "on",
        ">user-secret",
        "~*",
        "+@all",
    ]);
    assert_eq!(acl.trim(), "OK");
    let before = server.info_stat("total_connections_received");
    let entry = redis_tls_entry(&server, &pki.ca, ", user = \"kvcache\"");
    assert_passes_quick(
        "builtin:redis",
        &entry,
        &[("REDIS_PASSWORD", "user-secret")],
    );
    // `user-secret` is the ACL user's password only (the default user's is
    // random), so the run authenticated as `kvcache`, over TLS.
    assert!(server.info_stat("total_connections_received") > before + 1);
}

#[test]
fn the_s3_guest_passes_the_quick_checks_over_https_with_the_operators_ca_and_fails_without_it() {
    let pki = kvwasm_tests::tls::Pki::new();
    let server = kvwasm_tests::servers::S3Server::start();
    let target = server
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .unwrap();
    let proxy = kvwasm_tests::servers::TlsProxy::start(&pki.server, target);
    let endpoint = format!("https://localhost:{}", proxy.addr.port());
    let entry = |tls: &str| {
        format!(
            "[backends.s3]\ncomponent = \"builtin:s3\"\nhttp = [\"{endpoint}\"]\n\
             env = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n\
             call_timeout_ms = 60000\n\
             settings = {{ endpoint = \"{endpoint}\", bucket = \"{}\", timeout_ms = 30000 }}\n{tls}",
            server.bucket
        )
    };
    let credentials = [
        ("AWS_ACCESS_KEY_ID", server.access_key.as_str()),
        ("AWS_SECRET_ACCESS_KEY", server.secret_key.as_str()),
    ];
    let with_ca = entry(&format!("tls = {{ ca_file = \"{}\" }}\n", pki.ca.display()));
    assert_passes_quick("builtin:s3", &with_ca, &credentials);
    // Connections are kept alive and reused (the grant's pooled client):
    // the checks send thousands of requests over a few dozen connections,
    // where a connection per request made thousands.
    let connections = proxy.connections();
    eprintln!("https connections through the proxy: {connections}");
    assert!((1..200).contains(&connections), "{connections} connections");

    // The public roots alone do not trust the private CA: nothing passes
    // that needs the store.
    let (_dir, config) = config_file(&entry(""));
    let shim = kvwasm_tests::shim_path();
    let args = [
        "--lib",
        shim.to_str().unwrap(),
        "--component",
        "builtin:s3",
        "--config",
        config.to_str().unwrap(),
        "--only",
        "round-trip-sizes",
    ];
    let run = check_with_env(&args, &credentials);
    assert_eq!(
        run.with("fail"),
        set(&["round-trip-sizes"]),
        "{:#}",
        run.json
    );
    assert!(!run.ok);
}

/// `kvwasm check` of the tiered store `kv` (fs hot tier of `hot_mib` over
/// an S3 cold tier on a real server), `knobs` added to its entry: every
/// check passes, none warns. Returns the chunk objects S3 holds after.
fn assert_tiered_passes_everything(hot_mib: u64, knobs: &str) -> usize {
    let server = kvwasm_tests::servers::S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let (cold, credentials) = kvwasm_tests::tiered::s3_cold(&server);
    let config = kvwasm_tests::tiered::config(dir.path(), hot_mib, &cold, knobs);
    let shim = kvwasm_tests::shim_path();
    let args = [
        "--lib",
        shim.to_str().unwrap(),
        "--uri",
        "wasm://kv/kvwasm-check",
    ];
    let mut env: Vec<(&str, &str)> = credentials.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.push(("KVWASM_CONFIG", config.to_str().unwrap()));
    let run = check_with_env(&args, &env);
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
    assert_eq!(run.with("pass").len(), kvwasm_conformance::CHECKS.len());
    assert!(run.ok);
    kvwasm_tests::tiered::chunk_files(&server.bucket_dir())
}

/// A 1 MiB hot tier: the checks' puts overflow it all the time, so puts
/// demote (and chunks larger than it go straight to S3).
#[test]
fn a_tiered_store_of_fs_over_s3_passes_everything() {
    let in_s3 = assert_tiered_passes_everything(1, "");
    assert!(in_s3 > 0, "nothing reached the cold tier");
}

/// A hot tier large enough for every chunk the checks put, emptied by the
/// background demoter every millisecond of the run: every chunk moves to
/// S3 while the checks read it. Without the demoter no chunk would reach
/// S3 at all (puts land in the hot tier; the last tier keeps manifests).
#[test]
fn a_tiered_store_passes_everything_while_the_hot_tier_is_demoted_during_the_run() {
    let knobs = "low_water_pct = 0\ndemote_interval_ms = 1\n";
    assert!(assert_tiered_passes_everything(4096, knobs) > 0);
    assert_eq!(
        assert_tiered_passes_everything(4096, "demote_interval_ms = 1\n"),
        0,
        "without demotion below capacity, chunks stay hot"
    );
}

#[test]
fn the_vendor_starter_component_passes_everything() {
    let run = component(kvwasm_guest_artifacts::VENDOR_STARTER_PATH);
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
}

/// The vendor starter with its namespace ignored: every namespace check
/// fails, quoting its rule and naming the namespace whose bytes leaked;
/// every other check passes.
#[test]
fn a_namespace_blind_component_fails_the_namespace_checks_quoting_the_rule() {
    let blind = kvwasm_guest_artifacts::NAMESPACE_BLIND_PATH;
    let run = component(blind);
    assert_eq!(run.with("fail"), set(NAMESPACE_CHECKS), "{:#}", run.json);
    assert_eq!(run.with("warn"), none(), "{:#}", run.json);
    assert!(!run.ok);
    let detail = run.detail("namespace-separate");
    assert!(
        detail.contains("returned 1 (already present), but only other namespaces"),
        "{detail}"
    );

    let shim = kvwasm_tests::shim_path();
    let out = Command::new(KVWASM)
        .args(["check", "--quick", "--lib", shim.to_str().unwrap()])
        .args(["--component", blind, "--only", "namespace-separate"])
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let table = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        table.contains("FAIL MUST")
            && table.contains("rule: Namespaces are separate stores: the same hash or manifest name in two namespaces holds two values"),
        "{table}"
    );
}

#[test]
fn each_broken_backend_fails_exactly_the_rule_it_breaks() {
    for (scheme, broken) in [
        ("dupzero", "put-chunk-idempotent"),
        ("tornmanifest", "manifest-atomicity"),
        ("arenaalloc", "malloc-outputs"),
        ("racy", "thread-safety"),
    ] {
        let run = native(scheme);
        assert_eq!(run.with("fail"), set(&[broken]), "{scheme}: {:#}", run.json);
        assert_eq!(run.with("warn"), none(), "{scheme}: {:#}", run.json);
        assert!(!run.ok, "{scheme}: a failed MUST fails the run");
    }
}

#[test]
fn a_backend_that_ignores_bad_prefetch_arguments_passes_with_a_warning() {
    let run = native("lenientprefetch");
    assert_eq!(run.with("fail"), none(), "{:#}", run.json);
    assert_eq!(run.with("warn"), set(&["prefetch-bad-arguments"]));
    let detail = run.detail("prefetch-bad-arguments");
    assert!(
        detail.contains("hashes NULL, n 3) → 0") && detail.contains("hash_len 0, n 3) → 0"),
        "{detail}"
    );
    assert!(run.ok, "a SHOULD warning does not fail the run");
}

#[test]
fn a_crash_is_reported_as_the_failure_of_its_check() {
    let run = native("arenaalloc");
    let detail = run.detail("malloc-outputs");
    assert!(detail.contains("crashed the process"), "{detail}");
    // The checks after it still ran, leaking outputs instead of crashing.
    assert!(run.with("pass").contains("round-trip-sizes"));
}

#[test]
fn only_skip_and_quick_select_checks() {
    let data = tempfile::tempdir().unwrap();
    let lib = native_libs().join("libkv_store_cfs.so");
    let uri = format!("cfs://{}", data.path().display());
    let base = ["--lib", lib.to_str().unwrap(), "--uri", &uri];
    let only = check(&[&base[..], &["--only", "vtable,missing-chunk"]].concat());
    assert_eq!(only.with("pass"), set(&["vtable", "missing-chunk"]));

    let quick = check(&[&base[..], &["--quick", "--skip", "thread-safety"]].concat());
    let ran = quick.with("pass");
    assert!(!ran.contains("thread-safety") && !ran.contains("close-releases"));
    assert!(ran.contains("manifest-atomicity"));

    let out = Command::new(KVWASM)
        .args(["check", "--only", "no-such-check"])
        .args(base)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no check named \"no-such-check\""));
}

#[test]
fn a_config_supplies_grants_with_paths_relative_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(
        &config,
        "[backends.vendor]\ncomponent = \"builtin:memory\"\ndir = \"granted\"\n",
    )
    .unwrap();
    let shim = kvwasm_tests::shim_path();
    let run = check(&[
        "--lib",
        shim.to_str().unwrap(),
        "--component",
        "builtin:fs",
        "--config",
        config.to_str().unwrap(),
        "--only",
        "visibility",
    ]);
    assert_eq!(run.with("pass"), set(&["visibility"]), "{:#}", run.json);
    // The fs guest (not the config's memory backend) wrote into the
    // config's relative directory under the default namespace.
    let written = dir.path().join("granted/kvwasm-check/chunks");
    assert!(written.is_dir(), "{} missing", written.display());
}

#[test]
fn a_projects_config_file_is_checked_as_the_component_it_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(
        &config,
        "[backends.vendor]\ncomponent = \"builtin:fs\"\ndir = \"granted\"\n",
    )
    .unwrap();
    let shim = kvwasm_tests::shim_path();
    let run = check(&[
        "--lib",
        shim.to_str().unwrap(),
        "--component",
        config.to_str().unwrap(),
        "--only",
        "visibility",
    ]);
    assert_eq!(run.with("pass"), set(&["visibility"]), "{:#}", run.json);
    assert_eq!(run.json["report"]["uri"], "wasm://vendor/kvwasm-check");
    let written = dir.path().join("granted/kvwasm-check/chunks");
    assert!(written.is_dir(), "{} missing", written.display());
}

#[test]
fn a_file_that_is_not_webassembly_is_refused_before_any_check_runs() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("build.wasm");
    std::fs::write(&script, "#!/bin/sh\necho not a component\n").unwrap();
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, "").unwrap();
    for file in [&script, &empty] {
        assert_refused_up_front(file, "is not a WebAssembly component");
    }
}

/// `kvwasm check --component FILE` fails before any check runs, saying
/// `why` on stderr.
fn assert_refused_up_front(file: &Path, why: &str) {
    let out = Command::new(KVWASM)
        .args(["check", "--json", "--component", file.to_str().unwrap()])
        .args(["--lib", kvwasm_tests::shim_path().to_str().unwrap()])
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}: {stderr}", file.display());
    assert!(out.stdout.is_empty(), "no report: no check ran");
    assert!(stderr.contains(why), "{}: {stderr}", file.display());
}

#[test]
fn backend_picks_one_entry_of_a_projects_config_file_with_several() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(
        &config,
        "[backends.scratch]\ncomponent = \"builtin:memory\"\n\n\
         [backends.vendor]\ncomponent = \"builtin:fs\"\ndir = \"granted\"\n",
    )
    .unwrap();
    let shim = kvwasm_tests::shim_path();
    let run = check(&[
        "--lib",
        shim.to_str().unwrap(),
        "--component",
        config.to_str().unwrap(),
        "--backend",
        "vendor",
        "--only",
        "visibility",
    ]);
    assert_eq!(run.with("pass"), set(&["visibility"]), "{:#}", run.json);
    assert_eq!(run.json["report"]["uri"], "wasm://vendor/kvwasm-check");
    assert!(dir.path().join("granted/kvwasm-check/chunks").is_dir());
}

#[test]
fn backend_without_a_config_file_is_refused_rather_than_ignored() {
    let out = Command::new(KVWASM)
        .args([
            "check",
            "--json",
            "--component",
            "builtin:fs",
            "--backend",
            "x",
        ])
        .args(["--lib", kvwasm_tests::shim_path().to_str().unwrap()])
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no report: no check ran");
    assert!(stderr.contains("--backend picks an entry"), "{stderr}");
}

#[test]
fn a_config_naming_a_file_that_is_not_webassembly_is_refused_before_any_check_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lib.rs"), "fn main() {}\n").unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(&config, "[backends.vendor]\ncomponent = \"lib.rs\"\n").unwrap();
    assert_refused_up_front(&config, "lib.rs is not a WebAssembly component");
}
