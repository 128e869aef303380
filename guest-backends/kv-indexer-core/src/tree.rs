//! One radix tree of cached blocks, as Dynamo's standalone indexer keeps it
//! per (model, tenant): nodes keyed under their parent by the local block
//! hash, each holding the set of workers that cache it, plus a per-worker
//! table from the engine's block hash to the node (for parents and
//! removals).
//!
//! Nodes live in an arena (indices, not `Rc`s) so a tree of millions of
//! blocks is a few flat vectors, cheap to build inside a wasm guest. A node
//! is freed once no worker's table refers to it. As in Dynamo, a node that
//! loses its last worker is cut from its parent and drops its children:
//! those become orphans, still in their workers' tables (so they count in
//! `tree_sizes` and can be parents of new blocks) but unreachable by
//! queries, until the same worker stores their parent again and they are
//! reattached.

use std::collections::{BTreeMap, HashMap};

use crate::fold::Fold;
use crate::table::Table;

/// A worker: (instance id, data-parallel rank).
pub type Worker = (u64, u32);

/// Index of a node in the arena.
type NodeId = u32;
const ROOT: NodeId = 0;
/// `parent` of a node not linked under any other node.
const DETACHED: NodeId = NodeId::MAX;

/// Why a store or removal was not (fully) applied; the blocks before the
/// failure stay applied, as in Dynamo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyError {
    /// The parent hash is not one of this worker's blocks.
    ParentNotFound,
    /// A removed hash is not one of this worker's blocks (the others were
    /// removed).
    BlockNotFound,
    /// A block would become its own ancestor.
    InvalidSequence,
}

/// Matched blocks per worker, and the size of each matched worker's table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Overlap {
    pub scores: BTreeMap<Worker, u32>,
    pub tree_sizes: BTreeMap<Worker, usize>,
}

struct Node {
    parent: NodeId,
    /// Key under the parent.
    local: u64,
    /// The engine hash of the worker that created the node: a dump's
    /// parent hash for a worker that no longer holds the parent.
    ext: u64,
    children: Children,
    /// Interned indices of the workers holding the block.
    workers: Holders,
    /// Entries of worker tables pointing here; the node is freed at 0.
    refs: u32,
}

/// A sorted set of interned workers. Most blocks are held by one worker:
/// no allocation for them.
enum Holders {
    One(u32),
    Many(Vec<u32>),
}

impl Default for Holders {
    fn default() -> Self {
        Holders::Many(Vec::new())
    }
}

impl Holders {
    fn as_slice(&self) -> &[u32] {
        match self {
            Holders::One(w) => std::slice::from_ref(w),
            Holders::Many(ws) => ws,
        }
    }

    fn insert(&mut self, w: u32) {
        match self {
            Holders::One(one) if *one == w => {}
            Holders::One(one) => {
                *self = Holders::Many(if *one < w {
                    vec![*one, w]
                } else {
                    vec![w, *one]
                })
            }
            Holders::Many(ws) if ws.is_empty() => *self = Holders::One(w),
            Holders::Many(ws) => {
                if let Err(at) = ws.binary_search(&w) {
                    ws.insert(at, w);
                }
            }
        }
    }

    /// Whether `w` was there.
    fn remove(&mut self, w: u32) -> bool {
        match self {
            Holders::One(one) if *one == w => {
                *self = Holders::default();
                true
            }
            Holders::One(_) => false,
            Holders::Many(ws) => match ws.binary_search(&w) {
                Ok(at) => {
                    ws.remove(at);
                    true
                }
                Err(_) => false,
            },
        }
    }
}

/// Most nodes have at most one child: no map for them.
enum Children {
    None,
    One(u64, NodeId),
    Many(Table),
}

impl Children {
    fn get(&self, key: u64) -> Option<NodeId> {
        match self {
            Children::None => None,
            Children::One(k, v) => (*k == key).then_some(*v),
            Children::Many(map) => map.get(key),
        }
    }

    fn insert(&mut self, key: u64, id: NodeId) {
        match self {
            Children::None => *self = Children::One(key, id),
            Children::One(k, _) if *k == key => *self = Children::One(key, id),
            Children::One(k, v) => {
                let mut map = Table::default();
                map.insert(*k, *v);
                map.insert(key, id);
                *self = Children::Many(map);
            }
            Children::Many(map) => {
                map.insert(key, id);
            }
        }
    }

    fn remove(&mut self, key: u64) {
        match self {
            Children::One(k, _) if *k == key => *self = Children::None,
            Children::Many(map) => {
                map.remove(key);
            }
            _ => {}
        }
    }

