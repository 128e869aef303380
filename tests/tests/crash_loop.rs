//! Crash loops (issue 12): a consumer saving slots through the shim from two
//! threads is SIGKILLed at a random point while saving, 50 times per
//! backend, on the same store. After every kill a fresh consumer audits the
//! store through the C ABI: every visible manifest must parse completely and
//! every chunk it names must be there with bytes that hash to its key.
//!
//! The kill delays come from a seeded PRNG; a failure names the seed, and
//! `KVWASM_CRASH_SEED=<seed>` replays the same delays and writer seeds.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvwasm_tests::crash::{CheckReport, Rng, encode_manifest, parse_manifest};
use kvwasm_tests::servers::RedisServer;
use kvwasm_tests::{fs_uri, shim_path, write_config};

const WRITER: &str = env!("CARGO_BIN_EXE_kv-crash-writer");
/// Kills per backend.
const KILLS: u64 = 50;
/// A kill lands this long (ms, uniform) after the writer's first save.
const KILL_DELAY_MS: (u64, u64) = (50, 400);
/// The variable the Redis config names in `password_env`.
const PASSWORD_VAR: &str = "KVWASM_TEST_REDIS_PASSWORD";

/// A store to crash: its URI and the environment a consumer needs for it.
struct Target {
    uri: String,
    env: Vec<(&'static str, String)>,
}

impl Target {
    /// The embedded fs backend on `dir`.
    fn fs(dir: &Path) -> Target {
        Target {
            uri: fs_uri(dir),
            env: Vec::new(),
        }
    }

    /// `builtin:redis` on `server` (AOF on), configured in `dir`, with
    /// `backend` lines added to the backend's table and `settings` lines to
    /// its settings.
    fn redis(server: &RedisServer, dir: &Path, backend: &str, settings: &str) -> Target {
        let config = write_config(
            dir,
            &format!(
                "[backends.redis]\ncomponent = \"builtin:redis\"\nnet = [\"{0}\"]\n\
                 env = [\"{PASSWORD_VAR}\"]\ncall_timeout_ms = 20000\n{backend}\
                 [backends.redis.settings]\naddress = \"{0}\"\n\
                 password_env = \"{PASSWORD_VAR}\"\ntimeout_ms = 10000\n{settings}",
                server.addr
            ),
        );
        let password = server.password.clone().expect("a password");
        Target {
            uri: "wasm://redis/crash".into(),
            env: vec![
                ("KVWASM_CONFIG", config.display().to_string()),
                (PASSWORD_VAR, password),
            ],
        }
    }

    /// The tiered store `kv` of kvwasm_tests::tiered: a 1 MiB `builtin:fs`
    /// hot tier over a `builtin:fs` cold one, both in `dir`, demoted to
    /// half its capacity every 5 ms on top of the demotions full puts make.
    fn tiered(dir: &Path) -> Target {
        let knobs = "low_water_pct = 50\ndemote_interval_ms = 5\n";
        let config =
            kvwasm_tests::tiered::config(dir, 1, &kvwasm_tests::tiered::fs_cold(dir), knobs);
        Target {
            uri: "wasm://kv/crash".into(),
            env: vec![("KVWASM_CONFIG", config.display().to_string())],
        }
    }

    /// `kv-crash-writer <shim> <uri> <args>` with this target's environment.
    fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(WRITER);
        cmd.arg(shim_path()).arg(&self.uri).args(args);
        cmd.env_remove("KVWASM_CONFIG")
            .envs(self.env.iter().cloned());
        cmd
    }

