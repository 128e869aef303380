//! Registrations, the trees, event ingest and the HTTP API.

use std::collections::BTreeMap;

use kvwasm_indexer_protocol::api::{
    self, InstanceOverlap, MAX_TOKEN_IDS, QueryByHashRequest, RegisterRequest, ScoreResponse,
    UnregisterRequest, default_group,
};
use kvwasm_indexer_protocol::dump::{
    Dump, DumpIndex, KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData,
    RouterEvent, device_tier, dump_key, split_dump_key,
};
use serde::{Deserialize, Serialize};

use crate::hash::{self, BlockHasher, HashRun, RunsHasher, TokenJsonHasher};
use crate::tree::{ApplyError, Tree, Worker};
use crate::{Event, EventData, Stored};

/// Longest endpoint accepted by `/register`.
const MAX_ENDPOINT: usize = 1024;

/// What ingest did, since start (a replaced guest starts again at zero).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Counters {
    pub events: u64,
    pub blocks_stored: u64,
    pub blocks_removed: u64,
    /// Blocks of events whose `block_size` differs from the tree's.
    pub blocks_wrong_size: u64,
    /// Engine hashes without a full block of tokens (or a local hash).
    pub blocks_incomplete: u64,
    /// Stores whose parent the worker does not hold.
    pub parent_not_found: u64,
    /// Removals of blocks the worker does not hold.
    pub block_not_found: u64,
    /// Stores that would make a block its own ancestor.
    pub invalid_sequence: u64,
    /// Events with no tree: no model and the worker is not registered, or
    /// a model with no tree and no block size to start one.
    pub unroutable: u64,
}

/// The tree of one (model, routing group) and its block size.
struct Index {
    block_size: u32,
    /// The adapter `/query` hashes with when the request names none.
    lora_name: Option<String>,
    tree: Tree,
}

impl Index {
    fn new(block_size: u32, lora_name: Option<String>) -> Index {
        Index {
            block_size,
            lora_name,
            tree: Tree::default(),
        }
    }
}

/// A `/register`ed (instance, rank).
struct Registration {
    /// None for a worker whose events come over NATS.
    endpoint: Option<String>,
    /// The tree: every rank of an instance has the same (Dynamo 1.6.1
    /// binds an instance to one (model, routing group)).
    key: Key,
    /// The registration's `tenant_id` ("default" when absent): Dynamo
    /// 1.6.1 ignores it; kvwasm filters a `/query` that names a tenant by
    /// it (docs/events.md).
    tenant: String,
}

/// (model, routing group): one tree each, as Dynamo 1.6.1's
/// `RoutingPartitionId`.
type Key = (String, String);

/// The whole indexer: what one guest instance holds.
pub struct Indexer {
    indexes: BTreeMap<Key, Index>,
    workers: BTreeMap<u64, BTreeMap<u32, Registration>>,
    counters: Counters,
    hasher: BlockHasher,
    /// Hashes a `/query`'s raw `token_ids` (the guest's host import);
    /// `None` parses the tokens in place.
    json_hasher: Option<TokenJsonHasher>,
    /// Hashes the tokens of a whole batch at once (the guest's host
    /// import); `None` hashes event by event with `hasher`.
    runs_hasher: Option<RunsHasher>,
    /// The (model, routing group) of the event being applied (see
    /// [`Indexer::route`]).
    routed: Key,
}

impl Default for Indexer {
    fn default() -> Self {
        Indexer::with_block_hasher(hash::xxh3_blocks)
    }
}

impl Indexer {
    /// An empty indexer whose block hashes come from `hasher` (the guest
    /// passes the host's import; [`Indexer::default`] hashes in place).
    pub fn with_block_hasher(hasher: BlockHasher) -> Indexer {
        Indexer {
            indexes: BTreeMap::new(),
            workers: BTreeMap::new(),
            counters: Counters::default(),
            hasher,
            json_hasher: None,
            runs_hasher: None,
            routed: Key::default(),
        }
    }

    /// The same indexer, handing each `/query`'s `token_ids` to `hasher`
    /// as raw JSON: the guest's host import parses and hashes natively
    /// (the in-place parser was 73% of a guest `/query`). Answers stay
    /// those of the in-place path: any request the fast path cannot
    /// answer (a malformed body or array, no such index) goes through it.
    pub fn with_token_json_hasher(mut self, hasher: TokenJsonHasher) -> Indexer {
        self.json_hasher = Some(hasher);
        self
    }

