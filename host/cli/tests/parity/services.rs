//! The two indexers under comparison, as processes on loopback: Dynamo's
//! own standalone indexer (dynamo-kv-router 1.6.1, built by
//! `scripts/dynamo-oracle.sh`) and `kvwasm serve` with `builtin:kv-indexer`.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

const KVWASM: &str = env!("CARGO_BIN_EXE_kvwasm");

/// Where `scripts/dynamo-oracle.sh` puts Dynamo's indexer: `$KVWASM_DYNAMO_ORACLE`
/// (scripts/test.sh sets it to the script's answer), else the tool cache.
pub fn oracle_binary() -> PathBuf {
    let path = match std::env::var_os("KVWASM_DYNAMO_ORACLE") {
        Some(path) => PathBuf::from(path),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache")
                });
            cache.join("kvwasm-tools/dynamo-kv-indexer-1.6.1/bin/dynamo-kv-indexer")
        }
    };
    assert!(
        path.is_file(),
        "Dynamo's standalone indexer (the oracle of these tests) is not at {}: \
         run `bash scripts/dynamo-oracle.sh` (it builds dynamo-kv-router 1.6.1 once \
         into the tool cache and prints the path; set KVWASM_DYNAMO_ORACLE to it)",
        path.display()
    );
    path
}

/// Which indexer a [`Service`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dynamo,
    Kvwasm,
}

/// An indexer process on 127.0.0.1, killed (SIGKILL) on drop.
pub struct Service {
    pub kind: Kind,
    pub name: String,
    pub url: String,
    child: Child,
    dir: tempfile::TempDir,
}

impl Service {
    /// Dynamo's indexer, recovering from `peers`' `/dump` first if any.
    pub fn dynamo(name: &str, peers: &[&str]) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(oracle_binary());
        command.args(["--port", "0"]);
        if !peers.is_empty() {
            command.arg("--peers").arg(peers.join(","));
        }
        Service::spawn(Kind::Dynamo, name, command, dir, |line| {
            let port: u16 = line
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("Dynamo's indexer printed {line:?}, not its port"));
            format!("http://127.0.0.1:{port}")
        })
    }

    /// `kvwasm serve` with `builtin:kv-indexer`; `serve_extra` is appended
    /// to its `[serve]` table (more keys, then `[[serve.…]]` tables).
    pub fn kvwasm(name: &str, serve_extra: &str) -> Service {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("kvwasm.toml");
        std::fs::write(
            &config,
            format!(
                "[subscribers.idx]\ncomponent = \"builtin:kv-indexer\"\n\
                 [serve]\nindexer = \"idx\"\n{serve_extra}"
            ),
        )
        .unwrap();
        let mut command = Command::new(KVWASM);
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .env_remove("KVWASM_CONFIG");
        Service::spawn(Kind::Kvwasm, name, command, dir, |line| {
            line.trim()
                .strip_prefix("listening on ")
                .unwrap_or_else(|| panic!("kvwasm serve printed {line:?} first"))
                .to_owned()
        })
    }

    /// Start `command` with its stderr in `dir/stderr.log` and read its
    /// first stdout line (printed once it listens) into a URL.
    fn spawn(
        kind: Kind,
        name: &str,
        mut command: Command,
        dir: tempfile::TempDir,
        url_of: impl FnOnce(&str) -> String,
    ) -> Service {
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut service = Service {
            kind,
            name: name.to_owned(),
            url: String::new(),
            child,
            dir,
        };
        if line.is_empty() {
            panic!("{name} exited before listening; stderr:\n{}", service.log());
        }
        service.url = url_of(&line);
        service
    }

    /// What the process wrote on stderr so far (its last 4 KiB).
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default();
        let start = text.len().saturating_sub(4096);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    /// One HTTP call with a JSON body (none for GET); the status and the
    /// body as JSON (`Value::String` if it is not JSON, `Null` if empty).
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let client = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap();
        let mut request = client.request(
            reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{path}", self.url),
        );
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().unwrap_or_else(|e| {
            panic!(
                "{} {method} {path}: {e}; stderr:\n{}",
                self.name,
                self.log()
            )
        });
        let status = response.status().as_u16();
        let bytes = response.bytes().unwrap();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    /// A call that must answer `expected`.
    pub fn expect(&self, expected: u16, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, answer) = self.call(method, path, body);
        assert_eq!(
            status, expected,
            "{} {method} {path} {body:?}: {answer}",
            self.name
        );
        answer
    }

    /// The value of one sample of `/metrics` (kvwasm only), 0 if absent.
    pub fn metric(&self, sample: &str) -> u64 {
        let (status, text) = self.call("GET", "/metrics", None);
        assert_eq!(status, 200, "{text}");
        let Value::String(text) = text else {
            panic!("/metrics is not text: {text}")
        };
        text.lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' '))
            .map_or(0, |value| value.trim().parse().unwrap())
    }

    /// kvwasm's per-source and per-guest counters (for failure messages;
    /// empty for Dynamo).
    pub fn source_counters(&self) -> String {
        if self.kind != Kind::Kvwasm {
            return String::new();
        }
        match self.call("GET", "/metrics", None) {
            (200, Value::String(text)) => text
                .lines()
                .filter(|l| {
                    (l.starts_with("kvwasm_source_") || l.starts_with("kvwasm_serve_"))
                        && !l.ends_with(" 0")
                })
                .map(|l| format!("\n{l}"))
                .collect(),
            (status, answer) => format!("\n/metrics: {status} {answer}"),
        }
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
