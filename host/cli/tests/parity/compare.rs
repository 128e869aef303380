//! Every answer of kvwasm compared with Dynamo's after normalising key order
//! (JSON objects are compared as maps) and, for `/dump`, the order and the
//! grouping of its events; the ground truth says which side is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::publisher::Publisher;
use super::services::{Kind, Service};
use super::stream::World;

/// The longest the barrier waits for both indexers to apply a stream: only
/// reached when something is stuck.
const PATIENCE: Duration = Duration::from_secs(120);

/// Fields kvwasm adds to Dynamo's answers, each a documented extension
/// (docs/events.md, "Differences from Dynamo 1.6.1"); they are taken out of
/// kvwasm's answers before comparing. A Dynamo client ignores unknown fields.
pub const KVWASM_EXTENSIONS: &[(&str, &str)] = &[(
    "tree_sizes",
    "kvwasm's extension: blocks per instance and rank in the tree",
)];

/// One stored block of a normalised `/dump`: who holds it, its parent and
/// its hashes, and whatever else its event carried (canonical JSON).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DumpBlock {
    pub worker: u64,
    pub rank: u64,
    pub parent: Option<u64>,
    pub hash: u64,
    pub local: u64,
    pub extra: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpKey {
    pub block_size: u64,
    pub blocks: BTreeSet<DumpBlock>,
}

/// A JSON integer as u64, signed ones bit-cast (both forms are Dynamo's).
fn bits(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| value.as_i64().map(|v| v as u64))
}

/// A `/dump` as a set of blocks per key: each stored event split into its
/// blocks (the first one's parent is the event's, the others' the block
/// before), so that neither the order of the events nor how a tree merges
/// a chain into one event matters; event ids are left out (each side
/// numbers its own). Keys holding no block are left out, as an empty tree
/// answers like no tree at all.
pub fn normalise_dump(dump: &Value, keys: &[String]) -> BTreeMap<String, DumpKey> {
    let mut out = BTreeMap::new();
    let Some(entries) = dump.as_object() else {
        panic!("a /dump is a JSON object: {dump}")
    };
    for (key, entry) in entries {
        if !keys.iter().any(|k| key.starts_with(&format!("{k}:"))) {
            continue;
        }
        let mut normalised = DumpKey {
            block_size: entry["block_size"]
                .as_u64()
                .unwrap_or_else(|| panic!("{entry}")),
            blocks: BTreeSet::new(),
        };
        for event in entry["events"]
            .as_array()
            .unwrap_or_else(|| panic!("{entry}"))
        {
            let worker = bits(&event["worker_id"]).unwrap_or_else(|| panic!("{event}"));
            let inner = &event["event"];
            let rank = inner.get("dp_rank").and_then(bits).unwrap_or(0);
            let stored = &inner["data"]["stored"];
            let Some(blocks) = stored["blocks"].as_array() else {
                panic!("a /dump event that is not a store: {event}")
            };
            let mut extra: BTreeMap<String, Value> = BTreeMap::new();
            for (k, v) in stored.as_object().unwrap() {
                if k != "blocks" && k != "parent_hash" && !v.is_null() {
                    extra.insert(format!("stored.{k}"), v.clone());
                }
            }
            for (k, v) in inner.as_object().unwrap() {
                if !["event_id", "dp_rank", "data"].contains(&k.as_str()) && !v.is_null() {
                    extra.insert(format!("event.{k}"), v.clone());
                }
            }
            let extra = if extra.is_empty() {
                String::new()
            } else {
                json!(extra).to_string()
            };
            let mut parent = bits(&stored["parent_hash"]);
            for block in blocks {
                let hash = bits(&block["block_hash"]).unwrap_or_else(|| panic!("{event}"));
                normalised.blocks.insert(DumpBlock {
                    worker,
                    rank,
                    parent,
                    hash,
                    local: bits(&block["tokens_hash"]).unwrap_or_else(|| panic!("{event}")),
                    extra: extra.clone(),
                });
                parent = Some(hash);
            }
        }
        if !normalised.blocks.is_empty() {
            out.insert(key.clone(), normalised);
        }
    }
    out
}