    /// The same indexer, hashing the token ids of each [`Indexer::ingest`]
    /// batch in one call to `hasher`: in the guest, one host crossing per
    /// batch instead of one per stored event.
    pub fn with_runs_hasher(mut self, hasher: RunsHasher) -> Indexer {
        self.runs_hasher = Some(hasher);
        self
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Apply events in order; returns how many were not (fully) applied
    /// (each is counted in [`Counters`]).
    pub fn ingest(&mut self, events: &[Event]) -> usize {
        let Some(runs_hasher) = self.runs_hasher else {
            return events.iter().filter(|e| !self.ingest_one(e, None)).count();
        };
        let mut tokens = Vec::new();
        let mut runs = Vec::new();
        for (paired, run) in events.iter().filter_map(prehashable) {
            tokens.extend_from_slice(paired);
            runs.push(run);
        }
        let hashes = runs_hasher(&tokens, &runs);
        let mut at = 0;
        let mut rejected = 0;
        for event in events {
            let locals = prehashable(event).and_then(|(paired, run)| {
                let n = paired.len() / run.block_size as usize;
                at += n;
                hashes.get(at - n..at)
            });
            rejected += usize::from(!self.ingest_one(event, locals));
        }
        rejected
    }

    /// Applies one event; `locals` are its stored blocks' local hashes
    /// when already computed.
    fn ingest_one(&mut self, event: &Event, locals: Option<&[u64]>) -> bool {
        self.counters.events += 1;
        if !self.route(event) {
            self.counters.unroutable += 1;
            return false;
        }
        let index = self
            .indexes
            .get_mut(&self.routed)
            .expect("routed to an index");
        let worker = (event.worker_id, event.dp_rank);
        let counters = &mut self.counters;
        let result = match &event.data {
            EventData::Stored(stored) => {
                store(index, counters, self.hasher, worker, stored, locals)
            }
            EventData::Removed(hashes) => {
                let before = index.tree.size(worker);
                let result = index.tree.remove(worker, hashes);
                counters.blocks_removed += (before - index.tree.size(worker)) as u64;
                result.map(|()| true)
            }
            // The sending rank only: Dynamo keys every worker by (instance,
            // rank), and a publisher serving several ranks clears each
            // with its own batch rank.
            EventData::Cleared => {
                index
                    .tree
                    .remove_worker(event.worker_id, Some(event.dp_rank));
                Ok(true)
            }
        };
        match result {
            Ok(applied) => applied,
            Err(err) => {
                count_error(counters, err);
                false
            }
        }
    }

    /// The index an event belongs to: its worker's registration (all its
    /// ranks share one tree, so a batch's own rank needs none), else the
    /// (model, group) the host attributed it to (an unregistered worker:
    /// a NATS source's `model` and `tenant`, the tenant naming the routing
    /// group). The registration wins because the host tags a ZMQ source's
    /// events with the registration's `tenant_id`, which is no tree's name.
    /// Sets `self.routed` to it (its strings reused: no allocation per
    /// event); `false` if there is none.
    fn route(&mut self, event: &Event) -> bool {
        let registered = self
            .workers
            .get(&event.worker_id)
            .and_then(|ranks| ranks.values().next());
        let (model, group) = match (registered, &event.model) {
            (Some(registration), _) => (registration.key.0.as_str(), registration.key.1.as_str()),
            (None, Some(model)) => (model.as_str(), event.tenant.as_deref().unwrap_or("default")),
            (None, None) => return false,
        };
        let routed = &mut self.routed;
        routed.0.clear();
        routed.0.push_str(model);
        routed.1.clear();
        routed.1.push_str(group);
        if !self.indexes.contains_key(routed) {
            let EventData::Stored(Stored {
                block_size: Some(size @ 1..),
                ..
            }) = event.data
            else {
                return false;
            };
            self.indexes.insert(routed.clone(), Index::new(size, None));
        }
        true
    }

    /// Answer one request of the API: (status, JSON body). A body that is
    /// not JSON answers 400, JSON of the wrong shape (a missing field, a
    /// negative token, a hash above 2^64, a wrong type) 422: the codes of
    /// Dynamo's axum `Json` extractor, which classifies serde_json's errors
    /// the same way (syntax or end of input, or data).
    pub fn handle(
        &mut self,
        method: &str,
        path: &str,
        _query: &str,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let expected = match path {
            "/register" | "/unregister" | "/query" | "/query_by_hash" | "/restore" => "POST",
            "/workers" | "/dump" => "GET",
            _ => return error(404, format!("no route for {path}")),
        };
        if method != expected {
            return error(405, format!("{path} takes {expected}"));
        }
        let result = match path {
            "/register" => parse(body).and_then(|r| self.register(r)),
            "/unregister" => parse(body).and_then(|r| self.unregister(r)),
            "/workers" => Ok(self.list_workers()),
            "/query" => self
                .query_raw(body)
                .map(Ok)
                .unwrap_or_else(|| self.query(query_request(body)?)),
            "/query_by_hash" => parse(body).and_then(|r| self.query_by_hash(r)),
            "/dump" => Ok(json(200, &self.dump())),
            _ => parse(body).map(|dump| self.restore(dump)),
        };
        result.unwrap_or_else(|e| e)
    }

    /// As Dynamo 1.6.1: 409 when the instance is registered for another
    /// (model, routing group), when the (instance, rank) is, or when the
    /// group's tree has another block size.
    fn register(&mut self, req: RegisterRequest) -> Reply {
        for endpoint in req.endpoint.iter().chain(&req.replay_endpoint) {
            if !valid_endpoint(endpoint) {
                return Err(error(400, format!("invalid endpoint {endpoint:?}")));
            }
        }
        if req.block_size == 0 {
            return Err(error(400, "block_size must be positive".into()));
        }
        let rank = req.rank();
        let key = (req.model_name, req.routing_group);
        if let Some(ranks) = self.workers.get(&req.instance_id) {
            let registered = &ranks.values().next().expect("no empty rank map").key;
            if *registered != key {
                return Err(error(
                    409,
                    format!(
                        "instance {} is already registered for model={} routing_group={}",
                        req.instance_id, registered.0, registered.1
                    ),
                ));
            }
            if ranks.contains_key(&rank) {
                return Err(error(
                    409,
                    format!(
                        "instance {} dp_rank {rank} already registered",
                        req.instance_id
                    ),
                ));
            }
        }
        if let Some(index) = self.indexes.get(&key)
            && index.block_size != req.block_size
        {
            return Err(error(
                409,
                format!(
                    "block_size mismatch for model={} routing_group={}: existing={}, requested={}",
                    key.0, key.1, index.block_size, req.block_size
                ),
            ));
        }
        let lora = req.lora_name.filter(|name| !name.is_empty());
        self.indexes
            .entry(key.clone())
            .or_insert_with(|| Index::new(req.block_size, lora));
        self.workers.entry(req.instance_id).or_default().insert(
            rank,
            Registration {
                endpoint: req.endpoint,
                key,
                tenant: req.tenant_id.unwrap_or_else(default_group),
            },
        );
        Ok(json(201, &serde_json::json!({"status": "ok"})))
    }

    /// Remove the instance's registrations (one rank's when `dp_rank` is
    /// given, those of one tenant when `tenant_id` is) and their blocks.
    /// Its last registration takes every rank's blocks, those of ranks
    /// only a batch named too, and a tree left without registrations goes
    /// (`/query` answers 404 for it again), as in Dynamo 1.6.1.
    fn unregister(&mut self, req: UnregisterRequest) -> Reply {
        let id = req.instance_id;
        let Some(ranks) = self.workers.get_mut(&id) else {
            return Err(error(404, format!("instance {id} not found")));
        };
        let key = ranks
            .values()
            .next()
            .expect("no empty rank map")
            .key
            .clone();
        if key.0 != req.model_name || req.routing_group.as_ref().is_some_and(|g| *g != key.1) {
            return Err(error(
                404,
                format!(
                    "instance {id} is registered for model={} routing_group={}",
                    key.0, key.1
                ),
            ));
        }
        let removed: Vec<u32> = ranks
            .iter()
            .filter(|(rank, r)| {
                req.dp_rank.is_none_or(|d| d == **rank)
                    && req.tenant_id.as_ref().is_none_or(|t| *t == r.tenant)
            })
            .map(|(rank, _)| *rank)
            .collect();
        if removed.is_empty() {
            let what = match (req.dp_rank, &req.tenant_id) {
                (Some(rank), _) => format!("instance {id} dp_rank {rank} not found"),
                (None, Some(tenant)) => format!("instance {id} not found for tenant {tenant}"),
                (None, None) => format!("instance {id} not found"),
            };
            return Err(error(404, what));
        }
        for rank in &removed {
            ranks.remove(rank);
        }
        let last = ranks.is_empty();
        if last {
            self.workers.remove(&id);
        }
        if let Some(index) = self.indexes.get_mut(&key) {
            if last {
                index.tree.remove_worker(id, None);
            } else {
                for rank in removed {
                    index.tree.remove_worker(id, Some(rank));
                }
            }
        }
        let in_use = self
            .workers
            .values()
            .any(|ranks| ranks.values().any(|r| r.key == key));
        if !in_use {
            self.indexes.remove(&key);
        }
        Ok(json(200, &serde_json::json!({"status": "ok"})))
    }

    /// Each instance with Dynamo 1.6.1's `instance_id`, `model_name`,
    /// `routing_group`, `block_size` and `endpoints` (its listener state
    /// lives in the host).
    fn list_workers(&self) -> (u16, Vec<u8>) {
        let workers: Vec<_> = self
            .workers
            .iter()
            .map(|(id, ranks)| {
                let endpoints: BTreeMap<u32, Option<&str>> = ranks
                    .iter()
                    .map(|(rank, r)| (*rank, r.endpoint.as_deref()))
                    .collect();
                let (model, group) = &ranks.values().next().expect("no empty rank map").key;
                let block_size = self
                    .indexes
                    .get(&(model.clone(), group.clone()))
                    .map(|i| i.block_size);
                serde_json::json!({"instance_id": id, "model_name": model, "routing_group": group,
                    "block_size": block_size, "endpoints": endpoints})
            })
            .collect();
        json(200, &workers)
    }

    fn index(&self, model: &str, group: &str) -> Result<&Index, (u16, Vec<u8>)> {
        self.indexes
            .get(&(model.to_owned(), group.to_owned()))
            .ok_or_else(|| {
                error(
                    404,
                    format!("no indexer for model={model} routing_group={group}"),
                )
            })
    }

    /// `/query` through the [`TokenJsonHasher`], if there is one and the
    /// request is well formed; `None` sends it to the in-place path, which
    /// then gives the same answer or the same error as without a hasher.
    fn query_raw(&self, body: &[u8]) -> Option<(u16, Vec<u8>)> {
        let hasher = self.json_hasher?;
        let req = QueryRequest::parse(body, raw_token_list).ok()?;
        let index = self.index(&req.model_name, &req.routing_group).ok()?;
        let hashes = hasher(req.token_ids, index.block_size, req.seed(index)).ok()?;
        Some(self.scores(index, &hashes, req.tenant_id.as_deref()))
    }

    fn query(&self, req: QueryRequest<Vec<u32>>) -> Reply {
        let index = self.index(&req.model_name, &req.routing_group)?;
        let hashes = (self.hasher)(&req.token_ids, index.block_size, req.seed(index));
        Ok(self.scores(index, &hashes, req.tenant_id.as_deref()))
    }

    fn query_by_hash(&self, req: QueryByHashRequest) -> Reply {
        if req.cache_salt.is_some() {
            return Err(error(
                400,
                "cache_salt is not accepted by /query_by_hash; block_hashes must already \
                 include the intended cache salt"
                    .into(),
            ));
        }
        let index = self.index(&req.model_name, &req.routing_group)?;
        let hashes: Vec<u64> = req.block_hashes.iter().map(|h| *h as u64).collect();
        Ok(self.scores(index, &hashes, req.tenant_id.as_deref()))
    }

    /// The tenant a worker was registered with: its rank's registration,
    /// else (a rank only a batch named) its instance's first; "default"
    /// for a worker with none (restored from a dump, fed over NATS).
    fn tenant_of(&self, (id, rank): Worker) -> &str {
        self.workers
            .get(&id)
            .and_then(|ranks| ranks.get(&rank).or_else(|| ranks.values().next()))
            .map_or("default", |r| r.tenant.as_str())
    }

    /// The score response: Dynamo 1.6.1's `scores` (matched tokens per
    /// instance per rank), `frequencies` (empty: no access-time window is
    /// kept, as in the standalone indexer) and `instances`, plus kvwasm's
    /// `tree_sizes` (each matched worker's blocks; an extra field a Dynamo
    /// client ignores). With `tenant`, only the workers registered with
    /// that `tenant_id` (kvwasm's extension: Dynamo ignores the field).
    fn scores(&self, index: &Index, hashes: &[u64], tenant: Option<&str>) -> (u16, Vec<u8>) {
        let mut overlap = index.tree.overlap(hashes);
        if let Some(tenant) = tenant {
            overlap.scores.retain(|w, _| self.tenant_of(*w) == tenant);
            overlap
                .tree_sizes
                .retain(|w, _| self.tenant_of(*w) == tenant);
        }
        let mut scores: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
        for ((id, rank), blocks) in overlap.scores {
            let tokens = u64::from(blocks) * u64::from(index.block_size);
            scores.entry(id).or_default().insert(rank, tokens);
        }
        let mut tree_sizes: BTreeMap<u64, BTreeMap<u32, usize>> = BTreeMap::new();
        for ((id, rank), size) in overlap.tree_sizes {
            tree_sizes.entry(id).or_default().insert(rank, size);
        }
        let instances = scores
            .iter()
            .map(|(id, dp)| {
                let gpu = dp.values().copied().max().unwrap_or(0);
                let summary = InstanceOverlap {
                    longest_matched: gpu,
                    gpu,
                    dp,
                    cpu: gpu,
                    disk: gpu,
                };
                (*id, summary)
            })
            .collect();
        let response = ScoreResponse {
            scores: &scores,
            frequencies: [],
            instances,
            tree_sizes,
        };
        json(200, &response)
    }

    /// Every index as Dynamo's `/dump` gives it: a breadth-first list of
    /// one-block store events per worker per reachable node, with each
    /// worker's own engine hashes ([`Tree::walk`]).
    fn dump(&self) -> Dump {
        self.indexes
            .iter()
            .map(|((model, group), index)| {
                let events = index
                    .tree
                    .walk()
                    .into_iter()
                    .enumerate()
                    .map(
                        |(n, ((worker_id, dp_rank), parent, ext, local))| RouterEvent {
                            worker_id,
                            // One tree holds every tier.
                            storage_tier: device_tier(),
                            event: KvCacheEvent {
                                event_id: n as u64,
                                data: KvCacheEventData::Stored(KvCacheStoreData {
                                    parent_hash: parent,
                                    start_position: None,
                                    blocks: vec![KvCacheStoredBlockData {
                                        block_hash: ext,
                                        tokens_hash: local,
                                        mm_extra_info: None,
                                    }],
                                    lora_name: None,
                                }),
                                dp_rank,
                            },
                        },
                    )
                    .collect();
                let dump = DumpIndex {
                    block_size: index.block_size,
                    events,
                };
                (dump_key(model, group), dump)
            })
            .collect()
    }

    /// `POST /restore` (a kvwasm extension): the trees become the dump's,
    /// its events applied as live ones are (a clear takes its rank only).
    /// Registrations stay; an index registered but absent from the dump
    /// is emptied.
    fn restore(&mut self, dump: Dump) -> (u16, Vec<u8>) {
        let mut indexes = BTreeMap::new();
        for (name, dumped) in dump {
            let Some((model, group)) = split_dump_key(&name) else {
                return error(400, format!("dump key {name:?} is not model:routing_group"));
            };
            if dumped.block_size == 0 {
                return error(400, format!("{name}: block_size must be positive"));
            }
            indexes.insert((model.to_owned(), group.to_owned()), dumped);
        }
        let mut restored = BTreeMap::new();
        for (key, dumped) in indexes {
            let lora = self.indexes.get(&key).and_then(|i| i.lora_name.clone());
            let mut index = Index::new(dumped.block_size, lora);
            for event in dumped.events {
                self.counters.events += 1;
                let worker = (event.worker_id, event.event.dp_rank);
                let result = match event.event.data {
                    KvCacheEventData::Stored(stored) => index.tree.store(
                        worker,
                        stored.parent_hash,
                        stored.blocks.iter().map(|b| (b.block_hash, b.tokens_hash)),
                    ),
                    KvCacheEventData::Removed(removed) => {
                        index.tree.remove(worker, &removed.block_hashes)
                    }
                    KvCacheEventData::Cleared => {
                        index.tree.remove_worker(worker.0, Some(worker.1));
                        Ok(())
                    }
                };
                if let Err(err) = result {
                    count_error(&mut self.counters, err);
                }
            }
            restored.insert(key, index);
        }
        for ranks in self.workers.values() {
            for r in ranks.values() {
                if !restored.contains_key(&r.key) {
                    let old = &self.indexes[&r.key];
                    let fresh = Index::new(old.block_size, old.lora_name.clone());
                    restored.insert(r.key.clone(), fresh);
                }
            }
        }
        self.indexes = restored;
        json(200, &serde_json::json!({"status": "ok"}))
    }
}

/// Apply a store; an event of another block size is dropped whole (and
/// counted, not an [`ApplyError`]: `Ok(false)`). A block size of 0 means
/// "not known" (the shim's `publish_events`), like an absent one. A store
/// with neither token ids nor local hashes is a storage event (the shim's,
/// KVBM's `Create`): its blocks are content-addressed, so their engine
/// hashes serve as their local hashes (`/query_by_hash` finds them).
fn store(
    index: &mut Index,
    counters: &mut Counters,
    hasher: BlockHasher,
    worker: Worker,
    stored: &Stored,
    hashed: Option<&[u64]>,
) -> Result<bool, ApplyError> {
    let blocks = stored.block_hashes.len() as u64;
    if stored
        .block_size
        .is_some_and(|size| size != 0 && size != index.block_size)
    {
        counters.blocks_wrong_size += blocks;
        return Ok(false);
    }
    let computed;
    let locals: &[u64] = if !stored.tokens_hashes.is_empty() {
        &stored.tokens_hashes
    } else if stored.token_ids.is_empty() {
        &stored.block_hashes
    } else if let Some(hashed) = hashed {
        hashed
    } else {
        computed = hasher(
            &stored.token_ids,
            index.block_size,
            hash::seed_for(stored.lora_name.as_deref()),
        );
        &computed
    };
    let complete = locals.len().min(stored.block_hashes.len());
    counters.blocks_incomplete += blocks - complete as u64;
    let before = index.tree.size(worker);
    let result = index.tree.store(
        worker,
        stored.parent_hash,
        stored
            .block_hashes
            .iter()
            .copied()
            .zip(locals.iter().copied()),
    );
    counters.blocks_stored += index.tree.size(worker).saturating_sub(before) as u64;
    result.map(|()| true)
}

/// A store whose local hashes are known before it is routed: token ids
/// and a block size (a store of another block size than its tree's is
/// dropped, so its hashes are only used with that size), with the run
/// [`store`] would hash them as.
fn prehashable(event: &Event) -> Option<(&[u32], HashRun)> {
    let EventData::Stored(stored) = &event.data else {
        return None;
    };
    let block_size = stored.block_size.filter(|&size| size != 0)?;
    if !stored.tokens_hashes.is_empty() || stored.token_ids.is_empty() {
        return None;
    }
    let paired = hash::paired_tokens(&stored.token_ids, stored.block_hashes.len(), block_size);
    let run = HashRun {
        tokens: u32::try_from(paired.len()).ok()?,
        block_size,
        seed: hash::seed_for(stored.lora_name.as_deref()),
    };
    Some((paired, run))
}

fn count_error(counters: &mut Counters, err: ApplyError) {
    match err {
        ApplyError::ParentNotFound => counters.parent_not_found += 1,
        ApplyError::BlockNotFound => counters.block_not_found += 1,
        ApplyError::InvalidSequence => counters.invalid_sequence += 1,
    }
}

/// A handler's answer; `Err` carries an error response.
type Reply = Result<(u16, Vec<u8>), (u16, Vec<u8>)>;

fn json(status: u16, value: &impl Serialize) -> (u16, Vec<u8>) {
    (
        status,
        serde_json::to_vec(value).expect("plain data serialises"),
    )
}

fn error(status: u16, message: String) -> (u16, Vec<u8>) {
    json(status, &serde_json::json!({ "error": message }))
}

fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, (u16, Vec<u8>)> {
    serde_json::from_slice(body).map_err(rejection)
}

/// A body serde_json refused, answered as axum's `Json` extractor answers
/// Dynamo's: 422 for valid JSON of the wrong shape, 400 otherwise (its
/// messages too; the body stays `{"error": …}` as every kvwasm error).
fn rejection(e: serde_json::Error) -> (u16, Vec<u8>) {
    match e.classify() {
        serde_json::error::Category::Data => error(
            422,
            format!("Failed to deserialize the JSON body into the target type: {e}"),
        ),
        _ => error(
            400,
            format!("Failed to parse the request body as JSON: {e}"),
        ),
    }
}

/// A `/query` body: read in place ([`QueryRequest::parse`]); what that
/// refuses, serde_json reads ([`api::QueryRequest`]), so a refused body gets
/// serde's answer and status, and a body only serde takes (a struct as a
/// JSON array) is still answered.
fn query_request(body: &[u8]) -> Result<QueryRequest<Vec<u32>>, (u16, Vec<u8>)> {
    QueryRequest::parse(body, token_list).or_else(|_| {
        let body: api::QueryRequest = parse(body)?;
        Ok(QueryRequest {
            token_ids: body.token_ids,
            model_name: body.model_name,
            routing_group: body.routing_group,
            tenant_id: body.tenant_id,
            lora_name: body.lora_name,
            cache_salt: body.cache_salt,
        })
    })
}

/// `tcp://host:port` (host may be `*` or a bracketed IPv6 address) or
/// `ipc://path`, as ZMQ connects to them.
fn valid_endpoint(endpoint: &str) -> bool {
    if endpoint.len() > MAX_ENDPOINT || endpoint.chars().any(char::is_control) {
        return false;
    }
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        return !path.is_empty();
    }
    let Some((host, port)) = endpoint
        .strip_prefix("tcp://")
        .and_then(|a| a.rsplit_once(':'))
    else {
        return false;
    };
    !host.is_empty() && !host.contains(['/', ' ']) && port.parse::<u16>().is_ok_and(|p| p > 0)
}

