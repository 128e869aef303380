//! The user documentation against the code and against itself: the config
//! reference (docs/configuration.md) lists exactly the keys the config types
//! accept, and every relative link and anchor in README.md, CHANGELOG.md and
//! docs/ resolves. Markdown is read with pulldown-cmark, the parser mdbook
//! itself uses.

use std::collections::{BTreeMap, BTreeSet};
mod repo;

use repo::{repo_root, rust_files};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};
use serde::de::{self, DeserializeOwned, Visitor};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn parser(text: &str) -> Parser<'_> {
    Parser::new_ext(
        text,
        Options::ENABLE_TABLES | Options::ENABLE_FOOTNOTES | Options::ENABLE_STRIKETHROUGH,
    )
}

// ---------------------------------------------------------------------------
// The keys a serde type accepts, as serde itself reports them: a deserializer
// that records the field list `Deserialize` hands to `deserialize_struct`.

#[derive(Debug)]
struct FieldsRecorded;

impl std::fmt::Display for FieldsRecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields recorded")
    }
}

impl std::error::Error for FieldsRecorded {}

impl de::Error for FieldsRecorded {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        FieldsRecorded
    }
}

struct FieldRecorder<'a>(&'a mut Option<&'static [&'static str]>);

impl<'de> de::Deserializer<'de> for FieldRecorder<'_> {
    type Error = FieldsRecorded;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, FieldsRecorded> {
        Err(FieldsRecorded)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, FieldsRecorded> {
        *self.0 = Some(fields);
        Err(FieldsRecorded)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

/// The keys `T` accepts (the serialized names, renames applied).
fn keys_of<T: DeserializeOwned>() -> BTreeSet<String> {
    let mut fields = None;
    let _ = T::deserialize(FieldRecorder(&mut fields));
    let fields = fields.unwrap_or_else(|| panic!("{} is not a struct", std::any::type_name::<T>()));
    fields.iter().map(|f| f.to_string()).collect()
}

/// Every struct with `deny_unknown_fields` that a config file reaches, by the
/// heading of its table in docs/configuration.md.
fn config_tables() -> BTreeMap<&'static str, BTreeSet<String>> {
    use kvwasm_host::capabilities::dirs::DirConfig;
    use kvwasm_host::capabilities::tls::TlsTable;
    use kvwasm_host::config::{BackendConfig, Config};
    use kvwasm_host::limits::LimitsConfig;
    use kvwasm_host::tiering::advisor::LoopConfig;
    use kvwasm_serve::config::{NatsConfig, ServeConfig, WorkerConfig};
    BTreeMap::from([
        ("Top level", keys_of::<Config>()),
        ("[backends.NAME]", keys_of::<BackendConfig>()),
        ("[[backends.NAME.dirs]]", keys_of::<DirConfig>()),
        ("[backends.NAME.tls]", keys_of::<TlsTable>()),
        ("[backends.NAME.tenants.TENANT]", keys_of::<LimitsConfig>()),
        ("[backends.NAME.advisor_loop]", keys_of::<LoopConfig>()),
        ("[serve]", keys_of::<ServeConfig>()),
        ("[[serve.workers]]", keys_of::<WorkerConfig>()),
        ("[[serve.nats]]", keys_of::<NatsConfig>()),
    ])
}

/// The tables of a markdown page: for each, the text of the heading above
/// it and the code spans of its first column.
fn key_tables(text: &str) -> Vec<(String, Vec<String>)> {
    let mut tables = Vec::new();
    let mut heading: Option<String> = None;
    let mut last_heading = String::new();
    let mut in_table_body = false;
    let mut cell = 0usize;
    let mut keys: Vec<String> = Vec::new();
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => last_heading = heading.take().unwrap_or_default(),
            Event::Text(t) | Event::Code(t) if heading.is_some() => {
                heading.as_mut().unwrap().push_str(&t)
            }
            Event::Start(Tag::Table(_)) => keys.clear(),
            Event::End(TagEnd::TableHead) => in_table_body = true,
            Event::Start(Tag::TableRow) => cell = 0,
            Event::End(TagEnd::TableCell) => cell += 1,
            Event::Code(code) if in_table_body && cell == 0 => keys.push(code.to_string()),
            Event::End(TagEnd::Table) => {
                in_table_body = false;
                tables.push((last_heading.clone(), std::mem::take(&mut keys)));
            }
            _ => {}
        }
    }
    tables
}

