//! A backend: a component plus the operator's policy for running it.

use std::sync::Arc;

use crate::capabilities::Grants;
use crate::component::{ComponentSource, LoadedComponent};
use crate::limits::Limits;

/// Everything needed to open stores on one backend.
pub struct Backend {
    /// Config name (`wasm://<name>/...`), or `builtin:fs` for `wasm:///dir`.
    pub name: String,
    /// Where the component came from.
    pub source: ComponentSource,
    /// The compiled, linked component.
    pub component: Arc<LoadedComponent>,
    /// What instances may reach.
    pub grants: Grants,
    /// Per-instance limits.
    pub limits: Limits,
    /// Most instances serving one handle at once (only for backends that
    /// declare shared state; others get one).
    pub max_instances: usize,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .field("source", &self.source)
            .field("grants", &self.grants)
            .field("limits", &self.limits)
            .field("max_instances", &self.max_instances)
            .finish()
    }
}

/// Default instances per handle: one per core, at most 4.
pub fn default_max_instances() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().min(4))
}