/// A `/query` body: the fields of Dynamo's request, any order, unknown
/// fields ignored, a field twice refused. `T` is the token ids as read by
/// the `tokens` reader given to [`QueryRequest::parse`]: parsed
/// ([`token_list`]) or as raw JSON ([`raw_token_list`]).
struct QueryRequest<T> {
    token_ids: T,
    model_name: String,
    /// The tree's group; "default" when absent.
    routing_group: String,
    /// Only the workers registered with this tenant, when given.
    tenant_id: Option<String>,
    lora_name: Option<String>,
    cache_salt: Option<String>,
}

/// Reads the token list at a byte index of the body: the value and the
/// index just past it.
type TokenReader<'a, T> = fn(&'a [u8], usize) -> Result<(T, usize), String>;

impl<'a, T> QueryRequest<T> {
    /// The seed of its block hashes: its adapter (else the tree's) and
    /// salt.
    fn seed(&self, index: &Index) -> u64 {
        let lora = self.lora_name.as_deref().or(index.lora_name.as_deref());
        hash::query_seed(lora, self.cache_salt.as_deref())
    }

    /// One pass over the body: `token_ids` by [`token_list`] where it
    /// stands, every other value by serde_json (they are short). Going
    /// through serde for the whole object would scan the token array twice
    /// (once to find its end, once to read it): that scan was ~40% of a
    /// guest `/query`.
    fn parse(body: &'a [u8], tokens_at: TokenReader<'a, T>) -> Result<QueryRequest<T>, String> {
        fn once<V>(slot: &mut Option<V>, value: V, key: &str) -> Result<(), String> {
            match slot.replace(value) {
                None => Ok(()),
                Some(_) => Err(format!("duplicate field `{key}`")),
            }
        }
        let (mut tokens, mut model, mut group, mut tenant, mut lora, mut salt) =
            (None, None, None, None, None, None);
        let mut i = skip_space(body, 0);
        if body.get(i) != Some(&b'{') {
            return Err("expected a JSON object".into());
        }
        i = skip_space(body, i + 1);
        if body.get(i) == Some(&b'}') {
            i += 1;
        } else {
            loop {
                let key: String = json_value(body, &mut i)?;
                i = skip_space(body, i);
                if body.get(i) != Some(&b':') {
                    return Err(format!("expected : at byte {i}"));
                }
                i = skip_space(body, i + 1);
                match key.as_str() {
                    "token_ids" => {
                        let (list, end) =
                            tokens_at(body, i).map_err(|e| format!("token_ids: {e}"))?;
                        i = end;
                        once(&mut tokens, list, "token_ids")?;
                    }
                    "model_name" => once(&mut model, json_value(body, &mut i)?, "model_name")?,
                    "routing_group" => {
                        once(&mut group, json_value(body, &mut i)?, "routing_group")?
                    }
                    "tenant_id" => once(&mut tenant, json_value(body, &mut i)?, "tenant_id")?,
                    "lora_name" => once(&mut lora, json_value(body, &mut i)?, "lora_name")?,
                    "cache_salt" => once(&mut salt, json_value(body, &mut i)?, "cache_salt")?,
                    _ => {
                        json_value::<serde::de::IgnoredAny>(body, &mut i)?;
                    }
                }
                i = skip_space(body, i);
                match body.get(i) {
                    Some(b',') => i = skip_space(body, i + 1),
                    Some(b'}') => {
                        i += 1;
                        break;
                    }
                    _ => return Err(format!("expected , or }} at byte {i}")),
                }
            }
        }
        if skip_space(body, i) != body.len() {
            return Err("trailing characters after the object".into());
        }
        Ok(QueryRequest {
            token_ids: tokens.ok_or("missing field `token_ids`")?,
            model_name: model.ok_or("missing field `model_name`")?,
            routing_group: group.unwrap_or_else(default_group),
            tenant_id: tenant,
            lora_name: lora.flatten(),
            cache_salt: salt.flatten(),
        })
    }
}

