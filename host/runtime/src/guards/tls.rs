//! TLS-only sockets for a backend with a TLS grant
//! ([`crate::capabilities::tls`]).

use std::sync::Arc;

use crate::metrics::BackendMetrics;
use crate::state::HostState;

/// `wasi:sockets` and `wasi:tls` as wasmtime-wasi 48 and wasmtime-wasi-tls
/// 48 implement them, with TLS-only sockets for a backend with a `tls`
/// grant: the streams `finish-connect` returns are sealed, and refuse every
/// read and write until the guest hands them to `client-handshake`, whose
/// session is then the only way to reach the peer. Without this a guest
/// could write to its granted peer in plain text (its password, say) where
/// the operator configured TLS. A guest of a backend without a `tls` grant
/// gets its streams as before.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<HostState>,
) -> wasmtime::Result<()> {
    use wasmtime::StoreContextMut;
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::bindings::sockets::network::ErrorCode;
    use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, TcpSocket};
    type Streams = (Resource<DynInputStream>, Resource<DynOutputStream>);
    type HandshakeParams = (String, Resource<DynInputStream>, Resource<DynOutputStream>);
    linker.allow_shadowing(true);
    linker.instance(SOCKETS_TCP)?.func_wrap(
        "[method]tcp-socket.finish-connect",
        |mut store: StoreContextMut<'_, HostState>, (socket,): (Resource<TcpSocket>,)| {
            use wasmtime_wasi::p2::bindings::sockets::tcp::HostTcpSocket;
            use wasmtime_wasi::sockets::WasiSocketsView;
            let state = store.data_mut();
            let socket_rep = Resource::<TcpSocket>::new_borrow(socket.rep());
            let (input, output): Streams = match state.sockets().finish_connect(socket) {
                Ok(streams) => streams,
                Err(e) => return Ok((Err::<Streams, ErrorCode>(e.downcast()?),)),
            };
            if state.http_policy.tls.is_none() {
                return Ok((Ok((input, output)),));
            }
            let metrics = state.http_policy.metrics.clone();
            let backend = state.backend.clone();
            let seal = || Seal {
                open: Arc::new(std::sync::atomic::AtomicBool::new(false)),
                metrics: metrics.clone(),
                backend: backend.clone(),
            };
            let (input_seal, output_seal) = (seal(), seal());
            let inner = state.table.delete(input)?;
            let input: Resource<DynInputStream> = state.table.push_child(
                Box::new(Sealed {
                    inner,
                    seal: input_seal.clone(),
                }) as DynInputStream,
                &socket_rep,
            )?;
            let inner = state.table.delete(output)?;
            let output: Resource<DynOutputStream> = state.table.push_child(
                Box::new(Sealed {
                    inner,
                    seal: output_seal.clone(),
                }) as DynOutputStream,
                &socket_rep,
            )?;
            state.sealed_streams.insert(input.rep(), input_seal.open);
            state.sealed_streams.insert(output.rep(), output_seal.open);
            Ok((Ok((input, output)),))
        },
    )?;
    linker.instance(TLS_TYPES)?.func_wrap(
        "[constructor]client-handshake",
        |mut store: StoreContextMut<'_, HostState>, (name, input, output): HandshakeParams| {
            use wasmtime_wasi_tls::WasiTlsView;
            use wasmtime_wasi_tls::p2::bindings::types::HostClientHandshake;
            let state = store.data_mut();
            // Handed over: from now on only the host's TLS session uses them.
            for rep in [input.rep(), output.rep()] {
                if let Some(open) = state.sealed_streams.remove(&rep) {
                    open.store(true, std::sync::atomic::Ordering::Release);
                }
            }
            let handshake = state.tls().new(name, input, output)?;
            Ok((handshake,))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interfaces [`add_to_linker`] replaces functions of.
const SOCKETS_TCP: &str = "wasi:sockets/tcp@0.2.12";
const TLS_TYPES: &str = "wasi:tls/types@0.2.0-draft";

/// Whether a socket stream of a TLS-only backend was handed to the host's
/// TLS session.
#[derive(Clone)]
struct Seal {
    open: Arc<std::sync::atomic::AtomicBool>,
    metrics: Arc<BackendMetrics>,
    backend: Arc<str>,
}

impl Seal {
    fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Acquire)
    }

    fn check(&self) -> wasmtime_wasi::p2::StreamResult<()> {
        if self.is_open() {
            return Ok(());
        }
        self.metrics.denial();
        let backend = &self.backend;
        crate::log_limit::warn(
            ("plain text refused", Arc::as_ptr(&self.metrics) as usize),
            format_args!(
                "backend {backend}: plain text refused on a socket of a backend with a \
                 `tls` grant: hand the socket's streams to wasi:tls"
            ),
        );
        Err(wasmtime_wasi::p2::StreamError::LastOperationFailed(
            wasmtime::Error::msg(
                "plain text refused: this backend's connections are TLS only (wasi:tls)",
            ),
        ))
    }
}

/// A socket stream behind a [`Seal`].
struct Sealed<S> {
    inner: S,
    seal: Seal,
}

#[wasmtime_wasi::async_trait]
impl<S: wasmtime_wasi::p2::Pollable> wasmtime_wasi::p2::Pollable for Sealed<S> {
    async fn ready(&mut self) {
        // Sealed: ready at once, for the refusal.
        if self.seal.is_open() {
            self.inner.ready().await
        }
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::InputStream for Sealed<wasmtime_wasi::p2::DynInputStream> {
    fn read(&mut self, size: usize) -> wasmtime_wasi::p2::StreamResult<bytes::Bytes> {
        self.seal.check()?;
        self.inner.read(size)
    }

    fn skip(&mut self, nelem: usize) -> wasmtime_wasi::p2::StreamResult<usize> {
        self.seal.check()?;
        self.inner.skip(nelem)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

#[wasmtime_wasi::async_trait]
impl wasmtime_wasi::p2::OutputStream for Sealed<wasmtime_wasi::p2::DynOutputStream> {
    fn write(&mut self, bytes: bytes::Bytes) -> wasmtime_wasi::p2::StreamResult<()> {
        self.seal.check()?;
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> wasmtime_wasi::p2::StreamResult<()> {
        self.seal.check()?;
        self.inner.flush()
    }

    fn check_write(&mut self) -> wasmtime_wasi::p2::StreamResult<usize> {
        self.seal.check()?;
        self.inner.check_write()
    }

    fn write_zeroes(&mut self, nelem: usize) -> wasmtime_wasi::p2::StreamResult<()> {
        self.seal.check()?;
        self.inner.write_zeroes(nelem)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}
