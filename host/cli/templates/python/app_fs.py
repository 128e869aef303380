"""{{name}}: a kv_store_v1 backend as a WebAssembly component.

componentize-py finds the backend's two halves by name: this module's
`Store` class carries the `store` interface's functions (`info`), and
`store.py` holds the `store` resource, the store itself.
"""

from wit_world import exports
from wit_world.exports import store as api


class Store(exports.Store):
    def info(self) -> api.BackendInfo:
        # The data lives in files (store.py), so several instances may
        # serve one handle.
        return api.BackendInfo(name="{{name}}", version="0.1.0", shared_state=True)
