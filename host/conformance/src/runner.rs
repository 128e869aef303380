//! The parent side: pick the checks, run each in a child process with a
//! deadline and glibc's malloc checker, and turn crashes and hangs into
//! failures of the check that caused them.

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::checks::{CHECKS, Check, GATES, OUTPUT_OWNERSHIP};
use crate::child::ChildReport;
use crate::report::{CheckResult, Report, Verdict};

/// The backend under test, as a consumer would reach it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The `libkv_store_<scheme>.so` to `dlopen`.
    pub lib: PathBuf,
    /// The URI passed to `open`.
    pub uri: String,
    /// Extra environment for the children (e.g. `KVWASM_CONFIG`).
    pub env: Vec<(OsString, OsString)>,
}

/// How to run the suite.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The executable a child re-enters, and the arguments that reach
    /// [`crate::child::run`] (the CLI: `kvwasm check`).
    pub exe: PathBuf,
    pub exe_args: Vec<OsString>,
    pub quick: bool,
    /// Run only these checks (empty: all).
    pub only: Vec<String>,
    pub skip: Vec<String>,
    /// Per-check deadline; a child still running then is killed.
    pub timeout: Duration,
}

impl Runner {
    /// The checks this run selects, in order; unknown names are an error.
    pub fn selected(&self) -> Result<Vec<&'static Check>, String> {
        for name in self.only.iter().chain(&self.skip) {
            if crate::find(name).is_none() {
                let all: Vec<_> = CHECKS.iter().map(|c| c.name).collect();
                return Err(format!(
                    "no check named {name:?}; checks: {}",
                    all.join(", ")
                ));
            }
        }
        Ok(CHECKS
            .iter()
            .filter(|c| !self.quick || c.quick)
            .filter(|c| self.only.is_empty() || self.only.iter().any(|n| n == c.name))
            .filter(|c| !self.skip.iter().any(|n| n == c.name))
            .collect())
    }

    /// Run the selected checks; `on_result` sees each result as it lands.
    pub fn run(
        &self,
        target: &Target,
        mut on_result: impl FnMut(&CheckResult),
    ) -> Result<Report, String> {
        let checks = self.selected()?;
        let run_id = run_id();
        let malloc_debug = malloc_debug_library();
        let mut gate_failed: Option<&str> = None;
        let mut leak_outputs = false;
        let mut results = Vec::new();
        for check in checks {
            let started = Instant::now();
            let (verdict, detail) = match gate_failed {
                Some(gate) => (Verdict::Skip, format!("not run: `{gate}` failed")),
                None => self.run_child(
                    target,
                    check,
                    &run_id,
                    leak_outputs,
                    malloc_debug.as_deref(),
                ),
            };
            if verdict == Verdict::Fail && GATES.contains(&check.name) {
                gate_failed = Some(check.name);
            }
            if verdict == Verdict::Fail && check.name == OUTPUT_OWNERSHIP {
                leak_outputs = true;
            }
            let result = CheckResult {
                name: check.name,
                level: check.level,
                rule: check.rule,
                verdict,
                detail,
                millis: started.elapsed().as_millis() as u64,
            };
            on_result(&result);
            results.push(result);
        }
        Ok(Report {
            lib: target.lib.display().to_string(),
            uri: target.uri.clone(),
            quick: self.quick,
            malloc_checker: malloc_debug.is_some(),
            results,
        })
    }

    fn run_child(
        &self,
        target: &Target,
        check: &Check,
        run_id: &str,
        leak_outputs: bool,
        malloc_debug: Option<&Path>,
    ) -> (Verdict, String) {
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.exe_args)
            .arg("--lib")
            .arg(&target.lib)
            .arg("--uri")
            .arg(&target.uri)
            .args(["--run-one", check.name, "--run-id", run_id])
            .envs(target.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.quick {
            cmd.arg("--quick");
        }
        if leak_outputs {
            cmd.arg("--leak-outputs");
        }
        if let Some(lib) = malloc_debug {
            // glibc's checking allocator: free() of a pointer malloc did not
            // hand out aborts instead of corrupting the heap silently.
            let mut preload = lib.as_os_str().to_owned();
            if let Some(existing) = std::env::var_os("LD_PRELOAD") {
                preload.push(" ");
                preload.push(existing);
            }
            cmd.env("LD_PRELOAD", preload)
                .env("GLIBC_TUNABLES", "glibc.malloc.check=3");
        }
        let run = match run_with_deadline(cmd, self.timeout) {
            Ok(run) => run,
            Err(e) => {
                return (
                    Verdict::Fail,
                    format!("cannot start the check process: {e}"),
                );
            }
        };
        judge(check, run, self.timeout)
    }
}

/// What a child left behind.
struct ChildRun {
    stdout: String,
    stderr: String,
    status: Option<std::process::ExitStatus>,
}

fn run_with_deadline(mut cmd: Command, timeout: Duration) -> std::io::Result<ChildRun> {
    let mut child = cmd.spawn()?;
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let out = pipe(child.stdout.take().map(|p| Box::new(p) as _));
    let err = pipe(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Ok(ChildRun {
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        status,
    })
}

fn judge(check: &Check, run: ChildRun, timeout: Duration) -> (Verdict, String) {
    let failed = |why: String| {
        let tail = stderr_tail(&run.stderr);
        let detail = if tail.is_empty() {
            why
        } else {
            format!("{why}; stderr: {tail}")
        };
        (Verdict::failure(check.level), detail)
    };
    let Some(status) = run.status else {
        return failed(format!("hung: killed after {} s", timeout.as_secs()));
    };
    let report = run
        .stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str::<ChildReport>(l).ok());
    match (report, signal_of(&status)) {
        (_, Some(sig)) => failed(format!("crashed the process: {}", signal_name(sig))),
        (Some(r), None) => match r.outcome.as_str() {
            "pass" => (Verdict::Pass, r.detail),
            "n/a" => (Verdict::Skip, r.detail),
            _ => failed(r.detail),
        },
        (None, None) => failed(format!(
            "the check process exited with {status} and no report"
        )),
    }
}

/// The last few meaningful lines of a child's stderr (the backend's log).
fn stderr_tail(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    let mut text = tail.join(" | ");
    if text.len() > 600 {
        let cut = (0..=600)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(unix)]
fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(status)
}

#[cfg(not(unix))]
fn signal_of(_: &std::process::ExitStatus) -> Option<i32> {
    None
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGSEGV => "SIGSEGV (invalid memory access)",
        libc::SIGABRT => "SIGABRT (aborted, e.g. by the allocator on a bad free)",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

/// glibc's malloc-debug library, next to the libc this process uses.
fn malloc_debug_library() -> Option<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let libc_path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|f| f.to_string_lossy().starts_with("libc.so"))
        })?;
    let candidate = Path::new(libc_path)
        .parent()?
        .join("libc_malloc_debug.so.0");
    candidate.is_file().then_some(candidate)
}

/// Short and unique enough that names and keys never collide across runs.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = format!("{nanos}-{}", std::process::id());
    blake3::hash(seed.as_bytes()).to_hex()[..12].to_owned()
}
