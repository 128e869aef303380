//! `payload-io`: file I/O that moves payload bytes between files and host
//! buffers without a detour through guest memory. The I/O runs on the
//! guest's own descriptors (so the grant's permissions apply) or opens
//! files beneath a granted directory with [`open_beneath`].

use wasmtime::component::Resource;
use wasmtime_wasi::OpenMode;
use wasmtime_wasi::filesystem::Descriptor;
use wasmtime_wasi::p2::bindings::filesystem::types::ErrorCode;

use super::{MallocBuffer, Payload, malloc, target};
use crate::bindings::kvwasm::kv_store::payload_io;
use crate::capabilities::descriptors::Headroom;
use crate::capabilities::dirs::{
    NewFile, Opened, io_error_code, open_beneath, open_dir_beneath, split_name,
};
use crate::capabilities::durable;
use crate::state::HostState;

impl payload_io::Host for HostState {
    fn write_at(
        &mut self,
        file: Resource<Descriptor>,
        data: Resource<Payload>,
        offset: u64,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        use std::os::unix::fs::FileExt;
        let file = match self.table.get(&file)? {
            Descriptor::File(f) => f,
            Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
        };
        // The same checks wasi:filesystem's own `write` makes: the grant must
        // be writable and the file opened for writing.
        if file.perms.write_not_permitted() || !file.open_mode.contains(OpenMode::WRITE) {
            return Ok(Err(ErrorCode::NotPermitted));
        }
        let bytes = self.table.get(&data)?.as_slice();
        Ok(file.file.write_all_at(bytes, offset).map_err(io_error_code))
    }

    fn read_at(
        &mut self,
        file: Resource<Descriptor>,
        offset: u64,
        len: u64,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let file = match self.table.get(&file)? {
            Descriptor::File(f) if f.open_mode.contains(OpenMode::READ) => f.file.clone(),
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotPermitted)),
            Descriptor::Dir(_) => return Ok(Err(ErrorCode::BadDescriptor)),
        };
        if len > self.limits.max_payload_bytes {
            return Ok(Err(ErrorCode::FileTooLarge));
        }
        // Allocate what the file holds past `offset`, not what was asked:
        // the guest chooses `len`, the host pays for the buffer.
        let size = match file.metadata() {
            Ok(meta) => meta.len(),
            Err(e) => return Ok(Err(io_error_code(e))),
        };
        let want = len.min(size.saturating_sub(offset)) as usize;
        self.read_payload(&file, offset, want, false)
    }

    fn read_file(
        &mut self,
        dir: Resource<Descriptor>,
        path: String,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let dir = match self.table.get(&dir)? {
            Descriptor::Dir(d) => d,
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
        };
        let mut options = cap_primitives::fs::OpenOptions::new();
        options.read(true);
        let (file, len) = match open_beneath(&dir.dir, &path, &mut options, true, &self.headroom) {
            Ok(Opened::File(file, len)) => (file, len),
            Ok(Opened::Dir(_)) => return Ok(Err(ErrorCode::IsDirectory)),
            Err(code) => return Ok(Err(code)),
        };
        if len > self.limits.max_payload_bytes {
            return Ok(Err(ErrorCode::FileTooLarge));
        }
        self.read_payload(&file, 0, len as usize, true)
    }

    fn write_file(
        &mut self,
        dir: Resource<Descriptor>,
        path: String,
        data: Resource<Payload>,
        sync: bool,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        self.write_beneath(&dir, &data, &path, None, sync)
    }

    fn publish_file(
        &mut self,
        dir: Resource<Descriptor>,
        tmp: String,
        path: String,
        data: Resource<Payload>,
        sync: bool,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        self.write_beneath(&dir, &data, &tmp, Some(&path), sync)
    }

    fn sync_paths(
        &mut self,
        dir: Resource<Descriptor>,
        paths: Vec<String>,
    ) -> wasmtime::Result<Result<payload_io::Synced, ErrorCode>> {
        let dir = match self.table.get(&dir)? {
            Descriptor::Dir(d) => &d.dir,
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
        };
        let synced = durable::sync_paths(dir, &paths, &self.headroom);
        if let Ok(done) = &synced {
            let synced = u64::from(done.files + done.directories);
            crate::metrics::for_backend(&self.backend).synced(synced, paths.len() as u64 - synced);
        }
        Ok(synced)
    }

    fn start_writeback(
        &mut self,
        dir: Resource<Descriptor>,
        paths: Vec<String>,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        Ok(match self.table.get(&dir)? {
            // Writeback is for a store's own writes: a read-only grant
            // (perhaps shared with a writer) has none.
            Descriptor::Dir(d) if d.perms.write_not_permitted() => Err(ErrorCode::NotPermitted),
            Descriptor::Dir(d) => {
                durable::start_writeback(&d.dir, &paths, &self.headroom).map(drop)
            }
            Descriptor::File(_) => Err(ErrorCode::NotDirectory),
        })
    }

    fn find_file(
        &mut self,
        dir: Resource<Descriptor>,
        path: String,
    ) -> wasmtime::Result<Result<Option<payload_io::FoundFile>, ErrorCode>> {
        Ok(match self.table.get(&dir)? {
            Descriptor::Dir(d) => {
                durable::find_file(&d.dir, &path, &self.headroom, &self.kept_dirs)
            }
            Descriptor::File(_) => Err(ErrorCode::NotDirectory),
        })
    }
}

