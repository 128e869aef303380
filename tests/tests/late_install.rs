//! An extension installed after a component was loaded (a test, a program
//! embedding the host) is linked into every later load of it: the
//! per-process cache of loaded components is kept per set of extensions.
//! Its own test binary, so no other test installs the extension first.

use kvwasm_host::subscriber::{BlocksStored, Event, EventData, SourceKind, Subscriber};

fn raw_tokens() -> [Event; 1] {
    [Event {
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
    }]
}

#[test]
fn a_component_loaded_before_an_extension_is_installed_is_linked_with_it_after() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kvwasm.toml");
    // The KV indexer as a file: the same bytes before and after.
    std::fs::write(
        &path,
        format!(
            "[subscribers.idx]\ncomponent = {:?}\n",
            kvwasm_guest_artifacts::KV_INDEXER_PATH
        ),
    )
    .unwrap();
    let before = Subscriber::from_config(&path, "idx").unwrap();
    let err = before
        .on_batch(&mut raw_tokens())
        .expect_err("no hashing linked yet");
    assert!(err.to_string().contains("is not linked"), "{err}");

    kvwasm_kv_indexer_host::install();
    let after = Subscriber::from_config(&path, "idx").unwrap();
    after
        .on_batch(&mut raw_tokens())
        .expect("the block hashing installed since is linked");
}