#[test]
fn the_config_reference_lists_exactly_the_keys_the_config_types_accept() {
    let page = read(&repo_root().join("docs/configuration.md"));
    let mut expected = config_tables();
    let mut problems = Vec::new();
    for (heading, keys) in key_tables(&page) {
        if heading == "Environment variables" {
            continue;
        }
        let Some(accepted) = expected.remove(heading.as_str()) else {
            problems.push(format!(
                "a table under {heading:?} matches no config type (or is listed twice)"
            ));
            continue;
        };
        let documented: BTreeSet<String> = keys.iter().cloned().collect();
        assert_eq!(
            documented.len(),
            keys.len(),
            "{heading}: a key listed twice: {keys:?}"
        );
        for key in accepted.difference(&documented) {
            problems.push(format!("{heading}: `{key}` is accepted but not documented"));
        }
        for key in documented.difference(&accepted) {
            problems.push(format!("{heading}: `{key}` is documented but not accepted"));
        }
    }
    for heading in expected.keys() {
        problems.push(format!("no table of keys under the heading {heading:?}"));
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_field_recorder_sees_renamed_and_defaulted_fields() {
    // `base_dir` is a renamed field; LoopConfig is `#[serde(default)]`.
    use kvwasm_host::config::Config;
    use kvwasm_host::tiering::advisor::LoopConfig;
    assert!(keys_of::<Config>().contains("base_dir"));
    assert!(!keys_of::<Config>().contains("declared_base_dir"));
    assert!(keys_of::<LoopConfig>().contains("interval_ms"));
}

#[test]
fn a_misspelled_key_is_refused_at_every_level_of_the_file() {
    // What the reference promises: "Unknown keys are errors, in every table."
    let base = Path::new("/");
    let backend = kvwasm_host::config::Config::parse(
        "[backends.a]\ncomponent = \"builtin:fs\"\ndir = \"/tmp/x\"\ndirr = \"/tmp/y\"\n",
        base,
    );
    assert!(backend.unwrap_err().contains("dirr"));
    let tenant = kvwasm_host::config::Config::parse(
        "[backends.a]\ncomponent = \"builtin:fs\"\n[backends.a.tenants.t]\nmemory_limit = 1\n",
        base,
    );
    assert!(tenant.unwrap_err().contains("memory_limit"));
    let top = kvwasm_host::config::Config::parse("backend = 1\n", base);
    assert!(top.unwrap_err().contains("backend"));
}

/// The ```toml blocks of a page.
fn toml_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) if &*lang == "toml" => {
                current = Some(String::new())
            }
            Event::Text(t) if current.is_some() => current.as_mut().unwrap().push_str(&t),
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    blocks
}

#[test]
fn every_config_example_in_the_docs_is_accepted() {
    // An operator copies these: each must get past the parser and the checks
    // that need no files or servers (`Config::parse`), its `[serve]` table
    // included.
    let mut problems = Vec::new();
    let mut parsed = 0;
    for file in documents() {
        for block in toml_blocks(&read(&file)) {
            parsed += 1;
            let result =
                kvwasm_host::config::Config::parse(&block, Path::new("/")).and_then(|config| {
                    match config.serve {
                        Some(serve) => serve
                            .try_into::<kvwasm_serve::config::ServeConfig>()
                            .map(drop)
                            .map_err(|e| format!("[serve]: {e}")),
                        None => Ok(()),
                    }
                });
            if let Err(e) = result {
                problems.push(format!("{}: {e}\n{block}", file.display()));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "config examples refused:\n{}",
        problems.join("\n\n")
    );
    assert!(parsed > 5, "only {parsed} config examples found");
}

// ---------------------------------------------------------------------------
// Links and anchors.

/// The markdown files of the guide and the repository's front pages.
fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The anchor mdbook gives a heading (and GitHub, for these headings):
/// lower case, letters, digits, `_` and `-` kept, spaces made `-`, the rest
/// dropped; a repeated anchor gets `-1`, `-2`...
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in parser(text) {
        match event {
            Event::Start(Tag::Heading { id, .. }) => {
                if let Some(id) = id {
                    anchors.insert(id.to_string());
                }
                heading = Some(String::new());
            }
            Event::Text(t) | Event::Code(t) if heading.is_some() => {
                heading.as_mut().unwrap().push_str(&t)
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                let base: String = text
                    .trim()
                    .chars()
                    .filter_map(|c| {
                        if c.is_alphanumeric() || c == '_' || c == '-' {
                            Some(c.to_lowercase().next().unwrap_or(c))
                        } else if c.is_whitespace() {
                            Some('-')
                        } else {
                            None
                        }
                    })
                    .collect();
                let n = seen.entry(base.clone()).or_insert(0);
                anchors.insert(if *n == 0 {
                    base.clone()
                } else {
                    format!("{base}-{n}")
                });
                *n += 1;
            }
            _ => {}
        }
    }
    anchors
}

/// Every link and image target of a page.
fn links(text: &str) -> Vec<String> {
    parser(text)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.to_string()),
            _ => None,
        })
        .collect()
}

