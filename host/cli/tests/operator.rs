//! The operator's tools: `kvwasm inspect`, `kvwasm check-config` and
//! `kvwasm metrics`.

use std::process::{Command, Output};

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");

fn kvwasm(args: &[&str]) -> (Output, String) {
    let out = Command::new(KVWASM)
        .args(args)
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out, text)
}

#[test]
fn inspect_lists_what_a_component_could_ask_for() {
    let (out, text) = kvwasm(&["inspect", kvwasm_guest_artifacts::HOSTILE_PATH]);
    assert!(out.status.success(), "{text}");
    for expected in [
        "sha256     ",
        "kind       kv-store backend, world kvwasm:kv-store/filesystem-backend",
        "wasi:sockets/tcp@0.2.12",
        "net (tcp peers)",
        "wasi:http/outgoing-handler@0.2.12",
        "http (origins)",
        "wasi:sockets/ip-name-lookup@0.2.12     dns = true",
        "wasi:cli/environment@0.2.12            env (variable names)",
        "exports\n  kvwasm:kv-store/store@0.1.6",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    let (out, text) = kvwasm(&["inspect", "/no/such.wasm"]);
    assert!(
        !out.status.success() && text.contains("cannot read component"),
        "{text}"
    );
}

#[test]
fn check_config_prints_effective_grants_without_secret_values() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(
        &config,
        format!(
            "[backends.acme]\ncomponent = {:?}\ndir = \"data\"\n\
             dirs = [{{ host = \"models\", guest = \"/models\", read_only = true }}]\n\
             net = [\"127.0.0.1:6379\"]\nhttp = [\"http://127.0.0.1:9000\"]\n\
             env = [\"KVWASM_TEST_SECRET\", \"KVWASM_TEST_UNSET\"]\nmax_concurrent_calls = 8\n\
             idle_release_ms = 250\n\
             settings = {{ bucket = \"kv-cache\", db = 2, secret_key_env = \"KVWASM_TEST_SECRET\" }}\n\
             [backends.acme.tenants.alice]\ncall_timeout_ms = 100\n\
             [backends.pinned]\ncomponent = \"builtin:memory\"\nsha256 = \"{}\"\n\
             [backends.disk]\ncomponent = \"builtin:fs\"\ndir = \"disk\"\nwarm_handles = 2\n",
            kvwasm_guest_artifacts::HOSTILE_PATH,
            "0".repeat(64)
        ),
    )
    .unwrap();
    let out = Command::new(KVWASM)
        .args(["check-config", config.to_str().unwrap()])
        .env("KVWASM_TEST_SECRET", "hunter2")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the pinned backend is broken: {text}"
    );
    for expected in [
        "[backends.acme]",
        &format!("{} → /data (read-write)", dir.path().join("data").display()),
        &format!(
            "{} → /models (read-only)",
            dir.path().join("models").display()
        ),
        "tcp 127.0.0.1:6379",
        "guest name lookups: denied",
        "http://127.0.0.1:9000",
        "KVWASM_TEST_SECRET (set)",
        "KVWASM_TEST_UNSET (not set)",
        "max concurrent calls 8, idle instances released after 250 ms\n",
        "idle instances released after 1000 ms, except on the 2 most recently used \
         handle(s) per directory (warm_handles)",
        "bucket = \"kv-cache\"",
        "db = \"2\"",
        "secret_key_env = \"KVWASM_TEST_SECRET\"",
        "tenant     alice: memory 256 MiB, call deadline 100 ms",
        "[backends.pinned]",
        "but the config pins",
        "1 guest(s) cannot be loaded",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    assert!(
        !text.contains("hunter2"),
        "a secret value was printed:\n{text}"
    );
    // A secret in settings is refused before anything loads.
    std::fs::write(
        &config,
        "[backends.s3]\ncomponent = \"builtin:s3\"\nsettings = { secret_access_key = \"hunter2\" }\n",
    )
    .unwrap();
    let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text.contains("secrets do not belong in settings") && !text.contains("hunter2"),
        "{text}"
    );
    // The alias the issue names works too.
    let (out, _) = kvwasm(&["run-check-config", "--help"]);
    assert!(out.status.success());
}

