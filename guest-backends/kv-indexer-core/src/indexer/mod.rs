//! Registrations, the trees, event ingest and the HTTP API.

mod snapshot;

use std::collections::BTreeMap;

use kvwasm_indexer_protocol::api::{
    InstanceOverlap, QueryByHashRequest, RegisterRequest, ScoreResponse, UnregisterRequest,
    default_group,
};

use crate::hash::{self, BlockHasher, HashRun, RunsHasher, TokenJsonHasher};
use crate::query_body::{QueryRequest, query_request, raw_token_list};
use crate::reply::{Reply, error, json, parse};
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

impl<T> QueryRequest<T> {
    /// The seed of its block hashes: its adapter (else the tree's) and
    /// salt.
    fn seed(&self, index: &Index) -> u64 {
        let lora = self.lora_name.as_deref().or(index.lora_name.as_deref());
        hash::query_seed(lora, self.cache_salt.as_deref())
    }
}

#[cfg(test)]
mod tests;
