//! Generated vLLM-shaped KV event streams and the ground truth they imply:
//! which (instance, dp_rank) holds which block. The truth decides, where the
//! two indexers disagree, which one is wrong.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kvwasm_tests::crash::Rng;
use serde_json::{Value, json};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// One KV event as a vLLM 0.33 publisher sends it.
#[derive(Debug, Clone)]
pub enum Event {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u32,
        /// As sent: `Some("")` is an empty adapter name, which Dynamo
        /// takes as no adapter.
        lora_name: Option<String>,
    },
    Removed {
        hashes: Vec<u64>,
    },
    Cleared,
}

/// One message's batch: its own `data_parallel_rank` (nil: the
/// registration's) and events.
#[derive(Debug, Clone)]
pub struct Batch {
    pub rank: Option<u32>,
    pub events: Vec<Event>,
}

pub struct Model {
    pub name: String,
    pub block_size: u32,
}

/// A prompt the engines cache blocks of and the tests query.
pub struct Prompt {
    pub model: usize,
    /// As sent in stores and queries (see [`Event::Stored`]).
    pub lora_name: Option<String>,
    pub tokens: Vec<u32>,
    /// Each engine hashing's hash of each block ([`HASHINGS`]; content-
    /// addressed: the parent's hash, the adapter and the block's tokens, as
    /// vLLM's prefix hashes).
    pub engines: Vec<Vec<u64>>,
    /// Dynamo's local hash of each block (what `/query` computes).
    pub local: Vec<u64>,
}

/// One registered publisher: a vLLM engine's DP rank `registered_rank`
/// of `instance`, whose batches carry the ranks of `ranks` (one other
/// than the registered one: `data_parallel_rank` overrides it).
pub struct Feed {
    pub instance: u64,
    pub registered_rank: u32,
    pub model: usize,
    pub ranks: Vec<u32>,
    /// How its engine hashes blocks (an index into [`Prompt::engines`]).
    pub hashing: usize,
}

/// Engine block hashings: vLLM's default, and another giving the same
/// content other hashes (vLLM's xxhash option, or an unset
/// `PYTHONHASHSEED` before 0.33).
pub const HASHINGS: usize = 2;

impl Prompt {
    pub fn blocks(&self) -> usize {
        self.engines[0].len()
    }
}

/// The adapter a name means: an empty name is none (as Dynamo reads it).
fn adapter(lora_name: &Option<String>) -> Option<&str> {
    lora_name.as_deref().filter(|name| !name.is_empty())
}

/// What a block is: its engine hash's model, parent and local hash.
struct BlockInfo {
    parent: Option<u64>,
    local: u64,
}

/// The streams' world: models, prompts, feeds, and the truth of which
/// (instance, rank) holds which block (engine hashes).
pub struct World {
    pub models: Vec<Model>,
    pub prompts: Vec<Prompt>,
    pub feeds: Vec<Feed>,
    held: BTreeMap<(u64, u32), BTreeSet<u64>>,
    blocks: HashMap<u64, BlockInfo>,
    rng: Rng,
    markers: u32,
    /// Per 100 batches, how many are kept for replay only (forced gaps).
    pub gap_percent: u64,
    /// Per 100 events, how many are a rank's AllBlocksCleared.
    pub clear_percent: u64,
}

/// Tokens at and above this value only appear in marker blocks.
const MARKER_TOKENS: u32 = 1 << 30;

impl World {
    /// Two models (block sizes 16 and 32) named after `tag`, instances
    /// numbered from `first_instance`: on the first model, instance `i`
    /// with two publishers (ranks 0 and 1) and instance `i+1` with one
    /// publisher registered as rank 0 whose batches also carry rank 1; on
    /// the second, instance `i+2` with one publisher and `i+3` with one
    /// carrying ranks 0 and 3. `prompts` prompts per model, a third of
    /// them under a LoRA adapter (some named "", that is none), most
    /// sharing a prefix with an earlier one.
    pub fn new(seed: u64, tag: &str, first_instance: u64, prompts: usize) -> World {
        let models = vec![
            Model {
                name: format!("m16{tag}"),
                block_size: 16,
            },
            Model {
                name: format!("m32{tag}"),
                block_size: 32,
            },
        ];
        let i = first_instance;
        let feed = |instance, registered_rank, model, ranks: &[u32]| Feed {
            instance,
            registered_rank,
            model,
            ranks: ranks.to_vec(),
            hashing: 0,
        };
        let feeds = vec![
            feed(i, 0, 0, &[0]),
            feed(i, 1, 0, &[1]),
            feed(i + 1, 0, 0, &[0, 1]),
            feed(i + 2, 0, 1, &[0]),
            feed(i + 3, 0, 1, &[0, 3]),
        ];
        let mut world = World {
            models,
            prompts: Vec::new(),
            feeds,
            held: BTreeMap::new(),
            blocks: HashMap::new(),
            rng: Rng::new(seed),
            markers: 0,
            gap_percent: 8,
            clear_percent: 2,
        };
        for model in 0..world.models.len() {
            for _ in 0..prompts {
                world.add_prompt(model);
            }
        }
        world
    }

