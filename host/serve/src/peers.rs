//! Peer replicas (`/register_peer`, `/deregister_peer`, `/peers`) and
//! startup recovery from the first reachable peer's `/dump`
//! (events-common.md, "Recovery (1)"). Peers never synchronise live.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::GuestCell;
use crate::feed::request;
use crate::log::RESTORE;
use crate::pending::Model;

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

/// Restore `indexer` from the first of `peers` that answers `/dump`; with
/// none reachable the replica starts empty. The (model, tenant) trees
/// restored.
pub(crate) async fn recover(peers: &[String], indexer: &Arc<GuestCell>) -> Vec<Model> {
    let client = match reqwest::Client::builder().timeout(DUMP_TIMEOUT).build() {
        Ok(client) => client,
        Err(e) => {
            tracing::error!("recovery: cannot build an HTTP client: {e}");
            return Vec::new();
        }
    };
    for peer in peers {
        let url = format!("{}/dump", peer.trim_end_matches('/'));
        let dump = match fetch(&client, &url).await {
            Ok(dump) => dump,
            Err(e) => {
                tracing::warn!("recovery: {url}: {e}");
                continue;
            }
        };
        let bytes = dump.len();
        let models = crate::dumped_models(&dump);
        let indexer = indexer.clone();
        let restored =
            tokio::task::spawn_blocking(move || indexer.handle(request("POST", RESTORE, dump)))
                .await;
        match restored {
            Ok(Ok(r)) if (200..300).contains(&r.status) => {
                tracing::info!("recovered from {url} ({bytes} bytes)");
                return models;
            }
            Ok(Ok(r)) => tracing::error!(
                "recovery: the indexer refused {url}'s dump: {} {}",
                r.status,
                crate::guest_text(&r.body)
            ),
            Ok(Err(e)) => tracing::error!("recovery: restoring {url}'s dump failed: {e}"),
            Err(e) => tracing::error!("recovery: {e}"),
        }
        return Vec::new();
    }
    tracing::warn!("recovery: no peer answered /dump; starting empty");
    Vec::new()
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let response = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    Ok(body.to_vec())
}
