// {{name}}: a kv_store_v1 backend as a WebAssembly component.
//
// The store keeps chunks and manifests in plain files in the directory the
// operator grants (seen at /data), their bytes moved by the host through
// kvwasm:kv-store/payload-io on this component's own descriptor, never
// copied through JavaScript:
//
//   chunks/<hex of hash>            chunks of the empty namespace
//   manifests/<name>                its manifests
//   ns/<a>/ns/<b>/chunks/...        namespace `a/b`
//
// Each namespace component is a directory under ns/, so no namespace can
// name another one's chunks or manifests. Replace the bodies with calls to
// your own storage; keep the rules in the comments: they are what
// wit/kv-store.wit requires of every backend, and what `kvwasm check`
// tests. A call fails by throwing the error case, e.g.
// `throw { tag: 'not-found' }`; a failed import throws its error code.

import { publishFile, readFile } from 'kvwasm:kv-store/payload-io@0.1.6';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

let dataDir;

// The directory granted at /data, found once per instance.
function dir() {
  if (dataDir === undefined) {
    const found = getDirectories().find(([, name]) => name === '/data');
    if (found === undefined) throw { tag: 'denied', val: 'no directory granted at /data' };
    dataDir = found[0];
  }
  return dataDir;
}

// The error code a failed import threw.
function codeOf(e) {
  return e && typeof e === 'object' && 'payload' in e ? e.payload : e;
}

function ioError(what, e) {
  return { tag: 'io', val: `${what}: ${codeOf(e)}` };
}

class Store {
  constructor(root) {
    this.root = root; // the namespace's directory in the grant, '' or ending in '/'
  }

  static open(namespace) {
    // The namespace comes from the consumer's URI: never trust it. Each
    // component is a directory under ns/, so no namespace can name another
    // one's chunks or manifests directory; an empty component (a//b, /a)
    // or an unsafe one is refused, never merged with another namespace.
    let root = '';
    if (namespace !== '') {
      for (const part of namespace.split('/')) {
        checkName(part);
        makeDir(`${root}ns`);
        root += `ns/${part}/`;
        makeDir(root.slice(0, -1));
      }
    }
    makeDir(`${root}chunks`);
    makeDir(`${root}manifests`);
    return new Store(root);
  }

  putChunk(hash, data) {
    const path = this.chunkPath(hash);
    try {
      dir().statAt({}, path);
      // Idempotent: an existing hash writes nothing and reports a hit.
      return 'already-present';
    } catch (e) {
      if (codeOf(e) !== 'no-entry') throw ioError('stat', e);
    }
    // Written through (and synced), so it is visible and durable before
    // any manifest names it.
    publish(path, data);
    return 'stored';
  }

  getChunk(hash) {
    return read(this.chunkPath(hash));
  }

  putManifest(name, data) {
    // Chunks are written through in putChunk, so they are already visible;
    // a buffering backend would flush them here first.
    publish(this.manifestPath(name), data);
  }

  getManifest(name) {
    return read(this.manifestPath(name));
  }

  deleteManifest(name) {
    try {
      dir().unlinkFileAt(this.manifestPath(name));
    } catch (e) {
      if (codeOf(e) !== 'no-entry') throw ioError('delete', e); // a missing name is success
    }
  }

  prefetchChunks(_hashes) {} // a hint: a remote backend would batch-fetch here

  flush() {} // nothing is buffered

  // Hashes are 1 to 64 bytes.
  chunkPath(hash) {
    if (hash.length < 1 || hash.length > 64) {
      throw { tag: 'invalid-argument', val: `hash of ${hash.length} bytes` };
    }
    return `${this.root}chunks/${Array.from(hash, (b) => b.toString(16).padStart(2, '0')).join('')}`;
  }

  manifestPath(name) {
    checkName(name);
    return `${this.root}manifests/${name}`;
  }
}

// Create a directory beneath the grant; one that exists is fine.
function makeDir(path) {
  try {
    dir().createDirectoryAt(path);
  } catch (e) {
    if (codeOf(e) !== 'exist') throw ioError('create directory', e);
  }
}

// Publish `data` at `path` atomically and durably: written to a new
// temporary file in the same directory, synced, then renamed over it, so a
// reader finds the old file or the whole new one. Names starting with
// '.tmp-' are never chunks; concurrent writers pick different ones.
function publish(path, data) {
  const unique = Array.from(crypto.getRandomValues(new Uint8Array(8)), (b) =>
    b.toString(16).padStart(2, '0'),
  ).join('');
  const tmp = `${path.slice(0, path.lastIndexOf('/'))}/.tmp-${unique}`;
  try {
    publishFile(dir(), tmp, path, data, true);
  } catch (e) {
    throw ioError('publish', e);
  }
}

// The file at `path` as a new payload (no copy through JavaScript).
function read(path) {
  try {
    return readFile(dir(), path);
  } catch (e) {
    if (codeOf(e) === 'no-entry') throw { tag: 'not-found' };
    throw ioError('read', e);
  }
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
    // The data lives in files, so several instances may serve one handle.
    return { name: '{{name}}', version: '0.1.0', sharedState: true };
  },
  Store,
};
