"""The store: chunks and manifests in the memory of the instance serving a
namespace (the host gives every namespace its own instance and shares it
among the handles open on it; the data is gone when the last one closes).

Replace the bodies with calls to your own storage; keep the rules in the
comments: they are what wit/kv-store.wit requires of every backend, and
what `kvwasm check` tests. Errors are raised as `Err(<error case>)`.
"""

from typing import List, Self

from componentize_py_types import Err
from wit_world.exports import store as api
from wit_world.imports import types


class Store(api.Store):
    def __init__(self) -> None:
        self.chunks: dict[bytes, bytes] = {}
        self.manifests: dict[str, bytes] = {}

    @classmethod
    def open(cls, namespace: str) -> Self:
        # The namespace comes from the consumer's URI: never trust it.
        # Namespaces are separate stores; refuse one you cannot keep apart.
        if namespace:
            for part in namespace.split("/"):
                check_name(part)
        return cls()

    def put_chunk(self, hash: bytes, data: types.Payload) -> api.PutOutcome:
        check_hash(hash)
        if hash in self.chunks:
            # Idempotent: an existing hash writes nothing and reports a hit.
            return api.PutOutcome.ALREADY_PRESENT
        self.chunks[hash] = data.read(0, data.len())
        return api.PutOutcome.STORED

    def get_chunk(self, hash: bytes) -> types.Payload:
        check_hash(hash)
        found = self.chunks.get(hash)
        if found is None:
            raise Err(types.Error_NotFound())
        return types.Payload(found)

    def put_manifest(self, name: str, data: types.Payload) -> None:
        check_name(name)
        # Chunks are stored in put_chunk, so they are already visible; a
        # buffering backend would flush them here first.
        self.manifests[name] = data.read(0, data.len())

    def get_manifest(self, name: str) -> types.Payload:
        check_name(name)
        found = self.manifests.get(name)
        if found is None:
            raise Err(types.Error_NotFound())
        return types.Payload(found)

    def delete_manifest(self, name: str) -> None:
        check_name(name)
        self.manifests.pop(name, None)  # a missing name is success

    def prefetch_chunks(self, hashes: List[bytes]) -> None:
        pass  # a hint: a remote backend would batch-fetch here

    def flush(self) -> None:
        pass  # nothing is buffered


def check_hash(hash: bytes) -> None:
    """Hashes are 1 to 64 bytes."""
    if not 1 <= len(hash) <= 64:
        raise Err(types.Error_InvalidArgument(f"hash of {len(hash)} bytes"))


def check_name(name: str) -> None:
    """Manifest names and namespace components are one safe path component."""
    bad = (
        not name
        or len(name.encode()) > 255
        or name == "."
        or ".." in name
        or any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name)
    )
    if bad:
        raise Err(types.Error_InvalidArgument(f"unsafe name {name!r}"))
