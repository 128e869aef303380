//! Peer replicas (`/register_peer`, `/deregister_peer`, `/peers`) and
//! fetching the first reachable peer's `/dump`, for startup recovery
//! (events-common.md, "Recovery (1)") and the rebuild of a diverged
//! indexer. Peers never synchronise live.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// How long one peer may take to answer `/dump`.
const DUMP_TIMEOUT: Duration = Duration::from_secs(30);

/// The peer URLs, in registration order, without duplicates.
pub(crate) struct Peers(Mutex<Vec<String>>);

impl Peers {
    pub fn new(initial: &[String]) -> Peers {
        let peers = Peers(Mutex::default());
        for url in initial {
            peers.add(url.clone());
        }
        peers
    }

    /// Idempotent.
    pub fn add(&self, url: String) {
        let mut peers = self.lock();
        if !peers.contains(&url) {
            peers.push(url);
        }
    }

    /// Whether `url` was registered.
    pub fn remove(&self, url: &str) -> bool {
        let mut peers = self.lock();
        let before = peers.len();
        peers.retain(|p| p != url);
        peers.len() != before
    }

    pub fn list(&self) -> Vec<String> {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A peer's `/dump`.
pub(crate) struct Dump {
    pub url: String,
    pub body: Vec<u8>,
}

/// The `/dump` of the first of `peers` that answers one within
/// [`DUMP_TIMEOUT`] and `max_bytes` (what a `/restore` body may hold); why
/// none did.
pub(crate) async fn first_dump(peers: &[String], max_bytes: usize) -> Result<Dump, String> {
    let client = reqwest::Client::builder()
        .timeout(DUMP_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
    let mut failures = Vec::new();
    for peer in peers {
        let url = format!("{}/dump", peer.trim_end_matches('/'));
        match fetch(&client, &url, max_bytes).await {
            Ok(body) => return Ok(Dump { url, body }),
            Err(e) => failures.push(format!("{url}: {e}")),
        }
    }
    if failures.is_empty() {
        return Err("no peer is registered".into());
    }
    Err(failures.join("; "))
}

/// `url`'s body, read chunk by chunk and refused past `max_bytes` (a peer
/// cannot make the host buffer more than a `/restore` may carry).
async fn fetch(client: &reqwest::Client, url: &str, max_bytes: usize) -> Result<Vec<u8>, String> {
    let too_large = || format!("its /dump exceeds {max_bytes} bytes ([serve].max_body_mib)");
    let mut response = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    if response
        .content_length()
        .is_some_and(|len| len > max_bytes as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > max_bytes {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
