//! `wasi:filesystem` and `wasi:sockets` with the limits of a directory
//! grant ([`crate::capabilities::dirs`]) and of the process's descriptors.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::OpenMode;
use wasmtime_wasi::filesystem::{Descriptor, Dir, File};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, OpenFlags, PathFlags,
};
use wasmtime_wasi::p2::bindings::sockets::network::{
    ErrorCode as SocketErrorCode, IpAddressFamily,
};

use crate::capabilities::dirs::{Opened, open_beneath};
use crate::state::HostState;

/// Replace the `wasi:filesystem` and `wasi:sockets` functions whose stock
/// versions could block past a deadline or reach outside a grant:
///
/// * `open-at` opens through [`open_beneath`] (no FIFOs, no devices, within
///   the instance's `max_descriptors` and its share of the process's
///   descriptors);
/// * `symlink-at` is refused: a link the guest plants inside its grant is
///   harmless to the host (which never follows it out) but not to another
///   program sharing the directory, such as a native backend;
/// * `read-directory` is refused unless the backend sets `list_dirs`:
///   wasmtime-wasi reads the whole listing (an `fstatat` per entry) into
///   host memory, inline, so a guest that filled its grant with entries
///   could hold host memory past its caps and overrun its deadline;
/// * `create-tcp-socket` first checks the same two limits.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut fs = linker.instance(FILESYSTEM_TYPES)?;
    fs.func_wrap(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, HostState>,
         (dir, path_flags, path, oflags, flags): OpenAtParams| {
            Ok((open_at(
                store.data_mut(),
                dir,
                path_flags,
                path,
                oflags,
                flags,
            )?,))
        },
    )?;
    fs.func_wrap(
        "[method]descriptor.symlink-at",
        |store: StoreContextMut<'_, HostState>,
         (_dir, _target, link): (Resource<Descriptor>, String, String)| {
            let backend = &store.data().backend;
            crate::log_limit::warn(
                ("symlink refused", backend.as_ref()),
                format_args!(
                    "backend {backend:?}: refused to create the symbolic link {:?}: \
                     guests may not create links in their grants",
                    crate::log_limit::bounded(link)
                ),
            );
            Ok((Err::<(), _>(ErrorCode::NotPermitted),))
        },
    )?;
    fs.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, HostState>, (dir,): (Resource<Descriptor>,)| {
            Box::new(async move {
                use wasmtime_wasi::filesystem::WasiFilesystemView;
                use wasmtime_wasi::p2::bindings::filesystem::types::HostDescriptor;
                let state = store.data_mut();
                if !state.list_dirs {
                    let backend = state.backend.clone();
                    crate::log_limit::warn(
                        ("listing refused", backend.as_ref()),
                        format_args!(
                            "backend {backend:?}: refused to list a directory \
                             (not granted: `list_dirs`)"
                        ),
                    );
                    return Ok((Err(ErrorCode::NotPermitted),));
                }
                match state.filesystem().read_directory(dir).await {
                    Ok(stream) => Ok((Ok(stream),)),
                    Err(e) => Ok((Err(e.downcast()?),)),
                }
            })
        },
    )?;
    let mut tcp = linker.instance(SOCKETS_TCP_CREATE)?;
    tcp.func_wrap(
        "create-tcp-socket",
        |mut store: StoreContextMut<'_, HostState>, (family,): (IpAddressFamily,)| {
            use wasmtime_wasi::p2::bindings::sockets::tcp_create_socket::Host;
            use wasmtime_wasi::sockets::WasiSocketsView;
            let state = store.data_mut();
            let what = "creating a socket";
            if !state.headroom.may_open(&mut state.table, what) || !state.headroom.has_room(what) {
                return Ok((Err(SocketErrorCode::NewSocketLimit),));
            }
            match state.sockets().create_tcp_socket(family) {
                Ok(socket) => Ok((Ok(socket),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interfaces [`add_to_linker`] replaces functions of, as
/// wasmtime-wasi 48 names them (guests importing any 0.2.x resolve to them).
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";
const SOCKETS_TCP_CREATE: &str = "wasi:sockets/tcp-create-socket@0.2.12";

type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);

/// `open-at` with the same permission rules as wasmtime-wasi's, opened by
/// [`open_beneath`].
fn open_at(
    state: &mut HostState,
    dir: Resource<Descriptor>,
    path_flags: PathFlags,
    path: String,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> wasmtime::Result<Result<Resource<Descriptor>, ErrorCode>> {
    let dir = match state.table.get(&dir)? {
        Descriptor::Dir(d) => d.clone(),
        Descriptor::File(_) => return Ok(Err(ErrorCode::NotDirectory)),
    };
    let mut options = cap_primitives::fs::OpenOptions::new();
    let mut mode = OpenMode::empty();
    let create = oflags.contains(OpenFlags::CREATE);
    if create {
        options.write(true);
        if oflags.contains(OpenFlags::EXCLUSIVE) {
            options.create_new(true);
        } else {
            options.create(true);
        }
        mode |= OpenMode::WRITE;
    }
    if oflags.contains(OpenFlags::TRUNCATE) {
        options.truncate(true).write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::WRITE) {
        options.write(true);
        mode |= OpenMode::WRITE;
    }
    if flags.contains(DescriptorFlags::READ) || !flags.contains(DescriptorFlags::WRITE) {
        // Opened for reading unless only writing was asked for; the
        // descriptor's mode still governs what the guest may do with it.
        options.read(true);
        mode |= OpenMode::READ;
    }
    let wants_dir = oflags.contains(OpenFlags::DIRECTORY);
    if wants_dir && (create || oflags.contains(OpenFlags::TRUNCATE)) {
        return Ok(Err(ErrorCode::Invalid));
    }
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) {
        return Ok(Err(ErrorCode::Unsupported));
    }
    if dir.perms.write_not_permitted() && mode.contains(OpenMode::WRITE) {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    if !state.headroom.may_open(&mut state.table, "opening a file") {
        return Ok(Err(ErrorCode::InsufficientMemory));
    }
    let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
    let opened = match open_beneath(&dir.dir, &path, &mut options, follow, &state.headroom) {
        Ok(opened) => opened,
        Err(code) => return Ok(Err(code)),
    };
    // `allow_blocking_current_thread` is always on (see `Grants::wasi_ctx`).
    let descriptor = match opened {
        Opened::Dir(d) => Descriptor::Dir(Dir::new(d, dir.perms, mode, true)),
        Opened::File(..) if wants_dir => return Ok(Err(ErrorCode::NotDirectory)),
        Opened::File(f, _) => Descriptor::File(File::new(f, dir.perms, mode, true)),
    };
    Ok(Ok(state.table.push(descriptor)?))
}
