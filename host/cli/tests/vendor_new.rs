//! `kvwasm new` and `kvwasm wit`: the projects they write build outside
//! this checkout with nothing but their own build script, and pass
//! `kvwasm check` as written; one deliberate bug per language (a duplicate
//! `put-chunk` answering `stored`) fails it, quoting the rule. The
//! `--kind fs` projects of C, Python and JavaScript pass every check with
//! the grant their config names. The in-tree starter is exactly what
//! `kvwasm new --lang rust --kind fs` writes.

use std::path::{Path, PathBuf};
use std::process::Command;

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kvwasm <args>`, which must succeed.
fn kvwasm(args: &[&str], dir: &Path) {
    let out = Command::new(KVWASM)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kvwasm {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file under `dir` (following symbolic links), relative to it,
/// except build output.
fn files(dir: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_str().unwrap();
            if name == "target" || name.ends_with(".wasm") {
                continue;
            }
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

#[test]
fn the_vendor_starter_is_what_kvwasm_new_writes() {
    let scratch = tempfile::tempdir().unwrap();
    kvwasm(
        &[
            "new",
            "--lang",
            "rust",
            "--kind",
            "fs",
            "kvwasm-vendor-starter",
        ],
        scratch.path(),
    );
    let written = scratch.path().join("kvwasm-vendor-starter");
    let starter = repo().join("examples/vendor-starter");
    let generated = files(&written);
    for file in &generated {
        let want = std::fs::read(written.join(file)).unwrap();
        let have = std::fs::read(starter.join(file))
            .unwrap_or_else(|e| panic!("examples/vendor-starter/{}: {e}", file.display()));
        assert!(
            want == have,
            "examples/vendor-starter/{} differs from what kvwasm new writes",
            file.display()
        );
    }
    // Nothing in the starter that `kvwasm new` does not write, apart from
    // the rest of this repository's wit/ (its link points there).
    let extra: Vec<_> = files(&starter)
        .into_iter()
        .filter(|f| !f.starts_with("wit") && !generated.contains(f))
        .collect();
    assert!(
        extra.is_empty(),
        "only in examples/vendor-starter: {extra:?}"
    );
    assert!(
        std::fs::metadata(written.join("build.sh"))
            .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
            .unwrap()
    );
}

#[test]
fn kvwasm_wit_exports_the_package_backends_build_against() {
    let scratch = tempfile::tempdir().unwrap();
    kvwasm(&["wit", "out"], scratch.path());
    let out = scratch.path().join("out");
    let exported = files(&out);
    assert!(exported.contains(&PathBuf::from("kv-store.wit")));
    assert!(exported.contains(&PathBuf::from("deps/io.wit")));
    for file in &exported {
        assert_eq!(
            std::fs::read(out.join(file)).unwrap(),
            std::fs::read(repo().join("wit").join(file)).unwrap(),
            "{}",
            file.display()
        );
    }
    // Every .wit file a backend world reaches is there.
    for file in files(&repo().join("wit")) {
        let top_level_or_dep = file.components().count() == 1 || file.starts_with("deps");
        if top_level_or_dep && file.extension().is_some_and(|e| e == "wit") {
            assert!(
                exported.contains(&file),
                "kvwasm wit misses {}",
                file.display()
            );
        }
    }
}

/// A template that imports `kvwasm:kv-store` by version (JavaScript does)
/// names the version `wit/kv-store.wit` declares: componentize-js refuses
/// to build against any other, so a package bump must reach the templates.
#[test]
fn the_templates_import_the_version_of_the_package_they_are_built_against() {
    let wit = std::fs::read_to_string(repo().join("wit/kv-store.wit")).unwrap();
    let version = wit
        .lines()
        .find_map(|line| line.strip_prefix("package kvwasm:kv-store@"))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("wit/kv-store.wit declares its package");
    let templates = repo().join("host/cli/templates");
    let mut imports = 0;
    for file in files(&templates) {
        let text = std::fs::read_to_string(templates.join(&file)).unwrap();
        for (at, _) in text.match_indices("kvwasm:kv-store/") {
            let import = &text[at..];
            let import = &import[..import
                .find(['\'', '"', ';', ' ', '\n'])
                .unwrap_or(import.len())];
            if let Some((_, imported)) = import.split_once('@') {
                imports += 1;
                assert_eq!(imported, version, "{}: {import}", file.display());
            }
        }
    }
    assert!(
        imports > 0,
        "no versioned import found: is the scan reading the templates?"
    );
}

#[test]
fn kvwasm_new_refuses_bad_names_and_non_empty_directories() {
    let scratch = tempfile::tempdir().unwrap();
    for bad in ["Acme", "acme_kv", "9acme", "acme-"] {
        let out = Command::new(KVWASM)
            .args(["new", "--lang", "rust", bad])
            .current_dir(scratch.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("cannot name a backend"));
    }
    std::fs::create_dir(scratch.path().join("taken")).unwrap();
    std::fs::write(scratch.path().join("taken/file"), b"mine").unwrap();
    let out = Command::new(KVWASM)
        .args(["new", "--lang", "rust", "taken"])
        .current_dir(scratch.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert_eq!(
        std::fs::read(scratch.path().join("taken/file")).unwrap(),
        b"mine"
    );
}

/// A finished `kvwasm check --json`.
struct Report {
    ok: bool,
    json: serde_json::Value,
}

impl Report {
    fn with(&self, verdict: &str) -> Vec<String> {
        self.json["report"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["verdict"] == verdict)
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn field(&self, check: &str, field: &str) -> String {
        self.json["report"]["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == check)
            .map(|r| r[field].as_str().unwrap().to_owned())
            .unwrap_or_default()
    }
}

/// `kvwasm check --component <project>/<name>.wasm --config
/// <project>/kvwasm.toml`, as the project's README says.
fn check(project: &Path, name: &str) -> Report {
    let shim = kvwasm_tests::shim_path();
    let out = Command::new(KVWASM)
        .args(["check", "--json", "--lib", shim.to_str().unwrap()])
        .args(["--component", &format!("{name}.wasm")])
        .args(["--config", "kvwasm.toml"])
        // The first check compiles the component; a JavaScript engine or
        // CPython takes minutes on a busy two-core machine.
        .args(["--timeout", "1800"])
        .current_dir(project)
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "kvwasm check printed no report ({e}): {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Report {
        ok: out.status.success(),
        json,
    }
}