/// The JSON value at `*at` as a `T`; `*at` moves past it.
fn json_value<'a, T: Deserialize<'a>>(body: &'a [u8], at: &mut usize) -> Result<T, String> {
    let rest = &body[*at..];
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<T>();
    let value = values
        .next()
        .unwrap_or_else(|| Err(serde::de::Error::custom("expected a value")))
        .map_err(|e| format!("at byte {at}: {e}"))?;
    *at += values.byte_offset();
    Ok(value)
}

/// Index of the first non-whitespace byte of `bytes` at or after `i`.
fn skip_space(bytes: &[u8], mut i: usize) -> usize {
    while bytes
        .get(i)
        .is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        i += 1;
    }
    i
}

/// The JSON array of u32 token ids (at most [`MAX_TOKEN_IDS`]) at byte
/// `start`, and the index just past it: serde's visitor costs ~10 ns a
/// token natively and more in wasm, which made it most of a `/query`.
/// Stricter than JSON only in refusing `-0`.
fn token_list(bytes: &[u8], start: usize) -> Result<(Vec<u32>, usize), String> {
    let mut i = skip_space(bytes, start);
    if bytes.get(i) != Some(&b'[') {
        return Err("expected a list of token ids".into());
    }
    let mut tokens = Vec::with_capacity(4096);
    i = skip_space(bytes, i + 1);
    if bytes.get(i) == Some(&b']') {
        return Ok((tokens, i + 1));
    }
    loop {
        let (value, digits) = number(bytes, i)?;
        if tokens.len() == MAX_TOKEN_IDS {
            return Err(format!("more than {MAX_TOKEN_IDS} items"));
        }
        tokens.push(value);
        i = skip_space(bytes, i + digits);
        match bytes.get(i) {
            Some(b',') => i = skip_space(bytes, i + 1),
            Some(b']') => return Ok((tokens, i + 1)),
            _ => return Err(format!("expected , or ] at byte {i}")),
        }
    }
}