    fn ids(&self) -> Vec<NodeId> {
        match self {
            Children::None => Vec::new(),
            Children::One(_, v) => vec![*v],
            Children::Many(map) => map.values().collect(),
        }
    }
}

/// A radix tree of one (model, tenant).
pub struct Tree {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    /// Worker → its interned index.
    index: HashMap<Worker, u32, Fold>,
    /// By interned index: the worker and its engine hash → node table.
    workers: Vec<(Worker, Table)>,
}

impl Default for Tree {
    fn default() -> Self {
        Tree {
            nodes: vec![Node {
                parent: DETACHED,
                local: 0,
                ext: 0,
                children: Children::None,
                workers: Holders::default(),
                refs: 0,
            }],
            free: Vec::new(),
            index: HashMap::default(),
            workers: Vec::new(),
        }
    }
}

impl Tree {
    /// Apply a store of `blocks` (engine hash, local hash) after `parent`
    /// (an engine hash of this worker's, or the root).
    pub fn store(
        &mut self,
        worker: Worker,
        parent: Option<u64>,
        blocks: impl IntoIterator<Item = (u64, u64)>,
    ) -> Result<(), ApplyError> {
        let w = self.intern(worker);
        let mut current = match parent {
            None => ROOT,
            Some(hash) => self.workers[w as usize]
                .1
                .get(hash)
                .ok_or(ApplyError::ParentNotFound)?,
        };
        for (ext, local) in blocks {
            let child = match self.nodes[current as usize].children.get(local) {
                Some(child) => child,
                None => match self.workers[w as usize].1.get(ext) {
                    Some(own) if own == current => return Err(ApplyError::InvalidSequence),
                    // The worker's orphan comes back under its new parent,
                    // with its subtree.
                    Some(own) if self.nodes[own as usize].parent == DETACHED => {
                        if self.is_ancestor(own, current) {
                            return Err(ApplyError::InvalidSequence);
                        }
                        self.link(current, local, own);
                        own
                    }
                    _ => {
                        let id = self.alloc(ext);
                        self.link(current, local, id);
                        id
                    }
                },
            };
            self.nodes[child as usize].workers.insert(w);
            match self.workers[w as usize].1.insert(ext, child) {
                None => self.nodes[child as usize].refs += 1,
                Some(old) if old == child => {}
                Some(old) => {
                    self.nodes[child as usize].refs += 1;
                    self.unref(old, w);
                }
            }
            current = child;
        }
        Ok(())
    }

    /// Remove the blocks with these engine hashes from `worker`.
    pub fn remove(&mut self, worker: Worker, hashes: &[u64]) -> Result<(), ApplyError> {
        let Some(&w) = self.index.get(&worker) else {
            return if hashes.is_empty() {
                Ok(())
            } else {
                Err(ApplyError::BlockNotFound)
            };
        };
        let mut result = Ok(());
        for hash in hashes {
            match self.workers[w as usize].1.remove(*hash) {
                Some(node) => self.unref(node, w),
                None => result = Err(ApplyError::BlockNotFound),
            }
        }
        result
    }

    /// Drop every block of `instance` (every rank when `rank` is `None`).
    pub fn remove_worker(&mut self, instance: u64, rank: Option<u32>) {
        let matching: Vec<u32> = self
            .index
            .iter()
            .filter(|((id, r), _)| *id == instance && rank.is_none_or(|rank| rank == *r))
            .map(|(_, &w)| w)
            .collect();
        for w in matching {
            let table = std::mem::take(&mut self.workers[w as usize].1);
            for node in table.values() {
                self.unref(node, w);
            }
        }
    }

    /// Matched blocks of `sequence` (local hashes) per worker: the depth
    /// down to which the worker holds every block of the path.
    pub fn overlap(&self, sequence: &[u64]) -> Overlap {
        let mut overlap = Overlap::default();
        let mut current = ROOT;
        let mut active: Vec<u32> = Vec::new();
        let mut depth = 0u32;
        for &local in sequence {
            let Some(next) = self.nodes[current as usize].children.get(local) else {
                break;
            };
            let held = self.nodes[next as usize].workers.as_slice();
            if depth == 0 {
                active.extend_from_slice(held);
            } else if held != active {
                // Both sorted: one merge keeps the workers still present.
                let mut h = held.iter().peekable();
                active.retain(|w| {
                    while h.next_if(|x| *x < w).is_some() {}
                    let stays = h.peek() == Some(&w);
                    if !stays {
                        overlap.scores.insert(self.workers[*w as usize].0, depth);
                    }
                    stays
                });
            }
            if active.is_empty() {
                break;
            }
            depth += 1;
            current = next;
        }
        for w in active {
            overlap.scores.insert(self.workers[w as usize].0, depth);
        }
        overlap.tree_sizes = overlap
            .scores
            .keys()
            .map(|worker| (*worker, self.size(*worker)))
            .collect();
        overlap
    }