    /// Instances `i+1` (first model) and `i+3` (second) hash blocks the
    /// other way from now on: each model's tree holds the same content
    /// under two engine hashes. Before anything is published.
    pub fn mix_engine_hashing(&mut self) {
        let first = self.feeds[0].instance;
        for feed in &mut self.feeds {
            if feed.instance == first + 1 || feed.instance == first + 3 {
                feed.hashing = 1;
            }
        }
    }

    /// Whether instances hash the same content differently.
    pub fn mixed_hashing(&self) -> bool {
        self.feeds
            .iter()
            .any(|f| f.hashing != self.feeds[0].hashing)
    }

    /// The local hash of the block an engine hash (of any hashing) names.
    pub fn local_of(&self, engine: u64) -> Option<u64> {
        self.blocks.get(&engine).map(|b| b.local)
    }

    fn hashing_of(&self, instance: u64) -> usize {
        self.feeds
            .iter()
            .find(|f| f.instance == instance)
            .map_or(0, |f| f.hashing)
    }

    fn add_prompt(&mut self, model: usize) {
        let block_size = self.models[model].block_size as usize;
        let earlier: Vec<usize> = (0..self.prompts.len())
            .filter(|&p| self.prompts[p].model == model)
            .collect();
        let mut tokens = Vec::new();
        let mut lora_name = match self.rng.range(0, 6) {
            0 => Some(String::new()),
            1 => Some("adapter-a".to_owned()),
            2 => Some("adapter-b".to_owned()),
            _ => None,
        };
        if !earlier.is_empty() && self.rng.range(0, 10) < 6 {
            let base = &self.prompts[earlier[self.rng.range(0, earlier.len() as u64) as usize]];
            let shared = self.rng.range(1, base.blocks() as u64 + 1) as usize;
            tokens.extend_from_slice(&base.tokens[..shared * block_size]);
            if self.rng.range(0, 5) > 0 {
                lora_name = base.lora_name.clone();
            }
        }
        let blocks = tokens.len() / block_size + self.rng.range(1, 5) as usize;
        while tokens.len() < blocks * block_size {
            tokens.push(self.rng.range(0, 32_000) as u32);
        }
        self.push_prompt(model, lora_name, tokens);
    }

    fn push_prompt(&mut self, model: usize, lora_name: Option<String>, tokens: Vec<u32>) -> usize {
        let block_size = self.models[model].block_size;
        let local =
            kvwasm_kv_indexer_core::hash::block_hashes(&tokens, block_size, adapter(&lora_name));
        let mut engines = Vec::new();
        for hashing in 0..HASHINGS {
            let mut engine = Vec::new();
            let mut parent: Option<u64> = None;
            for (b, block) in tokens.chunks_exact(block_size as usize).enumerate() {
                let mut bytes = parent.unwrap_or(0).to_le_bytes().to_vec();
                bytes.extend_from_slice(adapter(&lora_name).unwrap_or("").as_bytes());
                bytes.push(0);
                block
                    .iter()
                    .for_each(|t| bytes.extend_from_slice(&t.to_le_bytes()));
                let hash = match hashing {
                    0 => xxh3_64(&bytes),
                    _ => xxh3_64_with_seed(&bytes, 0x5eed),
                };
                self.blocks.insert(
                    hash,
                    BlockInfo {
                        parent,
                        local: local[b],
                    },
                );
                engine.push(hash);
                parent = Some(hash);
            }
            engines.push(engine);
        }
        self.prompts.push(Prompt {
            model,
            lora_name,
            tokens,
            engines,
            local,
        });
        self.prompts.len() - 1
    }

    /// The feed the next batch comes from.
    pub fn pick_feed(&mut self) -> usize {
        self.pick(self.feeds.len())
    }

    fn pick(&mut self, n: usize) -> usize {
        self.rng.range(0, n as u64) as usize
    }