/// kvwasm's answer without its named extensions ([`KVWASM_EXTENSIONS`]).
fn without_extensions(kind: Kind, answer: &Value) -> Value {
    let mut answer = answer.clone();
    if kind == Kind::Kvwasm
        && let Some(fields) = answer.as_object_mut()
    {
        for (field, _) in KVWASM_EXTENSIONS {
            fields.remove(*field);
        }
    }
    answer
}

/// The mismatches found so far, with how many answers were compared.
#[derive(Default)]
pub struct Report {
    pub compared: usize,
    pub mismatches: Vec<String>,
}

impl Report {
    /// Fail with every mismatch (the first 20 in full).
    pub fn assert_clean(&self, what: &str) {
        assert!(self.compared > 0, "{what}: nothing was compared");
        if self.mismatches.is_empty() {
            return;
        }
        let shown: Vec<&String> = self.mismatches.iter().take(20).collect();
        panic!(
            "{what}: {} of {} answers differ:\n{}",
            self.mismatches.len(),
            self.compared,
            shown
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join("\n\n")
        );
    }
}

/// Which side the truth says is wrong, for a failure message.
fn verdict(
    reference: &Service,
    subject: &Service,
    reference_right: bool,
    subject_right: bool,
) -> String {
    match (reference_right, subject_right) {
        (true, false) => format!(
            "{} is wrong (the ground truth agrees with {})",
            subject.name, reference.name
        ),
        (false, true) => format!(
            "{} is wrong (the ground truth agrees with {})",
            reference.name, subject.name
        ),
        (false, false) => "both are wrong".to_owned(),
        (true, true) => "both give the true scores; they differ in other fields".to_owned(),
    }
}

/// Ask `reference` (Dynamo) and each of `subjects` every `/query` and
/// `/query_by_hash` about `world`'s prompts (whole, cut to a prefix, with
/// a partial block more, and an empty adapter name sent both ways), and
/// `/dump`; record every difference, and every answer whose scores are
/// not the truth's.
pub fn compare_all(world: &World, reference: &Service, subjects: &[&Service], report: &mut Report) {
    for (path, body, truth) in queries(world) {
        compare_one(reference, subjects, path, &body, &truth, report);
    }
    compare_dumps(world, reference, subjects, report);
}

/// Ask each of `subjects` every query of [`compare_all`] and `/dump`, and
/// record every answer that is not the truth's (where no indexer can be
/// the reference).
pub fn compare_with_truth(world: &World, subjects: &[&Service], report: &mut Report) {
    for (path, body, truth) in queries(world) {
        for subject in subjects {
            report.compared += 1;
            let (status, answer) = subject.call("POST", path, Some(&body));
            if status != 200 || answer["scores"] != truth {
                report.mismatches.push(format!(
                    "POST {path} {body}\n  {}: {status} {answer}\n  ground truth scores: {truth}",
                    subject.name
                ));
            }
        }
    }
    let keys = world.model_names();
    let truth = world.dump();
    for subject in subjects {
        report.compared += 1;
        let dump = normalise_dump(&subject.expect(200, "GET", "/dump", None), &keys);
        if dump != truth {
            report.mismatches.push(format!(
                "GET /dump: {}",
                describe_dump_difference(&truth, &[(subject, &dump)])
            ));
        }
    }
}