/// A project `kvwasm new --lang <lang> --kind <kind> <name>` wrote in a
/// fresh temporary directory, outside this checkout.
fn new_project(lang: &str, kind: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let scratch = tempfile::Builder::new()
        .prefix("kvwasm-vendor-")
        .tempdir_in(std::env::temp_dir())
        .unwrap();
    assert!(!scratch.path().starts_with(repo().canonicalize().unwrap()));
    kvwasm(
        &["new", "--lang", lang, "--kind", kind, name],
        scratch.path(),
    );
    let project = scratch.path().join(name);
    (scratch, project)
}

/// `./build.sh` in `project`, which must succeed and write `<name>.wasm`.
/// `env`: where the build may keep its output between runs (never an edit
/// of the project).
fn build(project: &Path, name: &str, env: &[(&str, &Path)]) {
    let out = Command::new("./build.sh")
        .current_dir(project)
        // This test's own build settings are not the project's.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .envs(env.iter().map(|(k, v)| (*k, v.as_os_str())))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "build.sh failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(project.join(format!("{name}.wasm")).is_file());
}

/// `kvwasm bench --component kvwasm.toml --quick` in the project: a row of
/// figures for the project's backend next to builtin:memory's, every
/// figure a number (a smoke run: no timing is asserted).
fn bench_quick(project: &Path, name: &str) {
    let shim = kvwasm_tests::shim_path();
    let out = Command::new(KVWASM)
        .args(["bench", "--quick", "--shim", shim.to_str().unwrap()])
        .args(["--component", "kvwasm.toml"])
        .current_dir(project)
        .env_remove("KVWASM_CONFIG")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        table.contains(&format!(
            "| case | builtin:memory | {name} | {name} ÷ builtin:memory |"
        )),
        "{table}"
    );
    for case in [
        "component size",
        "first open, empty artifact cache",
        "first open in a process, warm artifact cache",
        "resident memory per instance",
        "put 4 KiB",
        "get 4 KiB",
        "put 1 MiB",
        "get 1 MiB",
    ] {
        let row = table
            .lines()
            .find(|l| l.starts_with(&format!("| {case}")))
            .unwrap_or_else(|| panic!("no row {case:?}: {table}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | case | memory | project | ratio |
        for cell in &cells[2..5] {
            let value = cell.trim_end_matches('×');
            assert!(value.parse::<f64>().is_ok(), "{case}: {cell:?} in {row}");
        }
    }
}

/// Replace `from` (which must occur exactly once) by `to` in the project's
/// `file`.
fn plant_bug(project: &Path, file: &str, from: &str, to: &str) {
    let path = project.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{file}: {from:?}");
    std::fs::write(&path, text.replace(from, to)).unwrap();
}

/// The generated project passes every MUST as written (a memory store
/// warns only that nothing outlives its last handle); with a duplicate
/// `put-chunk` answering `stored`, `put-chunk-idempotent` fails, quoting
/// its rule, and nothing else does.
fn passes_then_fails_with_the_bug(lang: &str, env: &[(&str, &Path)], bug: (&str, &str, &str)) {
    let name = format!("acme-{lang}");
    let (_scratch, project) = new_project(lang, "memory", &name);
    build(&project, &name, env);
    let report = check(&project, &name);
    assert!(report.with("fail").is_empty(), "{:#}", report.json);
    assert_eq!(
        report.with("warn"),
        ["durable-across-reopen"],
        "{:#}",
        report.json
    );
    assert!(report.ok);

    if lang == "c" {
        // Cheap to compile: also measured (a smoke run) as operators would.
        bench_quick(&project, &name);
    }

    let (file, from, to) = bug;
    plant_bug(&project, file, from, to);
    build(&project, &name, env);
    let report = check(&project, &name);
    assert_eq!(
        report.with("fail"),
        ["put-chunk-idempotent"],
        "{:#}",
        report.json
    );
    assert!(!report.ok);
    assert!(
        report
            .field("put-chunk-idempotent", "rule")
            .starts_with("put_chunk is idempotent on duplicate hashes"),
        "{:#}",
        report.json
    );
    assert!(
        report
            .field("put-chunk-idempotent", "detail")
            .contains("returned 0 instead of 1"),
        "{:#}",
        report.json
    );
}

#[test]
fn a_new_rust_project_builds_alone_passes_check_and_fails_it_with_a_bug() {
    // Its own target directory, kept between test runs: Cargo output only.
    let target = repo().join("target/vendor-new-rust");
    passes_then_fails_with_the_bug(
        "rust",
        &[("CARGO_TARGET_DIR", &target)],
        (
            "src/lib.rs",
            "return Ok(PutOutcome::AlreadyPresent);",
            "return Ok(PutOutcome::Stored);",
        ),
    );
}

#[test]
fn a_new_python_project_builds_alone_passes_check_and_fails_it_with_a_bug() {
    passes_then_fails_with_the_bug(
        "python",
        &[],
        (
            "store.py",
            "return api.PutOutcome.ALREADY_PRESENT",
            "return api.PutOutcome.STORED",
        ),
    );
}

#[test]
fn a_new_js_project_builds_alone_passes_check_and_fails_it_with_a_bug() {
    passes_then_fails_with_the_bug(
        "js",
        &[],
        ("store.js", "return 'already-present';", "return 'stored';"),
    );
}

#[test]
fn a_new_c_project_builds_alone_passes_check_and_fails_it_with_a_bug() {
    passes_then_fails_with_the_bug(
        "c",
        &[],
        (
            "store.c",
            "EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_ALREADY_PRESENT;",
            "EXPORTS_KVWASM_KV_STORE_STORE_PUT_OUTCOME_STORED;",
        ),
    );
}

/// A `--kind fs` project passes every check, durability included, with the
/// directory grant its `kvwasm.toml` names, as written; its files are in
/// that directory.
fn an_fs_project_passes_everything(lang: &str) {
    let name = format!("acme-{lang}-fs");
    let (_scratch, project) = new_project(lang, "fs", &name);
    build(&project, &name, &[]);
    let report = check(&project, &name);
    assert!(report.with("fail").is_empty(), "{:#}", report.json);
    assert!(report.with("warn").is_empty(), "{:#}", report.json);
    assert!(report.ok);
    let data = project.join("data");
    assert!(
        std::fs::read_dir(&data).unwrap().next().is_some(),
        "nothing written to {}",
        data.display()
    );
}

#[test]
fn a_new_c_fs_project_builds_alone_and_passes_check() {
    an_fs_project_passes_everything("c");
}

#[test]
fn a_new_python_fs_project_builds_alone_and_passes_check() {
    an_fs_project_passes_everything("python");
}

#[test]
fn a_new_js_fs_project_builds_alone_and_passes_check() {
    an_fs_project_passes_everything("js");
}
