//! `GET /dump` and `POST /restore`: the trees as Dynamo's dump document.

use std::collections::BTreeMap;

use kvwasm_indexer_protocol::dump::{
    Dump, DumpIndex, KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData,
    RouterEvent, device_tier, dump_key, split_dump_key,
};

use super::{Index, Indexer, count_error};
use crate::reply::{error, json};

impl Indexer {
    /// Every index as Dynamo's `/dump` gives it: a breadth-first list of
    /// one-block store events per worker per reachable node, with each
    /// worker's own engine hashes ([`Tree::walk`]).
    pub(super) fn dump(&self) -> Dump {
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
    pub(super) fn restore(&mut self, dump: Dump) -> (u16, Vec<u8>) {
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
