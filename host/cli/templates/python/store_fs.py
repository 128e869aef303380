"""The store: chunks and manifests in plain files in the directory the
operator grants (seen at /data), their bytes moved by the host through
kvwasm:kv-store/payload-io on this component's own descriptor, never
copied through Python:

    chunks/<hex of hash>            chunks of the empty namespace
    manifests/<name>                its manifests
    ns/<a>/ns/<b>/chunks/...        namespace `a/b`

Each namespace component is a directory under ns/, so no namespace can name
another one's chunks or manifests. Replace the bodies with calls to your
own storage; keep the rules in the comments: they are what
wit/kv-store.wit requires of every backend, and what `kvwasm check` tests.
Errors are raised as `Err(<error case>)`.
"""

import os
from typing import List, Self

from componentize_py_types import Err
from wit_world.exports import store as api
from wit_world.imports import kvwasm_kv_store_types as types
from wit_world.imports import payload_io, preopens
from wit_world.imports import wasi_filesystem_types as fs

_data_dir = None


def data_dir() -> fs.Descriptor:
    """The directory granted at /data, found once per instance."""
    global _data_dir
    if _data_dir is None:
        for descriptor, name in preopens.get_directories():
            if name == "/data":
                _data_dir = descriptor
        if _data_dir is None:
            raise Err(types.Error_Denied("no directory granted at /data"))
    return _data_dir


class Store(api.Store):
    def __init__(self, root: str) -> None:
        self.root = root  # the namespace's directory in the grant, "" or ending in "/"

    @classmethod
    def open(cls, namespace: str) -> Self:
        # The namespace comes from the consumer's URI: never trust it. Each
        # component is a directory under ns/, so no namespace can name
        # another one's chunks or manifests directory; an empty component
        # (a//b, /a) or an unsafe one is refused, never merged with another
        # namespace.
        root = ""
        if namespace:
            for part in namespace.split("/"):
                check_name(part)
                make_dir(root + "ns")
                root += f"ns/{part}/"
                make_dir(root[:-1])
        make_dir(root + "chunks")
        make_dir(root + "manifests")
        return cls(root)

    def put_chunk(self, hash: bytes, data: types.Payload) -> api.PutOutcome:
        path = self.chunk_path(hash)
        try:
            data_dir().stat_at(fs.PathFlags(0), path)
            # Idempotent: an existing hash writes nothing and reports a hit.
            return api.PutOutcome.ALREADY_PRESENT
        except Err as e:
            if e.value != fs.ErrorCode.NO_ENTRY:
                raise io_error("stat", e.value)
        # Written through (and synced), so it is visible and durable before
        # any manifest names it.
        publish(path, data)
        return api.PutOutcome.STORED

    def get_chunk(self, hash: bytes) -> types.Payload:
        return read(self.chunk_path(hash))

    def put_manifest(self, name: str, data: types.Payload) -> None:
        # Chunks are written through in put_chunk, so they are already
        # visible; a buffering backend would flush them here first.
        publish(self.manifest_path(name), data)

    def get_manifest(self, name: str) -> types.Payload:
        return read(self.manifest_path(name))

    def delete_manifest(self, name: str) -> None:
        try:
            data_dir().unlink_file_at(self.manifest_path(name))
        except Err as e:
            if e.value != fs.ErrorCode.NO_ENTRY:  # a missing name is success
                raise io_error("delete", e.value)

    def prefetch_chunks(self, hashes: List[bytes]) -> None:
        pass  # a hint: a remote backend would batch-fetch here

    def flush(self) -> None:
        pass  # nothing is buffered

    def chunk_path(self, hash: bytes) -> str:
        """Hashes are 1 to 64 bytes."""
        if not 1 <= len(hash) <= 64:
            raise Err(types.Error_InvalidArgument(f"hash of {len(hash)} bytes"))
        return f"{self.root}chunks/{hash.hex()}"

    def manifest_path(self, name: str) -> str:
        check_name(name)
        return f"{self.root}manifests/{name}"


def make_dir(path: str) -> None:
    """Create a directory beneath the grant; one that exists is fine."""
    try:
        data_dir().create_directory_at(path)
    except Err as e:
        if e.value != fs.ErrorCode.EXIST:
            raise io_error("create directory", e.value)


def publish(path: str, data: types.Payload) -> None:
    """Publish `data` at `path` atomically and durably: written to a new
    temporary file in the same directory, synced, then renamed over it, so
    a reader finds the old file or the whole new one. Names starting with
    ".tmp-" are never chunks; concurrent writers pick different ones."""
    tmp = f"{path.rsplit('/', 1)[0]}/.tmp-{os.urandom(8).hex()}"
    try:
        payload_io.publish_file(data_dir(), tmp, path, data, True)
    except Err as e:
        raise io_error("publish", e.value)


def read(path: str) -> types.Payload:
    """The file at `path` as a new payload (no copy through Python)."""
    try:
        return payload_io.read_file(data_dir(), path)
    except Err as e:
        if e.value == fs.ErrorCode.NO_ENTRY:
            raise Err(types.Error_NotFound())
        raise io_error("read", e.value)


def io_error(what: str, code: fs.ErrorCode) -> Err:
    return Err(types.Error_Io(f"{what}: {code.name.lower()}"))


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
