//! What a fabric server counts: per connection and server-wide.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a server (all connections so far) or of one connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Connections accepted (including those refused as over the cap).
    pub connections: u64,
    /// PUSHes verified and acted on.
    pub frames_ok: u64,
    /// PUSHes refused: a bad frame or message, a limit, poisoning.
    pub frames_refused: u64,
    /// PUSHes the store failed.
    pub frames_failed: u64,
    /// Chunks the store did not already hold.
    pub chunks_stored: u64,
    /// Bytes of those chunks.
    pub chunk_bytes_stored: u64,
    /// Queries answered.
    pub queries: u64,
    /// Manifests published.
    pub manifests_stored: u64,
}

/// What a [`Stats`] counts.
#[derive(Debug, Clone, Copy)]
pub(super) enum Event {
    Connection,
    FrameOk,
    Refused,
    Failed,
    ChunkStored(u64),
    Query,
    Manifest,
}

impl Stats {
    pub(super) fn apply(&mut self, event: Event) {
        match event {
            Event::Connection => self.connections += 1,
            Event::FrameOk => self.frames_ok += 1,
            Event::Refused => self.frames_refused += 1,
            Event::Failed => self.frames_failed += 1,
            Event::ChunkStored(bytes) => {
                self.chunks_stored += 1;
                self.chunk_bytes_stored += bytes;
            }
            Event::Query => self.queries += 1,
            Event::Manifest => self.manifests_stored += 1,
        }
    }
}

/// The server-wide [`Stats`], updated by every connection thread.
#[derive(Debug, Default)]
pub(super) struct Counters([AtomicU64; 8]);

impl Counters {
    pub(super) fn apply(&self, event: Event) {
        let add = |i: usize, n: u64| self.0[i].fetch_add(n, Ordering::Relaxed);
        match event {
            Event::Connection => add(0, 1),
            Event::FrameOk => add(1, 1),
            Event::Refused => add(2, 1),
            Event::Failed => add(3, 1),
            Event::ChunkStored(bytes) => {
                add(4, 1);
                add(5, bytes)
            }
            Event::Query => add(6, 1),
            Event::Manifest => add(7, 1),
        };
    }

    pub(super) fn snapshot(&self) -> Stats {
        let get = |i: usize| self.0[i].load(Ordering::Relaxed);
        Stats {
            connections: get(0),
            frames_ok: get(1),
            frames_refused: get(2),
            frames_failed: get(3),
            chunks_stored: get(4),
            chunk_bytes_stored: get(5),
            queries: get(6),
            manifests_stored: get(7),
        }
    }
}
