//! Where the host's block hashing is not linked (libkv_store_wasm.so; this
//! test process, which installs no extension, stands for it), a component
//! importing `kvwasm:events/block-hash` still loads (the event subscriber
//! worlds, the storage advisor's included, import it), and a call is
//! refused with the reason.

use kvwasm_host::KvError;
use kvwasm_host::subscriber::{BlocksStored, Event, EventData, SourceKind, Subscriber};

/// A config in `dir` naming the KV indexer's file as subscriber `idx` (a
/// file, not `builtin:kv-indexer`, which this process does not link), with
/// `extra` lines in its entry.
fn indexer_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("kvwasm.toml");
    std::fs::write(
        &path,
        format!(
            "[subscribers.idx]\ncomponent = {:?}\n{extra}",
            kvwasm_guest_artifacts::KV_INDEXER_PATH
        ),
    )
    .unwrap();
    path
}

#[test]
fn a_block_hash_call_is_refused_with_the_reason_where_hashing_is_not_linked() {
    let dir = tempfile::tempdir().unwrap();
    let path = indexer_config(dir.path(), "");
    let subscriber = Subscriber::from_config(&path, "idx").expect("loads without the hashing");
    // Two full blocks of raw token ids: the indexer hashes them through
    // `hash-runs` (prehash_tokens is off for a file).
    let mut stored = [Event {
        worker_id: 1,
        dp_rank: 0,
        event_id: 1,
        source: SourceKind::Zmq,
        model: Some("m".into()),
        tenant: Some("default".into()),
        data: EventData::Stored(BlocksStored {
            block_hashes: vec![100, 101],
            parent_hash: None,
            token_ids: (0..32).collect(),
            tokens_hashes: Vec::new(),
            block_size: Some(16),
            lora_name: None,
            tier: None,
        }),
    }];
    let err = subscriber
        .on_batch(&mut stored)
        .expect_err("hashing refused");
    assert!(matches!(err, KvError::Trapped(_)), "{err}");
    assert!(
        err.to_string()
            .contains("kvwasm:events/block-hash is not linked into this program"),
        "{err}"
    );
}

#[test]
fn a_subscriber_asking_for_prehashed_tokens_is_refused_where_hashing_is_not_linked() {
    let dir = tempfile::tempdir().unwrap();
    let path = indexer_config(dir.path(), "prehash_tokens = true\n");
    let Err(err) = Subscriber::from_config(&path, "idx") else {
        panic!("a subscriber asking for prehashed tokens started without the hashing");
    };
    assert!(
        err.to_string().contains("needs the host's block hashing"),
        "{err}"
    );
}