/// Validating a config changes nothing: the writable directory a backend
/// names is reported missing, not created (it was, by loading the backend
/// as for a run), for a fabric's and a subscriber's too.
#[test]
fn check_config_creates_nothing_it_validates() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    std::fs::write(
        &config,
        "[backends.kv]\ncomponent = \"builtin:fs\"\ndir = \"srv/kv\"\n\
         [fabrics.mem]\ncomponent = \"builtin:synthetic\"\ndir = \"srv/fabric\"\n\
         [subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\n\
         dirs = [{ host = \"srv/idx\", guest = \"/data\" }]\n",
    )
    .unwrap();
    let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{text}");
    for name in ["kv", "fabric", "idx"] {
        let missing = format!(
            "{} → /data (read-write); missing: created when the guest is loaded",
            dir.path().join("srv").join(name).display()
        );
        assert!(text.contains(&missing), "{missing:?} missing:\n{text}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["kvwasm.toml"], "check-config created something");
}

#[test]
fn inspect_and_check_config_know_fabrics() {
    let (out, text) = kvwasm(&["inspect", "builtin:tcp"]);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("fabric, world kvwasm:fabric/configured-fabric")
            && text.contains("wasi:sockets/tcp@"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[fabrics.tcp]\ncomponent = \"builtin:tcp\"\nnet = [\"127.0.0.1:7070\"]\n\
         settings = { peer = \"127.0.0.1:7070\" }\ncall_timeout_ms = 5000\n\
         [fabrics.wrong]\ncomponent = \"builtin:fs\"\n",
    )
    .unwrap();
    let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "the kv-store under [fabrics] must fail: {text}"
    );
    assert!(text.contains("0 backend(s), 2 fabric(s)"), "{text}");
    assert!(
        text.contains("[fabrics.tcp]")
            && text.contains("127.0.0.1:7070")
            && text.contains("call deadline 5000 ms")
            && text.contains("one instance"),
        "{text}"
    );
    assert!(
        text.contains("[fabrics.wrong]") && text.contains("is a kv-store backend, not a fabric"),
        "{text}"
    );
}

#[test]
fn metrics_reads_a_running_process() {
    use std::io::{BufRead, BufReader, Write};
    // Stands in for a process serving KVWASM_METRICS_ADDR (the server side
    // is tested in tests/tests/capabilities.rs).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut line = String::new();
            let mut reader = BufReader::new(&stream);
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let body = "# TYPE kvwasm_calls_total counter\n\
                        kvwasm_calls_total{backend=\"acme\"} 42\n\
                        kvwasm_traps_total{backend=\"acme\"} 2\n";
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let (out, text) = kvwasm(&["metrics", "--addr", &addr]);
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.starts_with("acme"))
        .expect("a row for acme");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells,
        ["acme", "42", "0", "2", "0", "0", "0", "0"],
        "{text}"
    );
}

#[test]
fn check_config_shows_tls_settings_and_fingerprints_and_inspect_the_tls_import() {
    let pki = kvwasm_tests::tls::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kvwasm.toml");
    let redis = |tls: &str| {
        format!(
            "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"127.0.0.1:6380\"]\n\
             settings = {{ address = \"127.0.0.1:6380\" }}\n{tls}\n"
        )
    };
    let table = format!(
        "[backends.redis.tls]\nca_file = \"{}\"\nca_mode = \"extend\"\n\
         client_cert = \"{}\"\nclient_key = \"{}\"\nserver_name = \"redis.internal\"\n",
        pki.ca.display(),
        pki.client.cert.display(),
        pki.client.key.display()
    );
    std::fs::write(&config, redis(&table)).unwrap();
    let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{text}");
    let sha = |path: &std::path::Path| {
        let out = Command::new("sha256sum").arg(path).output().unwrap();
        String::from_utf8_lossy(&out.stdout)[..64].to_owned()
    };
    for expected in [
        format!(
            "on: public roots + ca_file {} (sha256 {})",
            pki.ca.display(),
            sha(&pki.ca)
        ),
        "server name redis.internal".to_owned(),
        format!(
            "client certificate {} (sha256 {})",
            pki.client.cert.display(),
            sha(&pki.client.cert)
        ),
        "tls = \"true\"".to_owned(),
    ] {
        assert!(text.contains(&expected), "{expected:?} missing:\n{text}");
    }
    let key = std::fs::read_to_string(&pki.client.key).unwrap();
    let key_body = key.lines().nth(1).unwrap();
    assert!(
        !text.contains(key_body),
        "the client key was printed:\n{text}"
    );

    // Bad TLS entries are refused at load, each with its reason.
    for (tls, reason) in [
        ("tls = { ca_mode = \"extend\" }", "needs a ca_file"),
        (
            "tls = { client_cert = \"c.pem\" }",
            "client_cert and client_key go together",
        ),
        (
            "tls = { ca_file = \"/no/such/ca.pem\" }",
            "cannot read ca_file /no/such/ca.pem",
        ),
        (
            "tls = { insecure_skip_verify = true }",
            "there is no way to skip verification",
        ),
    ] {
        std::fs::write(&config, redis(tls)).unwrap();
        let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
        assert!(!out.status.success(), "{tls}: {text}");
        assert!(text.contains(reason), "{tls}: {reason:?} missing:\n{text}");
    }
    // A file that holds no certificate is no CA bundle.
    std::fs::write(
        &config,
        redis(&format!(
            "tls = {{ ca_file = \"{}\" }}",
            pki.client.key.display()
        )),
    )
    .unwrap();
    let (out, text) = kvwasm(&["check-config", config.to_str().unwrap()]);
    assert!(
        !out.status.success() && text.contains("holds no PEM certificate"),
        "{text}"
    );

    let (out, text) = kvwasm(&["inspect", "builtin:redis"]);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("wasi:tls/types@0.2.0-draft") && text.contains("tls (handshakes by the host"),
        "{text}"
    );
}