    /// Audit the store from a fresh consumer process.
    fn check(&self) -> CheckReport {
        let out = self
            .command(&["check".into()])
            .output()
            .expect("run the checker");
        let stdout = String::from_utf8_lossy(&out.stdout);
        CheckReport::from_lines(&stdout).unwrap_or_else(|| {
            panic!(
                "the checker failed ({}): {stdout}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// What a writer reported before it was killed.
#[derive(Debug, Default)]
struct Progress {
    saves: usize,
    dedup_hits: usize,
    deletes: usize,
}

/// When to kill a writer.
#[derive(Clone, Copy)]
enum Kill {
    /// This long after its first completed save.
    After(Duration),
    /// At its first `published` line (a broken writer's early manifest)
    /// this long after its first completed save.
    AtPublish(Duration),
}

/// A line of interest from a writer.
enum Event {
    Saved,
    Published,
}

/// Start a writer, SIGKILL it as `kill` says, and return what it reported.
/// Fails if the writer stopped by itself (a failed call ends it) or never
/// saved.
fn kill_while_saving(
    target: &Target,
    seed: u64,
    epoch: u64,
    kill: Kill,
    mode: Option<&str>,
) -> Progress {
    let mut args = vec!["write".to_owned(), seed.to_string(), epoch.to_string()];
    args.extend(mode.map(str::to_owned));
    let mut child = target
        .command(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kv-crash-writer");
    // Both pipes are drained as the lines come, so the writer never blocks
    // on a full pipe: it is saving, not waiting, when the kill lands.
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let (events, event) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut progress = Progress::default();
        for line in stdout.lines().map_while(Result::ok) {
            if let Some((_, dup)) = line
                .strip_prefix("saved ")
                .and_then(|l| l.split_once(" dup="))
            {
                let _ = events.send(Event::Saved);
                progress.saves += 1;
                progress.dedup_hits += dup.parse::<usize>().expect("dup count");
            } else if line.starts_with("published ") {
                let _ = events.send(Event::Published);
            } else if line.starts_with("deleted ") {
                progress.deletes += 1;
            }
        }
        progress
    });
    let mut stderr_pipe = child.stderr.take().expect("stderr");
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr_pipe.read_to_string(&mut text);
        text
    });
    let patience = Duration::from_secs(30);
    let wait_for = |wanted: fn(&Event) -> bool| loop {
        match event.recv_timeout(patience) {
            Ok(e) if wanted(&e) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    };
    let mut ready = wait_for(|e| matches!(e, Event::Saved));
    if ready {
        match kill {
            Kill::After(delay) => std::thread::sleep(delay),
            Kill::AtPublish(delay) => {
                std::thread::sleep(delay);
                while event.try_recv().is_ok() {}
                ready = wait_for(|e| matches!(e, Event::Published));
            }
        }
    }
    let exited = child.try_wait().expect("try_wait");
    child.kill().expect("SIGKILL the writer");
    child.wait().expect("reap the writer");
    let progress = reader.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    assert!(ready, "the writer never saved (or published): {stderr}");
    assert!(
        exited.is_none(),
        "the writer stopped by itself ({exited:?}) before the kill: {stderr}"
    );
    progress
}

/// `KVWASM_CRASH_SEED`, else a fresh seed.
fn seed() -> u64 {
    match std::env::var("KVWASM_CRASH_SEED") {
        Ok(seed) => seed.parse().expect("KVWASM_CRASH_SEED is a u64"),
        Err(_) => {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(Instant::now())
        }
    }
}

/// Kill a writer [`KILLS`] times on `target`, auditing after every kill.
fn crash_loop(backend: &str, target: &Target) {
    crash_loop_n(backend, target, KILLS, KILL_DELAY_MS);
}

/// Kill a writer `kills` times on `target`, each `delay_ms` (uniform)
/// after its first save, auditing after every kill.
fn crash_loop_n(backend: &str, target: &Target, kills: u64, delay_ms: (u64, u64)) {
    let seed = seed();
    eprintln!("{backend}: crash loop seed {seed} (replay with KVWASM_CRASH_SEED={seed})");
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let (mut progress, mut manifests, mut chunks) = (Progress::default(), 0, 0);
    for epoch in 0..kills {
        let delay = Duration::from_millis(rng.range(delay_ms.0, delay_ms.1 + 1));
        let writer_seed = rng.next_u64();
        let run = kill_while_saving(target, writer_seed, epoch, Kill::After(delay), None);
        let report = target.check();
        assert!(
            report.problems.is_empty(),
            "{backend}, kill {epoch} (seed {seed}: writer seed {writer_seed}, killed \
             {delay:?} after its first save, {} saves): {:#?}",
            run.saves,
            report.problems
        );
        progress.saves += run.saves;
        progress.dedup_hits += run.dedup_hits;
        progress.deletes += run.deletes;
        manifests += report.manifests;
        chunks += report.chunks;
    }
    eprintln!(
        "{backend}: {kills} kills in {:.1?}; before them {} saves ({} chunk dedup hits) and {} \
         deletes; after them {manifests} visible manifests checked, {chunks} chunks verified, \
         0 torn, 0 dangling",
        started.elapsed(),
        progress.saves,
        progress.dedup_hits,
        progress.deletes
    );
    // The audit had something to audit, and the dedup path ran.
    assert!(manifests >= kills as usize && chunks > manifests * 8);
    assert!(progress.dedup_hits > 0, "{progress:?}");
}

#[test]
fn fs_survives_fifty_kills_while_saving() {
    let dir = tempfile::tempdir().unwrap();
    crash_loop("builtin:fs", &Target::fs(dir.path()));
}

#[test]
fn redis_with_aof_survives_fifty_kills_while_saving() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    crash_loop("builtin:redis", &Target::redis(&server, dir.path(), "", ""));
}

/// A tiered store (issue 15) killed 20 times while its writer saves into a
/// 1 MiB hot tier, so demotions (copy to the cold tier, verify, remove from
/// the hot one) run all the time, from full puts and the background
/// demoter: after every kill a fresh process rebuilds the index from the
/// tiers and every visible manifest's chunks read back whole. The cold tier
/// received chunks, so the kills did land among demotions.
#[test]
fn a_tiered_store_survives_twenty_kills_during_demotions() {
    let dir = tempfile::tempdir().unwrap();
    crash_loop_n("tiered fs/fs", &Target::tiered(dir.path()), 20, (20, 300));
    let (_, hot) = kvwasm_tests::tiered::fs_chunk_usage(&dir.path().join("hot/crash"));
    let (_, cold) = kvwasm_tests::tiered::fs_chunk_usage(&dir.path().join("cold/crash"));
    eprintln!("after the kills: {hot} chunks hot, {cold} cold");
    assert!(cold > 0, "nothing was ever demoted");
}

/// The audit is not vacuous: a writer that publishes a manifest before its
/// chunks leaves dangling manifests, and one that publishes a manifest in
/// two steps leaves torn ones, and the checker reports exactly those. The
/// kill lands as the early manifest becomes visible; it can still miss the
/// window (the remaining puts may all be dedup hits, or finish first), so a
/// few kills are allowed.
#[test]
fn the_checker_catches_dangling_and_torn_manifests_of_a_broken_writer() {
    const TRIES: u64 = 10;
    let seed = seed();
    let mut rng = Rng::new(seed);
    for (mode, kind) in [("manifest-first", "dangling"), ("torn-manifest", "torn")] {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::fs(dir.path());
        let caught = (0..TRIES).find(|&epoch| {
            let delay = Duration::from_millis(rng.range(0, 50));
            kill_while_saving(
                &target,
                rng.next_u64(),
                epoch,
                Kill::AtPublish(delay),
                Some(mode),
            );
            let report = target.check();
            assert_eq!(
                report.count(kind),
                report.problems.len(),
                "{mode}: only {kind} manifests expected: {:#?}",
                report.problems
            );
            report.count(kind) > 0
        });
        let caught = caught.unwrap_or_else(|| {
            panic!("{mode}: no {kind} manifest after {TRIES} kills (seed {seed})")
        });
        eprintln!("{mode}: {kind} manifest caught at kill {}", caught + 1);
    }
}

/// The torn-manifest verdict is exact: the whole manifest parses to its
/// chunks; every strict prefix, a splice of two versions, and a manifest of
/// another slot are torn.
#[test]
fn a_manifest_parses_only_whole() {
    let chunks: Vec<_> = (0u8..12).map(|i| ([i; 8], 4096 << (i % 7))).collect();
    let old = encode_manifest("slot-1", "w/0", &chunks[..10]);
    let new = encode_manifest("slot-1", "w/1", &chunks);
    assert_eq!(parse_manifest("slot-1", &new), Ok(chunks.clone()));
    for len in 0..new.len() {
        assert!(
            parse_manifest("slot-1", &new[..len]).is_err(),
            "prefix {len}"
        );
    }
    let splice = [&new[..new.len() / 2], &old[old.len() / 2..]].concat();
    assert!(parse_manifest("slot-1", &splice).is_err());
    assert!(parse_manifest("slot-2", &new).is_err());
}

/// No kill needed for a dangling manifest if a chunk put before it is still
/// staged in another guest instance when the manifest is published. Three
/// threads save on one Redis handle served by two instances (the Redis
/// guest stages chunks until a manifest), so a thread waiting for an
/// instance often takes the one a `put_manifest` or flush has just handed
/// back; a second handle reads every save's chunks right after its manifest.
#[test]
fn redis_publishes_a_manifest_only_after_every_chunk_put_before_it() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    // Without the per-put existence check a put takes microseconds: the
    // race between a put and a manifest is most likely.
    let target = Target::redis(
        &server,
        dir.path(),
        "max_instances = 2\n",
        "dedup_check = \"flush\"\n",
    );
    let out = target
        .command(&["publish-race".into(), "3".into(), "5".into()])
        .output()
        .expect("run kv-crash-writer publish-race");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let summary = stdout.lines().last().unwrap_or_default();
    eprintln!("{summary}");
    let first_missing: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("missing "))
        .take(5)
        .collect();
    assert!(
        summary.starts_with("raced saves=") && first_missing.is_empty(),
        "chunks not visible after their manifest ({summary}), e.g. {first_missing:#?}"
    );
}