/// The token array at byte `start` as raw JSON, unchecked: the bytes up to
/// its first `]` (an array of numbers has no other), for a
/// [`TokenJsonHasher`] to parse. Found by `memchr` (a word at a time): a
/// byte loop is most of the cost of skipping a prompt in wasm.
fn raw_token_list(bytes: &[u8], start: usize) -> Result<(&[u8], usize), String> {
    let end = memchr::memchr(b']', &bytes[start..])
        .map(|at| start + at + 1)
        .ok_or("no ] after the token ids")?;
    Ok((&bytes[start..end], end))
}

/// A whole input of one JSON array of u32 token ids (whitespace around it
/// allowed), at most [`MAX_TOKEN_IDS`]: what [`TokenJsonHasher`]s accept,
/// with the rules of `/query`'s in-place parser.
pub fn token_array(json: &[u8]) -> Result<Vec<u32>, String> {
    let (tokens, end) = token_list(json, 0)?;
    if skip_space(json, end) != json.len() {
        return Err(format!("trailing characters at byte {end}"));
    }
    Ok(tokens)
}

/// The u32 written in decimal at `bytes[at..]` and its length in digits.
/// Up to 7 digits are read 8 bytes at a time (SWAR): a few multiplies
/// instead of a loop iteration per digit, which matters most in wasm,
/// where every loop back-edge also checks the epoch deadline.
fn number(bytes: &[u8], at: usize) -> Result<(u32, usize), String> {
    let (value, digits) = match bytes.get(at..at + 8) {
        Some(word) => {
            let word = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            const HIGH: u64 = 0xf0f0_f0f0_f0f0_f0f0;
            // A byte of `flags` is 0 iff the byte is an ASCII digit (its
            // high nibble is 3, and stays 3 when 6 is added). A carry out
            // of a byte >= 0xfa only affects the bytes after it.
            let flags = ((word & HIGH) | ((word.wrapping_add(0x0606_0606_0606_0606) & HIGH) >> 4))
                ^ 0x3333_3333_3333_3333;
            match flags.trailing_zeros() as usize / 8 {
                8 => scalar_number(bytes, at)?,
                n => (u64::from(swar_digits(word, n)), n),
            }
        }
        None => scalar_number(bytes, at)?,
    };
    if digits == 0 || (bytes[at] == b'0' && digits > 1) {
        return Err(format!("expected a token id at byte {at}"));
    }
    if value > u64::from(u32::MAX) {
        return Err("a token id is above u32::MAX".into());
    }
    Ok((value as u32, digits))
}