    /// The next batch of feed `f`: one to three events of one of its ranks
    /// (stores of prompt blocks whose parent the rank holds, removals of
    /// blocks it holds, now and then its AllBlocksCleared).
    pub fn next_batch(&mut self, f: usize) -> Batch {
        let count = self.rng.range(1, 4) as usize;
        self.batch_of(f, count)
    }

    /// A batch of `count` events of one of feed `f`'s ranks.
    pub fn batch_of(&mut self, f: usize, count: usize) -> Batch {
        let ranks = self.feeds[f].ranks.clone();
        let rank = ranks[self.pick(ranks.len())];
        let worker = (self.feeds[f].instance, rank);
        let registered = self.feeds[f].registered_rank;
        let batch_rank = if rank == registered && self.rng.range(0, 2) == 0 {
            None
        } else {
            Some(rank)
        };
        let mut events = Vec::with_capacity(count);
        for _ in 0..count {
            let roll = self.rng.range(0, 100);
            let holds = self.held.get(&worker).is_some_and(|h| !h.is_empty());
            let event = if roll < self.clear_percent {
                Event::Cleared
            } else if roll < 35 && holds {
                self.removal(worker)
            } else {
                self.store(f, worker)
            };
            self.apply(worker, &event);
            events.push(event);
        }
        Batch {
            rank: batch_rank,
            events,
        }
    }

    fn store(&mut self, f: usize, worker: (u64, u32)) -> Event {
        let model = self.feeds[f].model;
        let candidates: Vec<usize> = (0..self.prompts.len())
            .filter(|&p| {
                self.prompts[p].model == model && self.prompts[p].tokens[0] < MARKER_TOKENS
            })
            .collect();
        let p = candidates[self.pick(candidates.len())];
        let hashing = self.feeds[f].hashing;
        let held = self.held.entry(worker).or_default();
        let prompt = &self.prompts[p];
        let engine = &prompt.engines[hashing];
        let leading = engine.iter().take_while(|h| held.contains(h)).count();
        let blocks = engine.len();
        let start = self.rng.range(0, leading.min(blocks - 1) as u64 + 1) as usize;
        let end = self.rng.range(start as u64 + 1, blocks as u64 + 1) as usize;
        self.stored(p, start, end, hashing)
    }

    fn stored(&self, p: usize, start: usize, end: usize, hashing: usize) -> Event {
        let prompt = &self.prompts[p];
        let engine = &prompt.engines[hashing];
        let block_size = self.models[prompt.model].block_size;
        let size = block_size as usize;
        Event::Stored {
            hashes: engine[start..end].to_vec(),
            parent: start.checked_sub(1).map(|b| engine[b]),
            tokens: prompt.tokens[start * size..end * size].to_vec(),
            block_size,
            lora_name: prompt.lora_name.clone(),
        }
    }

    /// A removal of one to three blocks the rank holds, each a leaf of
    /// what it holds at that point (no held block has it as parent), as
    /// vLLM evicts: a freed request's blocks join the free queue tail
    /// first. Dynamo's tree does not define what a rank holds below a
    /// removed block (a removal inside a compressed edge drops the rest of
    /// the edge for the rank, not its descendants), so the truth stays
    /// decidable only this way.
    fn removal(&mut self, worker: (u64, u32)) -> Event {
        let mut held = self.held[&worker].clone();
        let mut children: HashMap<u64, usize> = HashMap::new();
        for hash in &held {
            if let Some(parent) = self.blocks[hash].parent {
                *children.entry(parent).or_default() += 1;
            }
        }
        let count = self.rng.range(1, 4);
        let mut hashes = Vec::new();
        for _ in 0..count {
            let leaves: Vec<u64> = held
                .iter()
                .copied()
                .filter(|h| children.get(h).is_none_or(|&n| n == 0))
                .collect();
            if leaves.is_empty() {
                break;
            }
            let hash = leaves[self.pick(leaves.len())];
            held.remove(&hash);
            if let Some(parent) = self.blocks[&hash].parent {
                *children.get_mut(&parent).unwrap() -= 1;
            }
            hashes.push(hash);
        }
        Event::Removed { hashes }
    }

    /// The truth after `event` from `worker`.
    pub fn apply(&mut self, worker: (u64, u32), event: &Event) {
        let held = self.held.entry(worker).or_default();
        match event {
            Event::Stored { hashes, .. } => held.extend(hashes),
            Event::Removed { hashes } => hashes.iter().for_each(|h| {
                held.remove(h);
            }),
            Event::Cleared => held.clear(),
        }
    }

    /// Whether batch `n` of a stream is sent live: a forced gap now and
    /// then (never the last batch, which the barrier waits for).
    pub fn live(&mut self) -> bool {
        self.rng.range(0, 100) >= self.gap_percent
    }