/// A fresh ext4 filesystem on a loop device, and images of it as a power
/// cut would leave it: a copy of the device taken while it is mounted
/// holds what the kernel has written to it and nothing still in the page
/// cache (unsynced data, which a crash loses). A remount or
/// `drop_caches` would not do: unmounting writes every dirty page, and
/// `drop_caches` drops only clean ones.
struct ScratchFs {
    dir: tempfile::TempDir,
    image: std::path::PathBuf,
    mount: std::path::PathBuf,
    /// Power-cut images mounted so far (unmounted on drop).
    snapshots: std::cell::RefCell<Vec<std::path::PathBuf>>,
}

impl ScratchFs {
    fn new() -> ScratchFs {
        // On the disk: the copies are read from the image's page cache.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        std::fs::File::create(&image)
            .unwrap()
            .set_len(64 << 20)
            .unwrap();
        // Everything initialised now: no lazy writes into a copy later.
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&image));
        // No journal commit but those a sync forces, so nothing reaches the
        // device on a timer while the test looks.
        run(Command::new("mount")
            .args(["-o", "loop,noatime,commit=300"])
            .arg(&image)
            .arg(&mount));
        ScratchFs {
            dir,
            image,
            mount,
            snapshots: Default::default(),
        }
    }

    /// The store's directory on the filesystem.
    fn store(&self) -> std::path::PathBuf {
        self.mount.join("store")
    }

    /// Mount a copy of the device as it is now (what a power cut now would
    /// leave, its journal replayed) and return the store directory in it.
    fn after_power_cut(&self) -> std::path::PathBuf {
        let n = self.snapshots.borrow().len();
        let copy = self.dir.path().join(format!("cut-{n}.img"));
        let mount = self.dir.path().join(format!("cut-{n}"));
        std::fs::copy(&self.image, &copy).unwrap();
        std::fs::create_dir(&mount).unwrap();
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&copy)
            .arg(&mount));
        self.snapshots.borrow_mut().push(mount.clone());
        mount.join("store")
    }
}

