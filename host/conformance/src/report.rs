//! Results: a readable table for people, JSON for CI.

use std::fmt::Write as _;

use crate::Level;

/// A check's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    /// A MUST was broken.
    Fail,
    /// A SHOULD was broken.
    Warn,
    /// Not applicable, or not run because a gate failed.
    Skip,
}

impl Verdict {
    /// The verdict for a broken rule of this level.
    pub fn failure(level: Level) -> Verdict {
        match level {
            Level::Must => Verdict::Fail,
            Level::Should => Verdict::Warn,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Warn => "warn",
            Verdict::Skip => "skip",
        }
    }
}

/// One row of the report.
#[derive(Debug, serde::Serialize)]
pub struct CheckResult {
    pub name: &'static str,
    pub level: Level,
    pub verdict: Verdict,
    pub rule: &'static str,
    pub detail: String,
    pub millis: u64,
}

/// A whole run.
#[derive(Debug, serde::Serialize)]
pub struct Report {
    pub lib: String,
    pub uri: String,
    pub quick: bool,
    /// Whether the children ran under glibc's malloc checker.
    pub malloc_checker: bool,
    pub results: Vec<CheckResult>,
}

impl Report {
    /// How many results have this verdict.
    pub fn count(&self, verdict: Verdict) -> usize {
        self.results.iter().filter(|r| r.verdict == verdict).count()
    }

    /// True when no MUST failed.
    pub fn ok(&self) -> bool {
        self.count(Verdict::Fail) == 0
    }

    /// Names of the checks with this verdict.
    pub fn names(&self, verdict: Verdict) -> Vec<&'static str> {
        self.results
            .iter()
            .filter(|r| r.verdict == verdict)
            .map(|r| r.name)
            .collect()
    }

    /// `passed, failed, warnings, skipped` in one line.
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed (MUST), {} warnings (SHOULD), {} skipped",
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.count(Verdict::Warn),
            self.count(Verdict::Skip)
        )
    }

    /// The whole report as JSON, with `ok` and the summary counts.
    pub fn to_json(&self) -> String {
        let value = serde_json::json!({
            "ok": self.ok(),
            "summary": {
                "passed": self.count(Verdict::Pass),
                "failed": self.count(Verdict::Fail),
                "warnings": self.count(Verdict::Warn),
                "skipped": self.count(Verdict::Skip),
            },
            "report": self,
        });
        serde_json::to_string_pretty(&value).expect("a report serialises")
    }
}

/// Column header of the table.
pub fn table_header() -> String {
    format!(
        "{:<24} {:<6} {:<6} {:>7}  RULE / DETAIL",
        "CHECK", "RESULT", "LEVEL", "TIME"
    )
}

/// One check as table rows: name, result, level, time, then the rule and
/// the detail, each wrapped under the last column.
pub fn table_row(r: &CheckResult) -> String {
    const INDENT: usize = 50;
    let mut out = format!(
        "{:<24} {:<6} {:<6} {:>5}ms  ",
        r.name,
        r.verdict.label(),
        r.level.to_string(),
        r.millis
    );
    let mut first = true;
    for (prefix, text) in [("rule: ", r.rule), ("→ ", r.detail.as_str())] {
        for line in wrap(&format!("{prefix}{text}"), 100 - INDENT) {
            if !first {
                let _ = write!(out, "\n{:INDENT$}", "");
            }
            out.push_str(&line);
            first = false;
        }
    }
    out
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let line = lines.last_mut().expect("non-empty");
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(word.to_owned());
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(word);
        }
    }
    lines
}
