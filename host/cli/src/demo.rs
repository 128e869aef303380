//! `kvwasm demo`: a simulated inference engine saving and restoring
//! sessions through the shim, as llama.cpp's v2 slot save does.
//!
//! Each session's KV state is laid out like `llama_state_seq_get_data`: per
//! layer, K rows then V rows, one row per token. Sessions share a prompt
//! prefix, so their leading rows are identical and the chunks that hold
//! them deduplicate across sessions. Chunks are keyed by xxh3-64 (8 bytes),
//! the manifest lists the keys, and restore uses `prefetch_chunks` then
//! `get_chunk`, verifying every byte.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Args;

use crate::consumer::load_shim;

/// Simulate an inference engine saving and restoring sessions that share a
/// long prompt prefix, through libkv_store_wasm.so into the embedded,
/// sandboxed filesystem backend.
#[derive(Args)]
pub struct DemoArgs {
    /// Store directory (default: a temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Open this URI instead of `wasm://<dir>` (e.g. a configured backend).
    #[arg(long)]
    uri: Option<String>,
    /// Path of libkv_store_wasm.so (default: $KV_STORE_LIBRARY_PATH/, then
    /// next to this executable, then the system loader's search path).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Number of sessions to save and restore.
    #[arg(long, default_value_t = 6)]
    sessions: u32,
    /// Tokens of the prompt prefix all sessions share.
    #[arg(long, default_value_t = 3072)]
    prefix_tokens: u32,
    /// Tokens unique to each session.
    #[arg(long, default_value_t = 1024)]
    unique_tokens: u32,
    /// Model layers (each contributes a K and a V row per token).
    #[arg(long, default_value_t = 12)]
    layers: u32,
    /// Bytes of one K or V row (n_embd_k_gqa x sizeof(f16)).
    #[arg(long, default_value_t = 1024)]
    row_bytes: u32,
    /// Tokens per chunk (chunk size = tokens x row bytes).
    #[arg(long, default_value_t = 1024)]
    chunk_tokens: u32,
}

/// One session's serialized state, already cut into chunks.
struct Session {
    name: String,
    chunks: Vec<Vec<u8>>,
    keys: Vec<[u8; 8]>,
}

impl DemoArgs {
    /// Row bytes of token `t` of stream `s` (a layer's K or V) in session
    /// `session`: a row depends on the whole prefix up to `t`, so rows agree
    /// across sessions exactly within the shared prefix.
    fn row(&self, stream: u32, token: u32, session: u32, out: &mut [u8]) {
        let owner = if token < self.prefix_tokens {
            u32::MAX
        } else {
            session
        };
        let id = [
            stream.to_le_bytes(),
            token.to_le_bytes(),
            owner.to_le_bytes(),
        ]
        .concat();
        let mut x = xxhash_rust::xxh3::xxh3_64(&id) | 1;
        for word in out.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
        }
    }

    fn session(&self, index: u32) -> Session {
        let tokens = self.prefix_tokens + self.unique_tokens;
        let row = self.row_bytes as usize;
        let mut chunks = Vec::new();
        for stream in 0..self.layers * 2 {
            for first in (0..tokens).step_by(self.chunk_tokens as usize) {
                let last = (first + self.chunk_tokens).min(tokens);
                let mut chunk = vec![0u8; (last - first) as usize * row];
                for (i, t) in (first..last).enumerate() {
                    self.row(stream, t, index, &mut chunk[i * row..(i + 1) * row]);
                }
                chunks.push(chunk);
            }
        }
        let keys = chunks
            .iter()
            .map(|c| xxhash_rust::xxh3::xxh3_64(c).to_le_bytes())
            .collect();
        Session {
            name: format!("session-{index}.slot"),
            chunks,
            keys,
        }
    }
}

/// Manifest: a small header (magic, token count, chunk count) and the keys.
fn manifest(args: &DemoArgs, session: &Session) -> Vec<u8> {
    let mut m = b"ggsq".to_vec();
    m.extend_from_slice(&4u32.to_le_bytes());
    m.extend_from_slice(&(args.prefix_tokens + args.unique_tokens).to_le_bytes());
    m.extend_from_slice(&(session.keys.len() as u32).to_le_bytes());
    for key in &session.keys {
        m.extend_from_slice(key);
    }
    m
}