/// Every query about `world`'s prompts (whole, cut to a prefix, with a
/// partial block more, an empty adapter name sent both ways, and by
/// hash), with the scores the truth gives it.
fn queries(world: &World) -> Vec<(&'static str, Value, Value)> {
    let mut queries = Vec::new();
    for (p, prompt) in world.prompts.iter().enumerate() {
        let model = &world.models[prompt.model];
        let size = model.block_size as usize;
        let blocks = prompt.blocks();
        let mut cuts = vec![blocks];
        if blocks > 1 {
            cuts.push(blocks / 2);
        }
        for cut in cuts {
            let truth = world.scores(p, cut);
            // A partial tail block: hashed by neither side.
            let tail = prompt.tokens.get(cut * size).copied().into_iter();
            let tokens: Vec<u32> = prompt.tokens[..cut * size]
                .iter()
                .copied()
                .chain(tail)
                .collect();
            let mut bodies = vec![json!({"token_ids": tokens, "model_name": model.name,
                                         "lora_name": prompt.lora_name})];
            // An empty adapter name is no adapter: the other spelling too.
            match prompt.lora_name.as_deref() {
                Some("") => bodies.push(json!({"token_ids": tokens, "model_name": model.name})),
                None => bodies.push(json!({"token_ids": tokens, "model_name": model.name,
                                           "lora_name": ""})),
                Some(_) => {}
            }
            for body in bodies {
                queries.push(("/query", body, truth.clone()));
            }
            let local: Vec<i64> = prompt.local[..cut].iter().map(|&h| h as i64).collect();
            queries.push((
                "/query_by_hash",
                json!({"block_hashes": local, "model_name": model.name}),
                truth,
            ));
        }
    }
    queries
}

fn compare_one(
    reference: &Service,
    subjects: &[&Service],
    path: &str,
    body: &Value,
    truth: &Value,
    report: &mut Report,
) {
    let (reference_status, reference_answer) = reference.call("POST", path, Some(body));
    let reference_answer = without_extensions(reference.kind, &reference_answer);
    let reference_right = reference_status == 200 && &reference_answer["scores"] == truth;
    for subject in subjects {
        report.compared += 1;
        let (status, answer) = subject.call("POST", path, Some(body));
        let answer = without_extensions(subject.kind, &answer);
        let subject_right = status == 200 && &answer["scores"] == truth;
        if (status, &answer) != (reference_status, &reference_answer) || !subject_right {
            report.mismatches.push(format!(
                "POST {path} {body}\n  {}: {status} {answer}\n  {}: {reference_status} {reference_answer}\n  \
                 ground truth scores: {truth}\n  => {}",
                subject.name,
                reference.name,
                verdict(reference, subject, reference_right, subject_right)
            ));
        }
    }
}

/// `dump` with each block's engine hash (and its parent's) replaced by its
/// local hash: what Dynamo 1.6.1's `/dump` can be compared on when engines
/// hash the same content differently, as it keeps one engine hash per tree
/// node, the first worker's (docs/events.md, "Differences from Dynamo
/// 1.6.1": `/dump` engine hashes).
fn without_engine_hashes(
    world: &World,
    dump: &BTreeMap<String, DumpKey>,
) -> BTreeMap<String, DumpKey> {
    let local = |hash: u64| world.local_of(hash).unwrap_or(hash);
    dump.iter()
        .map(|(key, entry)| {
            let blocks = entry
                .blocks
                .iter()
                .map(|b| DumpBlock {
                    hash: local(b.hash),
                    parent: b.parent.map(local),
                    ..b.clone()
                })
                .collect();
            let entry = DumpKey {
                block_size: entry.block_size,
                blocks,
            };
            (key.clone(), entry)
        })
        .collect()
}