    /// Blocks `worker` holds.
    pub fn size(&self, worker: Worker) -> usize {
        self.index
            .get(&worker)
            .map_or(0, |&w| self.workers[w as usize].1.len())
    }

    /// Blocks all workers hold.
    pub fn total_blocks(&self) -> usize {
        self.workers.iter().map(|(_, table)| table.len()).sum()
    }

    /// The reachable tree, breadth first, parents before children, as
    /// Dynamo's dump lists it: one (worker, parent's engine hash, engine
    /// hash, local hash) per entry of a worker's table whose node is
    /// reachable and held by it. The engine hashes are that worker's own
    /// (its parent's too, when it holds the parent): engines that hash the
    /// same content differently (vLLM's xxhash option, an unset
    /// PYTHONHASHSEED) each get their own mapping back when the dump is
    /// replayed, so their later removals still find their blocks. Dynamo
    /// 1.6.1 dumps one engine hash per node (its first worker's).
    pub fn walk(&self) -> Vec<(Worker, Option<u64>, u64, u64)> {
        // (interned worker, node) → the worker's engine hashes of the node
        // (one, unless it stored the same content under two hashes).
        let mut own: HashMap<(u32, NodeId), Vec<u64>, Fold> = HashMap::default();
        for (w, (_, table)) in self.workers.iter().enumerate() {
            for (ext, node) in table.iter() {
                own.entry((w as u32, node)).or_default().push(ext);
            }
        }
        own.values_mut().for_each(|exts| exts.sort_unstable());
        let mut out = Vec::new();
        let mut queue = std::collections::VecDeque::from(self.nodes[0].children.ids());
        while let Some(id) = queue.pop_front() {
            let node = &self.nodes[id as usize];
            for &w in node.workers.as_slice() {
                // A parent this worker no longer holds keeps the node's own
                // hash, as Dynamo's dump gives it.
                let parent = (node.parent != ROOT).then(|| {
                    own.get(&(w, node.parent))
                        .map_or(self.nodes[node.parent as usize].ext, |exts| exts[0])
                });
                let worker = self.workers[w as usize].0;
                for &ext in own.get(&(w, id)).map_or(&[][..], Vec::as_slice) {
                    out.push((worker, parent, ext, node.local));
                }
            }
            queue.extend(node.children.ids());
        }
        out
    }

    fn intern(&mut self, worker: Worker) -> u32 {
        *self.index.entry(worker).or_insert_with(|| {
            self.workers.push((worker, Table::default()));
            (self.workers.len() - 1) as u32
        })
    }

    fn alloc(&mut self, ext: u64) -> NodeId {
        let node = Node {
            parent: DETACHED,
            local: 0,
            ext,
            children: Children::None,
            workers: Holders::default(),
            refs: 0,
        };
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        }
    }

    fn link(&mut self, parent: NodeId, local: u64, child: NodeId) {
        self.nodes[parent as usize].children.insert(local, child);
        let node = &mut self.nodes[child as usize];
        node.parent = parent;
        node.local = local;
    }

    /// Whether `ancestor` is `node` or above it.
    fn is_ancestor(&self, ancestor: NodeId, mut node: NodeId) -> bool {
        loop {
            if node == ancestor {
                return true;
            }
            if node == DETACHED || node == ROOT {
                return false;
            }
            node = self.nodes[node as usize].parent;
        }
    }

    /// One table entry of worker `w` no longer points at `id`.
    fn unref(&mut self, id: NodeId, w: u32) {
        let node = &mut self.nodes[id as usize];
        node.refs -= 1;
        if node.workers.remove(w) && node.workers.as_slice().is_empty() {
            self.cut(id);
        }
        if self.nodes[id as usize].refs == 0 {
            self.nodes[id as usize].workers = Holders::default();
            self.free.push(id);
        }
    }

    /// Unlink an emptied node from its parent and drop its children (they
    /// become orphans).
    fn cut(&mut self, id: NodeId) {
        let (parent, local) = {
            let node = &self.nodes[id as usize];
            (node.parent, node.local)
        };
        if parent != DETACHED {
            self.nodes[parent as usize].children.remove(local);
        }
        let node = &mut self.nodes[id as usize];
        node.parent = DETACHED;
        let children = std::mem::replace(&mut node.children, Children::None).ids();
        for child in children {
            self.nodes[child as usize].parent = DETACHED;
        }
    }
}