impl Drop for ScratchFs {
    fn drop(&mut self) {
        for mount in self.snapshots.borrow().iter().chain([&self.mount]) {
            let _ = Command::new("umount").arg(mount).status();
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `kv-crash-writer stage SEED` on `store`, killed once its chunks are put
/// (before any manifest): its chunks are in place, unsynced.
fn stage_and_kill(store: &Path, seed: u64) {
    let mut child = Target::fs(store)
        .command(&["stage".into(), seed.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kv-crash-writer stage");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let staged = lines.find_map(|l| l.ok().filter(|l| l.starts_with("staged ")));
    child.kill().expect("SIGKILL the writer");
    child.wait().expect("reap the writer");
    assert_eq!(
        staged.as_deref(),
        Some("staged 16"),
        "the stager never staged"
    );
}

/// How many of `seed`'s staged chunks a power cut now would lose (missing
/// or short in `store_after_cut`).
fn lost_chunks(store_after_cut: &Path, seed: u64) -> usize {
    kvwasm_tests::crash::staged_chunks(seed)
        .iter()
        .filter(|content| {
            let hex = hex::encode(kvwasm_tests::xxh3_key(content));
            let path = store_after_cut.join("chunks").join(&hex[..1]).join(&hex);
            std::fs::read(path).ok().as_ref() != Some(*content)
        })
        .count()
}

/// A store whose chunks a killed writer left unsynced, with a power cut
/// now losing some of them: the precondition of the tests below, checked
/// rather than assumed. (The kernel may write them back on its own under
/// memory pressure; then a fresh filesystem is tried.)
fn fs_with_unsynced_chunks(seed: u64) -> (ScratchFs, usize) {
    for _ in 0..5 {
        let fs = ScratchFs::new();
        stage_and_kill(&fs.store(), seed);
        let lost = lost_chunks(&fs.after_power_cut(), seed);
        if lost > 0 {
            return (fs, lost);
        }
    }
    panic!("the staged chunks always reached the disk before the power cut");
}

/// Issue 37: a chunk found in place (put by a writer killed before its
/// manifest, never synced) is durable before the manifest that names it.
/// After the new writer's `put_manifest` returns, a power cut keeps the
/// manifest and every chunk it names whole.
#[test]
fn a_chunk_found_in_place_is_durable_before_the_manifest_that_names_it() {
    let seed = 37;
    let (fs, lost) = fs_with_unsynced_chunks(seed);
    let out = Target::fs(&fs.store())
        .command(&["publish".into(), seed.to_string()])
        .output()
        .expect("run kv-crash-writer publish");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("published slot-0 chunks=16 dup=16"),
        "every chunk was found in place: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after_cut = fs.after_power_cut();
    let report = Target::fs(&after_cut).check();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    assert_eq!((report.manifests, report.chunks), (1, 16));
    eprintln!("{lost} of 16 found chunks were not durable before the manifest; all were after it");
}

/// The power-cut image is not vacuous: a writer that trusts chunks found in
/// place (publishes its manifest, synced, without syncing them) leaves a
/// manifest naming chunks the cut lost, and the checker reports them.
#[test]
fn a_manifest_published_over_unsynced_found_chunks_dangles_after_a_power_cut() {
    let seed = 38;
    let (fs, lost) = fs_with_unsynced_chunks(seed);
    let chunks: Vec<_> = kvwasm_tests::crash::staged_chunks(seed)
        .iter()
        .map(|c| (kvwasm_tests::xxh3_key(c), c.len()))
        .collect();
    let name = kvwasm_tests::crash::slot_name(0);
    let manifest = encode_manifest(&name, "trusting", &chunks);
    // As a backend that trusts what it finds: the manifest alone, synced
    // and renamed into place, its directory synced.
    let store = fs.store();
    let tmp = store.join(".tmp-manifest");
    let mut file = std::fs::File::create(&tmp).unwrap();
    std::io::Write::write_all(&mut file, &manifest).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&tmp, store.join(&name)).unwrap();
    std::fs::File::open(&store).unwrap().sync_all().unwrap();

    let report = Target::fs(&fs.after_power_cut()).check();
    assert_eq!(report.manifests, 1, "the synced manifest survives the cut");
    let broken = report.count("corrupt") + report.count("dangling");
    assert!(
        broken > 0 && broken == report.problems.len(),
        "{lost} chunks were not durable: {:#?}",
        report.problems
    );
}
