//! The shape of the Rust sources (docs/architecture.md, "Module cycles"):
//! no crate's modules import each other in a cycle, and no source file
//! grows past what one reads in a sitting.

mod repo;

use repo::{repo_root, rust_files};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Longest non-test source file, in lines.
const MAX_LINES: usize = 800;

/// The source directory of every Rust crate of the repository: the host
/// workspace's (host/*, the shim, the test support crate) and the guests'.
fn crate_sources() -> Vec<PathBuf> {
    let root = repo_root();
    let mut sources = vec![root.join("shim-cdylib/src"), root.join("tests/src")];
    for group in ["host", "guest-backends"] {
        let entries =
            std::fs::read_dir(root.join(group)).unwrap_or_else(|e| panic!("read {group}/: {e}"));
        for entry in entries {
            let src = entry.unwrap().path().join("src");
            if src.is_dir() {
                sources.push(src);
            }
        }
    }
    sources.sort();
    sources
}

/// `scripts/module-cycles.py` on `src`: its exit status and what it printed.
fn module_cycles(src: &Path) -> (bool, String) {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/module-cycles.py"))
        .arg(src)
        .output()
        .unwrap_or_else(|e| panic!("run python3 scripts/module-cycles.py: {e}"));
    let printed =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), printed)
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let sources = crate_sources();
    assert!(sources.len() > 20, "crates found: {sources:?}");
    let cycles: Vec<String> = sources
        .iter()
        .filter_map(|src| match module_cycles(src) {
            (true, _) => None,
            (false, printed) => Some(format!("{}:\n{printed}", src.display())),
        })
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between modules (docs/architecture.md, \"Module cycles\"):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let src = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(src.path().join(name), text).unwrap();
    write("lib.rs", "mod a;\nmod b;\nmod c;\n");
    write("a.rs", "use crate::b::B;\npub struct A;\n");
    write("b.rs", "pub struct B(pub super::a::A);\n");
    write("c.rs", "use crate::a::A;\n");
    let (clean, printed) = module_cycles(src.path());
    assert!(!clean, "{printed}");
    assert!(printed.contains("cycle: a, b\n"), "{printed}");

    write("b.rs", "pub struct B;\n");
    let (clean, printed) = module_cycles(src.path());
    assert!(clean, "{printed}");
}

/// Test code: a file under a `tests` directory (integration tests, the test
/// support crate, the test guests) or a `tests.rs` (a module's unit tests).
fn is_test_code(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n == "tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
}

#[test]
fn no_source_file_is_longer_than_800_lines() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in ["host", "shim-cdylib", "guest-backends", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "source files found: {}", files.len());
    let long: Vec<String> = files
        .iter()
        .map(|path| (path.strip_prefix(&root).unwrap(), path))
        .filter(|(relative, _)| !is_test_code(relative))
        .filter_map(|(relative, path)| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", relative.display()))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines: split them by concept, or move their \
         unit tests to a sibling tests.rs:\n{}",
        long.join("\n")
    );
}