fn compare_dumps(world: &World, reference: &Service, subjects: &[&Service], report: &mut Report) {
    let keys = world.model_names();
    let truth = world.dump();
    let reference_dump = normalise_dump(&reference.expect(200, "GET", "/dump", None), &keys);
    // The named difference: with mixed engine hashing Dynamo's dump holds
    // one engine hash per block; kvwasm's must still be the truth.
    let comparable = |service: &Service, dump: &BTreeMap<String, DumpKey>| {
        if world.mixed_hashing() && service.kind == Kind::Dynamo {
            without_engine_hashes(world, dump)
        } else {
            dump.clone()
        }
    };
    for subject in subjects {
        report.compared += 1;
        let dump = normalise_dump(&subject.expect(200, "GET", "/dump", None), &keys);
        let matches_reference = if world.mixed_hashing() && reference.kind != subject.kind {
            without_engine_hashes(world, &dump) == without_engine_hashes(world, &reference_dump)
        } else {
            dump == reference_dump
        };
        let true_dump = comparable(subject, &dump) == comparable(subject, &truth);
        if !matches_reference || !true_dump {
            let reference_right =
                comparable(reference, &reference_dump) == comparable(reference, &truth);
            report.mismatches.push(format!(
                "GET /dump: {}\n  => {}",
                describe_dump_difference(&truth, &[(reference, &reference_dump), (subject, &dump)]),
                verdict(reference, subject, reference_right, true_dump)
            ));
        }
    }
}

/// Per key, the blocks each side has that the truth lacks and the other
/// way round.
fn describe_dump_difference(
    truth: &BTreeMap<String, DumpKey>,
    sides: &[(&Service, &BTreeMap<String, DumpKey>)],
) -> String {
    let mut out = String::new();
    let empty = DumpKey {
        block_size: 0,
        blocks: BTreeSet::new(),
    };
    for (service, dump) in sides {
        let keys: BTreeSet<&String> = truth.keys().chain(dump.keys()).collect();
        for key in keys {
            let want = truth.get(key).unwrap_or(&empty);
            let got = dump.get(key).unwrap_or(&empty);
            if want == got {
                continue;
            }
            let extra: Vec<&DumpBlock> = got.blocks.difference(&want.blocks).take(5).collect();
            let missing: Vec<&DumpBlock> = want.blocks.difference(&got.blocks).take(5).collect();
            out.push_str(&format!(
                "\n  {} {key}: block size {} (truth {}), {} blocks (truth {}); \
                 not in the truth: {} e.g. {extra:?}; missing: {} e.g. {missing:?}",
                service.name,
                got.block_size,
                want.block_size,
                got.blocks.len(),
                want.blocks.len(),
                got.blocks.difference(&want.blocks).count(),
                want.blocks.difference(&got.blocks).count(),
            ));
        }
    }
    if out.is_empty() {
        out.push_str("\n  (both equal the truth)");
    }
    out
}

/// Wait until every service has applied every stream up to its marker
/// (`markers`: (instance, rank, marker prompt)), nudging the publishers
/// so that an indexer that subscribed after the last message asks for the
/// replay. After [`PATIENCE`], `Err` with what each service answers.
pub fn settle(
    world: &World,
    services: &[&Service],
    publishers: &[&Publisher],
    markers: &[(u64, u32, usize)],
) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let mut waiting = Vec::new();
        for service in services {
            for &(instance, rank, p) in markers {
                let prompt = &world.prompts[p];
                let model = &world.models[prompt.model];
                let (status, answer) = service.call(
                    "POST",
                    "/query",
                    Some(&json!({"token_ids": prompt.tokens, "model_name": model.name})),
                );
                let score = &answer["scores"][instance.to_string()][rank.to_string()];
                if status != 200 || score.as_u64() != Some(u64::from(model.block_size)) {
                    waiting.push(format!(
                        "{} on {instance}/{rank}: {status} {answer}",
                        service.name
                    ));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(());
        }
        if started.elapsed() > PATIENCE {
            let logs: Vec<String> = services
                .iter()
                .map(|s| format!("--- {} stderr:\n{}{}", s.name, s.log(), s.source_counters()))
                .collect();
            return Err(format!(
                "after {PATIENCE:?}, still waiting for the streams' last batches:\n{}\n{}",
                waiting.join("\n"),
                logs.join("\n")
            ));
        }
        for publisher in publishers {
            publisher.nudge();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