fn mb_per_s(bytes: u64, time: Duration) -> f64 {
    bytes as f64 / 1e6 / time.as_secs_f64().max(1e-9)
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    ensure!(
        args.chunk_tokens > 0 && args.row_bytes > 0 && args.layers > 0,
        "sizes must be positive"
    );
    let lib = load_shim(args.lib.clone())?;
    let tmp;
    let uri = match (&args.uri, &args.dir) {
        (Some(uri), _) => uri.clone(),
        (None, Some(dir)) => format!("wasm://{}", std::path::absolute(dir)?.display()),
        (None, None) => {
            tmp = tempfile::Builder::new().prefix("kvwasm-demo-").tempdir()?;
            format!("wasm://{}", tmp.path().display())
        }
    };
    println!(
        "kvwasm demo: {} sessions through {}",
        args.sessions,
        lib.path().display()
    );
    println!("  store          {uri}");
    println!(
        "  model          {} layers, {} B rows, {} prefix + {} unique tokens, {} KiB chunks",
        args.layers,
        args.row_bytes,
        args.prefix_tokens,
        args.unique_tokens,
        args.chunk_tokens * args.row_bytes / 1024
    );

    let started = Instant::now();
    let store = lib
        .open_store(&uri)
        .with_context(|| format!("open({uri}) returned NULL (see the log above)"))?;
    let first_open = started.elapsed();
    let started = Instant::now();
    drop(lib.open_store(&uri).context("second open failed")?);
    let second_open = started.elapsed();
    println!(
        "  open           first {:.2} ms (engine start, component load), again {:.3} ms",
        first_open.as_secs_f64() * 1e3,
        second_open.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "  {:<18} {:>7} {:>7} {:>9} {:>10} {:>10} {:>11}",
        "session", "chunks", "dedup", "written", "save ms", "restore ms", "verified"
    );

    let (mut total_puts, mut total_dups, mut total_bytes, mut written_bytes) =
        (0u64, 0u64, 0u64, 0u64);
    let (mut save_time, mut restore_time) = (Duration::ZERO, Duration::ZERO);
    for index in 0..args.sessions {
        let session = args.session(index);
        let manifest = manifest(&args, &session);

        let started = Instant::now();
        let mut dups = 0u64;
        let mut written = 0u64;
        for (key, chunk) in session.keys.iter().zip(&session.chunks) {
            match store.put_chunk(key, chunk) {
                Ok(true) => dups += 1,
                Ok(false) => written += chunk.len() as u64,
                Err(rc) => bail!("put_chunk returned {rc}"),
            }
        }
        store
            .put_manifest(&session.name, &manifest)
            .map_err(|rc| anyhow::anyhow!("put_manifest returned {rc}"))?;
        let save = started.elapsed();

        let started = Instant::now();
        let got_manifest = store
            .get_manifest(&session.name)
            .map_err(|rc| anyhow::anyhow!("get_manifest returned {rc}"))?;
        let keys: Vec<&[u8]> = got_manifest[16..].chunks(8).collect();
        if lib.has_prefetch() {
            store
                .prefetch_chunks(&keys)
                .map_err(|rc| anyhow::anyhow!("prefetch_chunks returned {rc}"))?;
        }
        let restored = keys
            .iter()
            .map(|k| {
                store
                    .get_chunk(k)
                    .map_err(|rc| anyhow::anyhow!("get_chunk returned {rc}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let restore = started.elapsed();

        ensure!(
            *got_manifest == *manifest,
            "{}: manifest differs",
            session.name
        );
        let bytes: u64 = session.chunks.iter().map(|c| c.len() as u64).sum();
        for (got, want) in restored.iter().zip(&session.chunks) {
            ensure!(
                got.as_slice() == want.as_slice(),
                "{}: restored chunk differs",
                session.name
            );
        }
        println!(
            "  {:<18} {:>7} {:>7} {:>7.1}MB {:>10.1} {:>10.1} {:>9.1}MB",
            session.name,
            session.chunks.len(),
            dups,
            written as f64 / 1e6,
            save.as_secs_f64() * 1e3,
            restore.as_secs_f64() * 1e3,
            bytes as f64 / 1e6
        );
        total_puts += session.chunks.len() as u64;
        total_dups += dups;
        total_bytes += bytes;
        written_bytes += written;
        save_time += save;
        restore_time += restore;
    }
    println!();
    println!(
        "  total: {total_puts} chunk puts, {total_dups} dedup hits ({:.0}%), {:.1} MB written of {:.1} MB saved",
        100.0 * total_dups as f64 / total_puts.max(1) as f64,
        written_bytes as f64 / 1e6,
        total_bytes as f64 / 1e6
    );
    println!(
        "  save    {:>8.1} ms   {:>7.0} MB/s of session state ({:.0} MB/s written)",
        save_time.as_secs_f64() * 1e3,
        mb_per_s(total_bytes, save_time),
        mb_per_s(written_bytes, save_time)
    );
    println!(
        "  restore {:>8.1} ms   {:>7.0} MB/s, every byte verified",
        restore_time.as_secs_f64() * 1e3,
        mb_per_s(total_bytes, restore_time)
    );
    Ok(())
}
