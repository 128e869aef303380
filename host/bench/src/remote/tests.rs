use super::*;

#[test]
fn the_generated_configuration_loads() {
    let dir = tempfile::tempdir().unwrap();
    let servers = Servers {
        redis: Some("127.0.0.1:6379".into()),
        redis_cluster: Vec::new(),
        hiredis: None,
        s3: Some("http://127.0.0.1:9000".into()),
        guests: None,
        redis_pid: None,
        s3_pid: None,
        same_handle: false,
    };
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config(&servers)).unwrap();
    kvwasm_host::config::Config::load(&path).unwrap();
    // Only the side restoring on the saving handle keeps its instance.
    let text = config(&servers);
    assert_eq!(text.matches("idle_release_ms").count(), 1, "{text}");
    assert!(text.contains("[backends.redis-same-handle]\n"), "{text}");
    let cluster = config(&Servers {
        redis_cluster: vec![
            "127.0.0.1:7001".into(),
            "127.0.0.1:7002".into(),
            "127.0.0.1:7003".into(),
        ],
        ..servers.clone()
    });
    std::fs::write(&path, &cluster).unwrap();
    let loaded = kvwasm_host::config::Config::load(&path).unwrap();
    loaded.backend("redis-cluster").unwrap();
    loaded.backend("redis-cluster-batched").unwrap();
    loaded.backend("redis-cluster-written").unwrap();
    assert!(
        cluster
            .lines()
            .any(|l| l.contains("mode = \"cluster\"") && l.contains("dedup_check = \"write\"")),
        "{cluster}"
    );
    assert!(
        cluster.contains("mode = \"cluster\"")
            && cluster.contains("[backends.redis-cluster-batched]\n")
            && cluster
                .lines()
                .any(|l| l.contains("mode = \"cluster\"") && l.contains("dedup_check = \"flush\"")),
        "{cluster}"
    );
    assert!(
        cluster.contains(
            "settings = { mode = \"cluster\", addresses = [\"127.0.0.1:7001\", \"127.0.0.1:7002\"], "
        ),
        "{cluster}"
    );
    // Restoring on the saving handle keeps its instance until then.
    let same = config(&Servers {
        same_handle: true,
        ..servers.clone()
    });
    // Every side: three on the Redis server, two on S3.
    assert_eq!(same.matches("idle_release_ms = 0\n").count(), 5, "{same}");
    std::fs::write(&path, same).unwrap();
    let loaded = kvwasm_host::config::Config::load(&path).unwrap();
    assert_eq!(loaded.backend("s3").unwrap().idle_release_ms, 0);
    let text = config(&Servers {
        guests: Some("/g".into()),
        ..servers
    });
    assert!(
        text.contains("component = \"/g/kvwasm_guest_redis.wasm\""),
        "{text}"
    );
    assert!(
        text.contains("component = \"/g/kvwasm_guest_s3.wasm\""),
        "{text}"
    );
}

#[test]
fn a_missing_or_other_manifest_and_a_short_or_changed_chunk_fail_the_restore() {
    let load = Load::new(3, 64, 1.5);
    check_manifest(&load.manifest, &load).unwrap();
    check_manifest(&[], &load).unwrap_err();
    check_manifest(&load.manifest[8..], &load).unwrap_err();
    let mut other = load.manifest.clone();
    other[0] ^= 1;
    check_manifest(&other, &load).unwrap_err();
    check(&load.data, &load, true).unwrap();
    check(&load.data[1..], &load, false).unwrap_err();
    check(&[], &load, false).unwrap_err();
    let mut changed = load.data.clone();
    changed[63] ^= 1;
    check(&changed, &load, true).unwrap_err();
    // Unverified (a kept repetition), only the length is compared.
    check(&changed, &load, false).unwrap();
}

/// A side that takes no time: what `compare` pairs up is under test.
struct Fake {
    label: &'static str,
    exact_puts: bool,
    baseline: bool,
    cluster: bool,
    twin: &'static str,
}

impl Side for Fake {
    fn label(&self) -> String {
        self.label.into()
    }
    fn exact_puts(&self) -> bool {
        self.exact_puts
    }
    fn baseline(&self) -> bool {
        self.baseline
    }
    fn cluster(&self) -> bool {
        self.cluster
    }
    fn twin(&self) -> &'static str {
        self.twin
    }
    fn save(&self, _: &str, _: &Load, meter: Meter) -> Result<Measured, String> {
        Ok(meter.start().stop())
    }
    fn restore(&self, _: &str, _: &Load, meter: Meter, _: bool) -> Result<Measured, String> {
        Ok(meter.start().stop())
    }
    fn base(&self, ns: &str) -> String {
        format!("{}/{ns}", self.label)
    }
}