/// The value of the first `n` (< 8) bytes of `word`, ASCII digits, most
/// significant first.
fn swar_digits(word: u64, n: usize) -> u32 {
    if n == 0 {
        return 0;
    }
    // The digits move to the top bytes; the bytes below become zeros
    // (leading zeros of an 8-digit number).
    let mut v = (word << (8 * (8 - n))) & 0x0f0f_0f0f_0f0f_0f0f;
    v = (v.wrapping_mul(10 * (1 << 8) + 1) >> 8) & 0x00ff_00ff_00ff_00ff;
    v = (v.wrapping_mul(100 * (1 << 16) + 1) >> 16) & 0x0000_ffff_0000_ffff;
    v = v.wrapping_mul(10_000 * (1 << 32) + 1) >> 32;
    v as u32
}

/// The digits at `bytes[at..]` one by one (the last bytes of a body, or 8
/// digits and more); stops once the value is above u32::MAX.
fn scalar_number(bytes: &[u8], at: usize) -> Result<(u64, usize), String> {
    let mut i = at;
    let mut value = 0u64;
    while let Some(digit) = bytes.get(i).filter(|b| b.is_ascii_digit()) {
        value = value * 10 + u64::from(digit - b'0');
        if value > u64::from(u32::MAX) {
            return Err("a token id is above u32::MAX".into());
        }
        i += 1;
    }
    Ok((value, i - at))
}

#[cfg(test)]
mod tests {
    use super::QueryRequest;
    use proptest::prelude::*;

    /// A `/query` body parsed in place.
    fn parse(body: &[u8]) -> Result<QueryRequest<Vec<u32>>, String> {
        QueryRequest::parse(body, super::token_list)
    }