    /// A batch storing a new one-block prompt under feed `f`'s registered
    /// rank: the last batch of a stream, whose arrival at an indexer means
    /// the whole stream has (a stream is applied in order). Returns the
    /// batch and the marker's prompt.
    pub fn marker(&mut self, f: usize) -> (Batch, usize) {
        let model = self.feeds[f].model;
        let block_size = self.models[model].block_size;
        self.markers += 1;
        let tokens = vec![MARKER_TOKENS + self.markers; block_size as usize];
        let p = self.push_prompt(model, None, tokens);
        let worker = (self.feeds[f].instance, self.feeds[f].registered_rank);
        let event = self.stored(p, 0, 1, self.feeds[f].hashing);
        self.apply(worker, &event);
        (
            Batch {
                rank: Some(worker.1),
                events: vec![event],
            },
            p,
        )
    }

    /// A publisher restarted with its instance unregistered (as a Dynamo
    /// deployment drops a dead worker): the registered rank holds nothing.
    pub fn unregister(&mut self, f: usize) {
        let worker = (self.feeds[f].instance, self.feeds[f].registered_rank);
        self.held.remove(&worker);
    }

    fn instance_model(&self, instance: u64) -> Option<usize> {
        self.feeds
            .iter()
            .find(|f| f.instance == instance)
            .map(|f| f.model)
    }

    /// The scores the truth gives a query of prompt `p`'s first `cut`
    /// blocks: per instance and rank, the tokens of the leading blocks it
    /// holds (by its own engine's hashes), as Dynamo's `scores` (ranks with
    /// none left out).
    pub fn scores(&self, p: usize, cut: usize) -> Value {
        let prompt = &self.prompts[p];
        let model = prompt.model;
        let block_size = u64::from(self.models[model].block_size);
        let mut scores: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (&(instance, rank), held) in &self.held {
            if self.instance_model(instance) != Some(model) {
                continue;
            }
            let engine = &prompt.engines[self.hashing_of(instance)][..cut];
            let leading = engine.iter().take_while(|h| held.contains(h)).count() as u64;
            if leading > 0 {
                scores
                    .entry(instance.to_string())
                    .or_default()
                    .insert(rank.to_string(), leading * block_size);
            }
        }
        json!(scores)
    }

    /// The truth as a normalised `/dump` ([`super::compare::normalise_dump`]):
    /// per `model:default` key, its block size and every block each rank
    /// holds with its parent and local hash.
    pub fn dump(&self) -> BTreeMap<String, super::compare::DumpKey> {
        let mut dump: BTreeMap<String, super::compare::DumpKey> = BTreeMap::new();
        for (&(instance, rank), held) in &self.held {
            let Some(model) = self.instance_model(instance) else {
                continue;
            };
            let key = dump
                .entry(format!("{}:default", self.models[model].name))
                .or_insert_with(|| super::compare::DumpKey {
                    block_size: u64::from(self.models[model].block_size),
                    blocks: BTreeSet::new(),
                });
            for hash in held {
                let info = &self.blocks[hash];
                key.blocks.insert(super::compare::DumpBlock {
                    worker: instance,
                    rank: u64::from(rank),
                    parent: info.parent,
                    hash: *hash,
                    local: info.local,
                    extra: String::new(),
                });
            }
        }
        dump
    }

    pub fn model_names(&self) -> Vec<String> {
        self.models.iter().map(|m| m.name.clone()).collect()
    }
}

/// `event` of `worker` as a Dynamo RouterEvent (what Dynamo workers publish
/// on NATS): stores carry the local hashes of their tokens (`tokens_hash`).
pub fn router_event(worker: (u64, u32), event_id: u64, event: &Event, block_size: u32) -> Value {
    let data = match event {
        Event::Stored {
            hashes,
            parent,
            tokens,
            lora_name,
            ..
        } => {
            let local =
                kvwasm_kv_indexer_core::hash::block_hashes(tokens, block_size, adapter(lora_name));
            let blocks: Vec<Value> = hashes
                .iter()
                .zip(local)
                .map(|(hash, local)| json!({"block_hash": hash, "tokens_hash": local}))
                .collect();
            json!({"stored": {"parent_hash": parent, "blocks": blocks, "lora_name": lora_name}})
        }
        Event::Removed { hashes } => json!({"removed": {"block_hashes": hashes}}),
        Event::Cleared => json!("cleared"),
    };
    json!({"worker_id": worker.0, "event": {"event_id": event_id, "dp_rank": worker.1, "data": data}})
}