/// `path` with `.` and `..` taken away, or `None` if it leaves the root.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = repo_root();
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in documents() {
        let text = read(&file);
        let relative_file = file.strip_prefix(&root).unwrap().to_owned();
        let here = relative_file.parent().unwrap_or(Path::new(""));
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match link.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if path.is_empty() {
                Some(relative_file.clone())
            } else {
                normalized(&here.join(path))
            };
            let Some(target) = target else {
                problems.push(format!(
                    "{}: {link}: outside the repository",
                    relative_file.display()
                ));
                continue;
            };
            if !root.join(&target).exists() {
                problems.push(format!("{}: {link}: no such file", relative_file.display()));
                continue;
            }
            if let Some(anchor) = anchor
                && target.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&root.join(&target))).contains(anchor)
            {
                problems.push(format!(
                    "{}: {link}: no heading with anchor #{anchor} in {}",
                    relative_file.display(),
                    target.display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
    assert!(
        checked > 100,
        "only {checked} links found: is the parser reading the files?"
    );
}

#[test]
fn the_link_checker_finds_broken_links_and_anchors() {
    let page =
        "# A title\n\n## Second `part`\n\n[ok](#second-part) [bad](#nowhere) ![img](x.svg)\n";
    assert_eq!(links(page), ["#second-part", "#nowhere", "x.svg"]);
    let found = anchors(page);
    assert!(found.contains("a-title") && found.contains("second-part"));
    assert!(!found.contains("nowhere"));
    assert_eq!(normalized(Path::new("docs/../../x")), None);
    assert_eq!(
        normalized(Path::new("docs/./a/../b.md")),
        Some(PathBuf::from("docs/b.md"))
    );
    let repeated = anchors("# Measured\n\n## Measured\n");
    assert!(repeated.contains("measured") && repeated.contains("measured-1"));
}

#[test]
fn every_page_of_the_guide_is_in_its_summary() {
    // mdbook renders only what docs/SUMMARY.md lists: a page left out would
    // be in the repository but not in the guide.
    let root = repo_root();
    let summary = read(&root.join("docs/SUMMARY.md"));
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|l| PathBuf::from("docs").join(l.split('#').next().unwrap_or_default()))
        .collect();
    for file in documents() {
        let relative = file.strip_prefix(&root).unwrap().to_owned();
        if relative.starts_with("docs") && relative != Path::new("docs/SUMMARY.md") {
            assert!(
                listed.contains(&relative),
                "{} is not in docs/SUMMARY.md",
                relative.display()
            );
        }
    }
}

#[test]
fn every_test_the_docs_name_exists() {
    // docs/testing.md and docs/security.md name the test behind each claim as
    // `file.rs::function` (the file by its path, or by its name alone where
    // that is unambiguous): a renamed or deleted test must not leave a claim
    // pointing at nothing.
    let root = repo_root();
    let mut sources = Vec::new();
    rust_files(&root, &mut sources);
    let mut problems = Vec::new();
    let mut named = 0;
    for file in documents() {
        let text = read(&file);
        for event in parser(&text) {
            let Event::Code(code) = event else { continue };
            let Some((path, function)) = code.split_once("::") else {
                continue;
            };
            if !path.ends_with(".rs")
                || function.is_empty()
                || !function
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            named += 1;
            let candidates: Vec<&PathBuf> = sources
                .iter()
                .filter(|s| s.strip_prefix(&root).is_ok_and(|r| r.ends_with(path)))
                .collect();
            let defined = candidates
                .iter()
                .any(|c| read(c).contains(&format!("fn {function}(")));
            if !defined {
                problems.push(format!(
                    "{}: `{code}`: no such function in {} file(s) named {path}",
                    file.strip_prefix(&root).unwrap().display(),
                    candidates.len()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "tests named in the docs:\n{}",
        problems.join("\n")
    );
    assert!(
        named > 100,
        "only {named} tests named: is the parser reading the files?"
    );
}

#[test]
fn the_readme_stays_short() {
    let lines = read(&repo_root().join("README.md")).lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines: move detail into docs/ (the guide)"
    );
}