/// Create the plain name `name` in `parent`, write `bytes` to it and
/// `fdatasync` it if `sync`; on failure the file is removed again.
fn write_new<'a>(
    parent: &'a std::fs::File,
    name: &str,
    bytes: &[u8],
    sync: bool,
    headroom: &Headroom,
) -> Result<NewFile<'a>, ErrorCode> {
    use std::io::Write;
    let mut new = NewFile::create(parent, name, headroom)?;
    let written = new
        .file
        .write_all(bytes)
        .and_then(|()| if sync { new.file.sync_data() } else { Ok(()) });
    match written {
        Ok(()) => Ok(new),
        Err(e) => {
            new.remove();
            Err(io_error_code(e))
        }
    }
}

impl HostState {
    /// `write-file` (`publish_as` is `None`) and `publish-file`: create
    /// `path` beneath `dir` with the bytes of `data`, then rename it to
    /// `publish_as` in the same directory, which is resolved once.
    fn write_beneath(
        &self,
        dir: &Resource<Descriptor>,
        data: &Resource<Payload>,
        path: &str,
        publish_as: Option<&str>,
        sync: bool,
    ) -> wasmtime::Result<Result<(), ErrorCode>> {
        let dir = match self.table.get(dir)? {
            // The check wasi:filesystem's `open-at` makes before creating.
            Descriptor::Dir(d) if d.perms.write_not_permitted() => {
                return Ok(Err(ErrorCode::NotPermitted));
            }
            Descriptor::Dir(d) => &d.dir,
            Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
        };
        let bytes = self.table.get(data)?.as_slice();
        Ok((|| {
            let (sub, name) = split_name(path)?;
            let target = match publish_as.map(split_name).transpose()? {
                Some((target_sub, target)) if target_sub == sub => Some(target),
                Some(_) => return Err(ErrorCode::Invalid),
                None => None,
            };
            let opened = open_dir_beneath(dir, sub, &self.headroom)?;
            let parent = opened.as_ref().unwrap_or(dir);
            let new = write_new(parent, name, bytes, sync, &self.headroom)?;
            target.map_or(Ok(()), |target| new.rename(target))
        })())
    }

    /// `pread` `len` bytes of `file` at `offset` into a new payload, within
    /// the payload limits. `exact`: fewer bytes (the file shrank) is `io`.
    fn read_payload(
        &mut self,
        file: &std::fs::File,
        offset: u64,
        len: usize,
        exact: bool,
    ) -> wasmtime::Result<Result<Resource<Payload>, ErrorCode>> {
        let len64 = len as u64;
        if len64 > self.limits.max_payload_bytes {
            return Ok(Err(ErrorCode::FileTooLarge));
        }
        // A get_chunk_into's buffer: no block, no charge (the caller's memory).
        // SAFETY: `read_into` hands over `len` writable bytes.
        if let Some(read) = target::read_into(len, |dst| unsafe {
            malloc::pread_into(file, offset, dst, len)
        }) {
            return Ok(match read {
                // (a short read's lease drops here, freeing the target)
                Ok(lease) if exact && lease.as_slice().len() != len => Err(ErrorCode::Io),
                Ok(lease) => Ok(self.table.push(Payload::Target(lease))?),
                Err(e) => Err(io_error_code(e)),
            });
        }
        if !self.limits.reserve_payload(len64) {
            return Ok(Err(ErrorCode::InsufficientMemory));
        }
        match MallocBuffer::read_file(file, offset, len) {
            Ok(buf) if exact && buf.len() != len => {
                self.limits.release_payload(len64);
                Ok(Err(ErrorCode::Io))
            }
            Ok(buf) => {
                // The buffer was shrunk to what was read (the file shrank).
                self.limits.release_payload(len64 - buf.len() as u64);
                Ok(Ok(self.table.push(Payload::Owned(buf))?))
            }
            Err(e) => {
                self.limits.release_payload(len64);
                Ok(Err(io_error_code(e)))
            }
        }
    }
}
