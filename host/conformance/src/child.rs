//! The child side: run one check against a freshly loaded backend and print
//! its finding as one JSON line on stdout.

use std::path::PathBuf;

use kv_store_abi::Library;

use crate::checks;
use crate::ctx::{Ctx, Finding};

/// What the runner passes to a child (see [`crate::Runner`]).
#[derive(Debug)]
pub struct ChildArgs {
    pub lib: PathBuf,
    pub uri: String,
    pub check: String,
    pub run_id: String,
    pub quick: bool,
    pub leak_outputs: bool,
}

/// The line a child prints.
#[derive(serde::Serialize, serde::Deserialize, Debug)]
pub struct ChildReport {
    /// `pass`, `violated` or `n/a`.
    pub outcome: String,
    pub detail: String,
}

/// Run the check and print its report; the exit status is 0 whenever a
/// report was printed (a crash or hang is judged by the parent).
pub fn run(args: &ChildArgs) -> std::process::ExitCode {
    let report = match evaluate(args) {
        Ok(detail) => ChildReport {
            outcome: "pass".into(),
            detail,
        },
        Err(Finding::Violated(detail)) => ChildReport {
            outcome: "violated".into(),
            detail,
        },
        Err(Finding::NotApplicable(detail)) => ChildReport {
            outcome: "n/a".into(),
            detail,
        },
    };
    println!(
        "{}",
        serde_json::to_string(&report).expect("a report serialises")
    );
    std::process::ExitCode::SUCCESS
}

fn evaluate(args: &ChildArgs) -> Result<String, Finding> {
    let check = checks::find(&args.check)
        .ok_or_else(|| Finding::NotApplicable(format!("no check named {:?}", args.check)))?;
    let lib = Library::open(args.lib.as_os_str()).map_err(|e| Finding::Violated(e.to_string()))?;
    let ctx = Ctx {
        lib: &lib,
        lib_path: &args.lib,
        uri: &args.uri,
        run_id: &args.run_id,
        check: check.name,
        quick: args.quick,
        leak_outputs: args.leak_outputs,
    };
    (check.run)(&ctx)
}