    /// `raw` as a whole body's token list: parsed by the one-pass reader.
    fn token_list(raw: &str) -> Result<Vec<u32>, String> {
        let body = format!("{{\"model_name\": \"m\", \"token_ids\": {raw}}}");
        parse(body.as_bytes()).map(|q| q.token_ids)
    }

    #[test]
    fn query_bodies_parse_like_serde_would() {
        let q = parse(
            br#" {"x": {"a": [1, "]"]}, "token_ids": [1, 2], "routing_group": "t\u0041",
                  "lora_name": null, "model_name": "m\"n"} "#,
        )
        .unwrap();
        assert_eq!(q.token_ids, [1, 2]);
        assert_eq!(q.model_name, "m\"n");
        assert_eq!((q.routing_group.as_str(), q.tenant_id), ("tA", None));
        assert_eq!(q.lora_name, None);
        let q = parse(
            br#"{"model_name":"m","token_ids":[],"lora_name":"a","tenant_id":"t","cache_salt":"s"}"#,
        )
        .unwrap();
        assert_eq!(
            (
                q.routing_group.as_str(),
                q.tenant_id.as_deref(),
                q.lora_name.as_deref(),
                q.cache_salt.as_deref()
            ),
            ("default", Some("t"), Some("a"), Some("s"))
        );
        for bad in [
            &br#"{"model_name": "m"}"#[..],
            br#"{"token_ids": []}"#,
            br#"{"token_ids": [], "model_name": "m", "token_ids": []}"#,
            br#"{"token_ids": [], "model_name": "m", "tenant_id": null}"#,
            br#"{"token_ids": [], "model_name": "m", "routing_group": null}"#,
            br#"{"token_ids": [], "model_name": 5}"#,
            br#"{"token_ids": [], "model_name": "m",}"#,
            br#"{"token_ids": [], "model_name": "m"} x"#,
            br#"{"token_ids": [] "model_name": "m"}"#,
            br#"{"token_ids": [], "model_name": "m""#,
            br#"[]"#,
            b"",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn token_lists_refuse_what_json_or_u32_refuses() {
        assert_eq!(token_list(" [ ] "), Ok(vec![]));
        assert_eq!(token_list("[0,4294967295]"), Ok(vec![0, u32::MAX]));
        for bad in [
            "",
            "[",
            "]",
            "[1,]",
            "[,1]",
            "[1 2]",
            "[01]",
            "[-1]",
            "[-0]",
            "[1.5]",
            "[1e3]",
            "[4294967296]",
            "[\"1\"]",
            "[1] x",
            "{}",
            "[null]",
            "[99999999999999999999999]",
        ] {
            assert!(token_list(bad).is_err(), "{bad:?}");
        }
    }

    /// Every length of number (the 8-byte reads and the byte loop), next
    /// to every kind of byte after it.
    #[test]
    fn numbers_of_every_length_next_to_any_byte() {
        for digits in 1..=10 {
            let n: u64 = "4123456789"[..digits].parse().unwrap();
            for after in ["]", ",1]", " ]", "]é", "]:", "]/", "]\u{ff}", "]00000000"] {
                let text = format!("[{n}{after}");
                let expected = serde_json::Deserializer::from_str(&text)
                    .into_iter::<Vec<u32>>()
                    .next()
                    .unwrap()
                    .unwrap();
                assert_eq!(
                    super::token_list(text.as_bytes(), 0).unwrap().0,
                    expected,
                    "{text}"
                );
            }
        }
        for bad in ["[1a]", "[1:]", "[12/]", "[0012]", "[1234567:]"] {
            assert!(super::token_list(bad.as_bytes(), 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn raw_token_lists_end_at_the_first_close_bracket() {
        for len in 0..40 {
            for at in 0..len {
                let mut text = vec![b'1'; len];
                text[at] = b']';
                text[len - 1] = b']';
                let (raw, end) = super::raw_token_list(&text, 0).unwrap();
                assert_eq!((raw.len(), end), (at + 1, at + 1), "{len} {at}");
            }
            assert!(super::raw_token_list(&vec![b'1'; len], 0).is_err());
        }
    }

    /// An indexer with the raw-JSON hasher (the guest's path) answers
    /// every `/query` exactly as one that parses in place: valid bodies in
    /// any field order, and each kind of error the fast path leaves to
    /// the in-place path.
    #[test]
    fn token_json_hasher_answers_like_the_in_place_parser() {
        use crate::hash::{token_json_blocks, xxh3_blocks};
        use crate::{Event, EventData, Indexer, Stored};
        let mut plain = Indexer::default();
        let mut raw = Indexer::default().with_token_json_hasher(token_json_blocks);
        let tokens: Vec<u32> = (0..64).collect();
        let register =
            br#"{"instance_id": 7, "endpoint": "tcp://h:1", "model_name": "m", "block_size": 16}"#;
        let stored = Event {
            worker_id: 7,
            dp_rank: 0,
            event_id: 1,
            model: None,
            tenant: None,
            data: EventData::Stored(Stored {
                block_hashes: vec![1, 2, 3],
                token_ids: tokens[..48].to_vec(),
                ..Stored::default()
            }),
        };
        for indexer in [&mut plain, &mut raw] {
            assert_eq!(indexer.handle("POST", "/register", "", register).0, 201);
            assert_eq!(indexer.ingest(std::slice::from_ref(&stored)), 0);
        }
        let too_long = format!(
            "{{\"model_name\": \"m\", \"token_ids\": {:?}}}",
            vec![1; crate::MAX_TOKEN_IDS + 1]
        );
        let bodies = [
            format!(r#"{{"model_name": "m", "token_ids": {tokens:?}}}"#),
            format!(
                r#"{{"token_ids": {:?} , "model_name": "m", "tenant_id": "default"}}"#,
                &tokens[..40]
            ),
            r#"{"token_ids": [1, 2, "]"], "model_name": "m"}"#.into(),
            r#"{"token_ids": [1, 2.5], "model_name": "m"}"#.into(),
            r#"{"token_ids": [1, 2], "model_name": "m", "token_ids": []}"#.into(),
            r#"{"token_ids": [1, 2, "model_name": "m"}"#.into(),
            r#"{"token_ids": [1, 2] "model_name": "m"}"#.into(),
            r#"{"token_ids": [1, 4294967296], "model_name": "other"}"#.into(),
            r#"{"token_ids": [1, 2], "model_name": "other"}"#.into(),
            r#"{"token_ids": [1, 2]"#.into(),
            too_long,
        ];
        for body in &bodies {
            let expected = plain.handle("POST", "/query", "", body.as_bytes());
            assert_eq!(
                raw.handle("POST", "/query", "", body.as_bytes()),
                expected,
                "{body:.80}"
            );
        }
        let scored = plain.handle("POST", "/query", "", bodies[0].as_bytes());
        assert_eq!(scored.0, 200);
        assert!(
            String::from_utf8(scored.1)
                .unwrap()
                .contains(r#"{"7":{"0":48}}"#)
        );
        assert_eq!(
            token_json_blocks(b" [0,1,2,3] ", 2, 9),
            Ok(xxh3_blocks(&[0, 1, 2, 3], 2, 9))
        );
        for bad in [&b"[1,2] x"[..], b"[1,-2]", b"", b"[1,2"] {
            assert!(token_json_blocks(bad, 2, 9).is_err());
        }
    }

    /// A worker fed over NATS has no ZMQ endpoint: it registers without
    /// one, and its RouterEvents (no model, no block size) are placed by
    /// that registration.
    #[test]
    fn a_worker_registers_without_an_endpoint_and_its_events_are_placed() {
        use crate::{Event, EventData, Indexer, Stored};
        let mut indexer = Indexer::default();
        let register = br#"{"instance_id": 7, "model_name": "m", "block_size": 16}"#;
        assert_eq!(indexer.handle("POST", "/register", "", register).0, 201);
        let (status, workers) = indexer.handle("GET", "/workers", "", b"");
        assert_eq!(status, 200);
        let workers: serde_json::Value = serde_json::from_slice(&workers).unwrap();
        assert_eq!(
            workers,
            serde_json::json!([{"instance_id": 7, "model_name": "m", "routing_group": "default",
                "block_size": 16, "endpoints": {"0": null}}])
        );
        let stored = Event {
            worker_id: 7,
            dp_rank: 0,
            event_id: 1,
            model: None,
            tenant: None,
            data: EventData::Stored(Stored {
                block_hashes: vec![100, 101],
                tokens_hashes: vec![15310707395893867146, 15292316782987903195],
                ..Stored::default()
            }),
        };
        assert_eq!(indexer.ingest(&[stored]), 0, "placed by the registration");
        let query = br#"{"token_ids": [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31], "model_name": "m"}"#;
        let (status, answer) = indexer.handle("POST", "/query", "", query);
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(
            (status, &answer["scores"]),
            (200, &serde_json::json!({"7": {"0": 32}}))
        );
    }

    /// An indexer hashing each batch in one call (the guest's path)
    /// applies a mixed batch exactly as one hashing event by event.
    #[test]
    fn runs_hasher_ingests_like_per_event_hashing() {
        use crate::hash::xxh3_runs;
        use crate::{Event, EventData, Indexer, Stored};
        let stored = |id: u64, parent, tokens: std::ops::Range<u32>, size, lora: Option<&str>| {
            let blocks = (tokens.len() / 4) as u64;
            Event {
                worker_id: 3,
                dp_rank: 0,
                event_id: id,
                model: Some("m".into()),
                tenant: None,
                data: EventData::Stored(Stored {
                    block_hashes: (id * 100..id * 100 + blocks).collect(),
                    parent_hash: parent,
                    token_ids: tokens.collect(),
                    block_size: size,
                    lora_name: lora.map(Into::into),
                    ..Stored::default()
                }),
            }
        };
        let mut by_hash = stored(6, Some(402), 0..0, Some(4), None);
        if let EventData::Stored(s) = &mut by_hash.data {
            s.block_hashes = vec![600, 601];
            s.tokens_hashes = vec![7, 8];
        }
        let batch = [
            stored(1, None, 0..18, Some(4), None),
            stored(2, Some(103), 18..30, None, None),
            stored(3, Some(103), 30..38, Some(8), None),
            stored(4, Some(202), 38..50, Some(4), Some("a")),
            stored(5, Some(999), 50..54, Some(4), None),
            by_hash,
            stored(7, Some(601), 54..62, Some(0), None),
        ];
        let mut plain = Indexer::default();
        let mut runs = Indexer::default().with_runs_hasher(|t, r| xxh3_runs(t, r).unwrap());
        assert_eq!(plain.ingest(&batch), 2);
        assert_eq!(runs.ingest(&batch), 2);
        assert_eq!(runs.counters(), plain.counters());
        assert_eq!(plain.counters().blocks_stored, 4 + 3 + 3 + 2 + 2);
        let dump = |indexer: &mut Indexer| indexer.handle("GET", "/dump", "", b"");
        assert_eq!(dump(&mut runs), dump(&mut plain));
        let query = br#"{"model_name": "m", "token_ids": [0,1,2,3,4,5,6,7]}"#;
        let answer = runs.handle("POST", "/query", "", query);
        assert_eq!(answer, plain.handle("POST", "/query", "", query));
        assert!(
            String::from_utf8(answer.1)
                .unwrap()
                .contains(r#""scores":{"3":{"0":8}}"#)
        );
    }

    proptest! {
        /// Any list of u32, however spaced, parses to itself.
        #[test]
        fn lists_round_trip(tokens in prop::collection::vec(prop_oneof![any::<u32>(), 0u32..10_000_000], 0..64),
                            spaces in prop::collection::vec(prop::sample::select(vec!["", " ", "\n", "\t ", "\r\n"]), 130)) {
            let mut text = format!("{}[", spaces[0]);
            for (n, t) in tokens.iter().enumerate() {
                if n > 0 {
                    text.push(',');
                }
                text.push_str(spaces[2 * n + 1]);
                text.push_str(&t.to_string());
                text.push_str(spaces[2 * n + 2]);
            }
            text.push(']');
            text.push_str(spaces[129]);
            prop_assert_eq!(token_list(&text), Ok(tokens));
        }

        /// Whatever it accepts, serde_json reads as the same list.
        #[test]
        fn accepts_only_what_serde_accepts(text in "[ \\[\\]0-9,.e-]{0,24}") {
            if let Ok(tokens) = token_list(&text) {
                prop_assert_eq!(serde_json::from_str::<Vec<u32>>(&text).ok(), Some(tokens));
            }
        }
    }
}