/// Every import of every builtin guest (kvwasm-host's and those kvwasm
/// installs from kvwasm-fabric and kvwasm-kv-indexer-host) is one the host provides, and
/// `inspect` names the grant behind it (an import it does not know would
/// read "instantiation will fail" to an operator).
#[test]
fn inspect_knows_every_import_of_the_builtins() {
    let own = kvwasm_host::component::Builtin::ALL.map(|b| b.name());
    let linked = (kvwasm_fabric::builtins::BUILTINS.iter())
        .chain(&kvwasm_kv_indexer_host::BUILTINS)
        .map(|b| b.name);
    for name in own.into_iter().chain(linked) {
        let (out, text) = kvwasm(&["inspect", &format!("builtin:{name}")]);
        assert!(out.status.success(), "{name}: {text}");
        assert!(!text.contains("unknown to kvwasm"), "{name}: {text}");
    }
}

/// `kvwasm tier status` shows what each tier holds (listed now) and what
/// the last process using the store recorded: reads per tier, moves, the
/// advisor's decisions; `check-config` describes the tiered entry.
#[test]
fn tier_status_shows_usage_moves_and_decisions() {
    use kvwasm_host::tiering::{Action, Advice, AdviceSink, open_tiered};
    let dir = tempfile::tempdir().unwrap();
    let knobs = "low_water_pct = 100\ndemote_interval_ms = 60000\n";
    let cold = kvwasm_tests::tiered::fs_cold(dir.path());
    let path = kvwasm_tests::tiered::config(dir.path(), 1, &cold, knobs);
    {
        let store = open_tiered(&path, "kv", "ns").unwrap();
        let chunks: Vec<Vec<u8>> = (0..4).map(|i| kvwasm_tests::pattern(64 << 10, i)).collect();
        for c in &chunks {
            store.put_chunk(&kvwasm_tests::xxh3_key(c), c).unwrap();
        }
        let tiers = store.tiered().unwrap();
        let demote = Advice {
            action: Action::Demote,
            tier: 0,
            hashes: chunks[..2]
                .iter()
                .map(|c| kvwasm_tests::xxh3_key(c).to_vec())
                .collect(),
        };
        assert_eq!(tiers.apply(vec![demote]).applied, 2);
        tiers.record_decisions(["demote 2 cold chunks".to_owned()]);
        for c in &chunks[1..3] {
            store.get_chunk(&kvwasm_tests::xxh3_key(c)).unwrap();
        }
    }
    let config = path.to_str().unwrap();
    let (out, text) = kvwasm(&[
        "tier",
        "status",
        "--config",
        config,
        "--namespace",
        "ns",
        "kv",
    ]);
    assert!(out.status.success(), "{text}");
    for expected in [
        "0    hot                      131072        1048576          2          1     50.0%",
        "1    cold                     131072      unbounded          2          1     50.0%",
        "0 promotions, 2 demotions, 0 evictions, 131072 bytes moved",
        "  demote 2 cold chunks",
    ] {
        assert!(text.contains(expected), "{expected:?} missing:\n{text}");
    }
    let (out, text) = kvwasm(&["check-config", config]);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("tiered     hot (1 MiB) -> cold (last: durable, manifests)"),
        "{text}"
    );
    let (out, text) = kvwasm(&["tier", "status", "--config", config, "hot"]);
    assert!(
        !out.status.success() && text.contains("not a tiered store"),
        "{text}"
    );
}

/// `kvwasm` embeds the guests it runs, never a test guest or the vendor
/// starter: every build makes those (only tests name them), so a name in
/// shipped code would ship them silently.
#[test]
fn kvwasm_embeds_no_test_guest_or_vendor_starter() {
    use kvwasm_guest_artifacts as guests;
    let binary = std::fs::read(KVWASM).unwrap();
    let contains = |needle: &[u8]| binary.windows(needle.len()).any(|w| w == needle);
    // The search sees an embedded guest: `kvwasm serve` runs the KV indexer.
    assert!(contains(guests::KV_INDEXER), "builtin:kv-indexer missing");
    for (name, bytes) in guests::tests_only() {
        assert!(!contains(bytes), "{name} embedded in kvwasm");
    }
}
