//! `wasi:http`'s outgoing handler without the table entries it would leak.

use wasmtime_wasi_http::RequestOptions;

/// `wasi:http/outgoing-handler.handle` as wasmtime-wasi-http implements it,
/// but releasing the `request-options` resource the guest hands over: the
/// stock function only reads it, so every request with options would keep
/// one table entry until the instance reaches `max_resources`. Generic
/// over the store's data, which it reaches only through `WasiHttpView`.
pub(crate) fn add_to_linker<T: wasmtime_wasi_http::WasiHttpView + 'static>(
    linker: &mut wasmtime::component::Linker<T>,
) -> wasmtime::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi_http::p2::bindings::http::outgoing_handler::Host;
    use wasmtime_wasi_http::p2::types::{HostFutureIncomingResponse, HostOutgoingRequest};
    type Params = (
        Resource<HostOutgoingRequest>,
        Option<Resource<RequestOptions>>,
    );
    linker.allow_shadowing(true);
    linker.instance(OUTGOING_HANDLER)?.func_wrap(
        "handle",
        |mut store: wasmtime::StoreContextMut<'_, T>, (request, options): Params| {
            let mut http = store.data_mut().http();
            let handed_over = options
                .as_ref()
                .map(|o| Resource::<RequestOptions>::new_own(o.rep()));
            let sent: Result<Resource<HostFutureIncomingResponse>, _> =
                http.handle(request, options);
            if let Some(options) = handed_over {
                let _ = http.table.delete(options);
            }
            match sent {
                Ok(future) => Ok((Ok(future),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The interface [`add_to_linker`] replaces a function of, as
/// wasmtime-wasi-http 48 names it.
const OUTGOING_HANDLER: &str = "wasi:http/outgoing-handler@0.2.12";
