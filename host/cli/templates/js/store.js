// {{name}}: a kv_store_v1 backend as a WebAssembly component.
//
// The store keeps chunks and manifests in the memory of the instance
// serving a namespace (the host gives every namespace its own instance and
// shares it among the handles open on it; the data is gone when the last
// one closes). Replace the bodies with calls to your own storage; keep the
// rules in the comments: they are what wit/kv-store.wit requires of every
// backend, and what `kvwasm check` tests. A call fails by throwing the
// error case, e.g. `throw { tag: 'not-found' }`.

import { Payload } from 'kvwasm:kv-store/types@0.1.6';

class Store {
  constructor() {
    this.chunks = new Map(); // hex of hash -> Uint8Array
    this.manifests = new Map(); // name -> Uint8Array
  }

  static open(namespace) {
    // The namespace comes from the consumer's URI: never trust it.
    // Namespaces are separate stores; refuse one you cannot keep apart.
    if (namespace !== '') {
      for (const part of namespace.split('/')) checkName(part);
    }
    return new Store();
  }

  putChunk(hash, data) {
    const key = checkHash(hash);
    if (this.chunks.has(key)) {
      // Idempotent: an existing hash writes nothing and reports a hit.
      return 'already-present';
    }
    this.chunks.set(key, data.read(0n, data.len()));
    return 'stored';
  }

  getChunk(hash) {
    const found = this.chunks.get(checkHash(hash));
    if (found === undefined) throw { tag: 'not-found' };
    return new Payload(found);
  }

  putManifest(name, data) {
    checkName(name);
    // Chunks are stored in putChunk, so they are already visible; a
    // buffering backend would flush them here first.
    this.manifests.set(name, data.read(0n, data.len()));
  }

  getManifest(name) {
    checkName(name);
    const found = this.manifests.get(name);
    if (found === undefined) throw { tag: 'not-found' };
    return new Payload(found);
  }

  deleteManifest(name) {
    checkName(name);
    this.manifests.delete(name); // a missing name is success
  }

  prefetchChunks(_hashes) {} // a hint: a remote backend would batch-fetch here

  flush() {} // nothing is buffered
}

// Hashes are 1 to 64 bytes; the map key is their hex.
function checkHash(hash) {
  if (hash.length < 1 || hash.length > 64) {
    throw { tag: 'invalid-argument', val: `hash of ${hash.length} bytes` };
  }
  return Array.from(hash, (b) => b.toString(16).padStart(2, '0')).join('');
}

// Manifest names and namespace components are one safe path component.
function checkName(name) {
  const bad =
    name === '' ||
    new TextEncoder().encode(name).length > 255 ||
    name === '.' ||
    name.includes('..') ||
    /[\/\\\u0000-\u001f\u007f]/.test(name);
  if (bad) throw { tag: 'invalid-argument', val: `unsafe name ${JSON.stringify(name)}` };
}

export const store = {
  info() {
    // The data lives in the instance: one instance per namespace. A
    // backend whose data lives in files or a server says sharedState: true.
    return { name: '{{name}}', version: '0.1.0', sharedState: false };
  },
  Store,
};