/// Every kvwasm side meets the first native client, with the target;
/// a further native client that answers puts exactly meets only the
/// sides that do, for saves, with no target.
#[test]
fn like_for_like_saves_are_paired_without_a_target() {
    let fake = |label, exact_puts| Fake {
        label,
        exact_puts,
        baseline: !exact_puts,
        cluster: false,
        twin: "",
    };
    let (pipelined, exact) = (fake("pipelined", false), fake("exact", true));
    let sides: [Box<dyn Side>; 2] = [
        Box::new(fake("kvwasm put", true)),
        Box::new(fake("kvwasm flush", false)),
    ];
    let cleaned = std::cell::RefCell::new(Vec::new());
    let pairs = compare(
        &[&pipelined, &exact],
        &sides,
        &[Load::new(2, 4096, 1.5)],
        2,
        None,
        |base, _| {
            cleaned.borrow_mut().push(base.to_owned());
            Ok(())
        },
    )
    .unwrap();
    let got: Vec<_> = pairs
        .iter()
        .map(|p| {
            let (case, native, kvwasm) = (&p.case, &p.native_label, &p.kvwasm_label);
            (format!("{case}: {native} / {kvwasm}"), p.target)
        })
        .collect();
    let want = [
        ("save 2 × 4 KiB: pipelined / kvwasm put", Some(1.5)),
        ("save 2 × 4 KiB: pipelined / kvwasm flush", Some(1.5)),
        (
            "restore with prefetch 2 × 4 KiB: pipelined / kvwasm put",
            Some(1.5),
        ),
        (
            "restore with prefetch 2 × 4 KiB: pipelined / kvwasm flush",
            Some(1.5),
        ),
        ("save 2 × 4 KiB: exact / kvwasm put", None),
    ];
    let want: Vec<_> = want.iter().map(|(c, t)| (c.to_string(), *t)).collect();
    assert_eq!(got, want);
    // Two repetitions and the warm-up, each side's key space deleted.
    assert_eq!(cleaned.borrow().len(), 3 * 4);
    assert!(
        pairs.iter().all(|p| p.kvwasm.samples.len() == 2),
        "{pairs:?}"
    );
    let table = markdown(&pairs, 2, false);
    assert!(table.contains("| — (like for like) |"), "{table}");
}

#[test]
fn ratios_are_times_and_lower_is_better() {
    let pair = Pair {
        case: "save".into(),
        native_label: "n".into(),
        native: Stat::new(vec![10.0, 20.0]),
        kvwasm_label: "k".into(),
        kvwasm: Stat::new(vec![12.0, 30.0]),
        target: Some(1.3),
        native_cpu: Cpu {
            client: Stat::new(vec![4.0, 6.0]),
            server: None,
            client_faults: Stat::new(vec![3.0]),
        },
        kvwasm_cpu: Cpu {
            client: Stat::new(vec![5.0]),
            server: Some(Stat::new(vec![20.0, 30.0])),
            client_faults: Stat::new(vec![1500.0, 1300.0, 1400.0]),
        },
    };
    assert!((pair.ratio() - 1.35).abs() < 1e-9);
    let table = markdown(&[pair], 2, false);
    assert!(table.contains("| 1.35× | ≤ 1.3× missed |"), "{table}");
    assert!(
        table.contains(
            "| save | n | k | 5.0 (4.0–6.0) | 5.0 (5.0–5.0) | — | 25.0 (20.0–30.0) | 3 | 1400 |"
        ),
        "{table}"
    );
}

/// Sides on the cluster meet the baseline on the cluster only, and
/// each meets its twin on one server, without a target.
#[test]
fn cluster_sides_meet_their_own_baseline_and_their_one_server_twin() {
    let fake = |label, baseline, cluster, twin| Fake {
        label,
        exact_puts: false,
        baseline,
        cluster,
        twin,
    };
    let (one, on_cluster) = (
        fake("crate", true, false, "crate"),
        fake("crate cluster", true, true, "crate"),
    );
    let sides: [Box<dyn Side>; 2] = [
        Box::new(fake("kvwasm", false, false, "kvwasm")),
        Box::new(fake("kvwasm cluster", false, true, "kvwasm")),
    ];
    let pairs = compare(
        &[&one, &on_cluster],
        &sides,
        &[Load::new(2, 4096, 1.5)],
        1,
        None,
        |_, _| Ok(()),
    )
    .unwrap();
    let got: Vec<_> = pairs
        .iter()
        .map(|p| {
            let (case, native, kvwasm) = (&p.case, &p.native_label, &p.kvwasm_label);
            (format!("{case}: {native} / {kvwasm}"), p.target)
        })
        .collect();
    let cost = CLUSTER_COST;
    let want = [
        ("save 2 × 4 KiB: crate / kvwasm".to_owned(), Some(1.5)),
        (
            "save 2 × 4 KiB: crate cluster / kvwasm cluster".to_owned(),
            Some(1.5),
        ),
        (
            "restore with prefetch 2 × 4 KiB: crate / kvwasm".to_owned(),
            Some(1.5),
        ),
        (
            "restore with prefetch 2 × 4 KiB: crate cluster / kvwasm cluster".to_owned(),
            Some(1.5),
        ),
        (format!("save 2 × 4 KiB{cost}: crate / crate cluster"), None),
        (
            format!("save 2 × 4 KiB{cost}: kvwasm / kvwasm cluster"),
            None,
        ),
        (
            format!("restore with prefetch 2 × 4 KiB{cost}: crate / crate cluster"),
            None,
        ),
        (
            format!("restore with prefetch 2 × 4 KiB{cost}: kvwasm / kvwasm cluster"),
            None,
        ),
    ];
    assert_eq!(got, want);
    let table = markdown(&pairs, 1, false);
    assert!(table.contains("| — (cost of cluster mode) |"), "{table}");
}
