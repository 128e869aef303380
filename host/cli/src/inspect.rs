//! `kvwasm inspect`: what a component could ask for, before granting anything.

use kvwasm_host::component::{ComponentSource, describe};

/// Show what a component could ask for: imports, exports, size, sha256.
///
/// The component is compiled (or loaded from the cache) but never run.
///
/// Every import is inert unless the config grants the capability; the
/// right-hand column names the grant that would enable it.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct InspectArgs {
    /// A .wasm component (a kv-store backend or a fabric), or builtin:NAME
    /// (fs, memory, redis, s3, synthetic, tcp, kv-indexer, advisor).
    file: String,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let source: ComponentSource = args.file.parse().map_err(anyhow::Error::msg)?;
    let d = describe(&source).map_err(|e| anyhow::anyhow!("inspecting {source}: {e:#}"))?;
    println!("component  {source}");
    println!("size       {} bytes", d.size);
    println!(
        "sha256     {}   (pin it: sha256 = \"{}\")",
        d.sha256, d.sha256
    );
    let imports = |prefix: &str| d.imports.iter().any(|i| i.starts_with(prefix));
    let kind = if d.is_advisor() {
        "storage advisor, world kvwasm:events/storage-advisor (configure under [subscribers.NAME], \
         name it in a tiered backend's `advisor`)"
    } else if d.is_subscriber() {
        match d
            .exports
            .iter()
            .any(|e| e.starts_with("kvwasm:events/http-api@"))
        {
            true => {
                "event subscriber with an HTTP API, world kvwasm:events/event-service (configure under [subscribers.NAME])"
            }
            false => {
                "event subscriber, world kvwasm:events/event-subscriber (configure under [subscribers.NAME])"
            }
        }
    } else if d.is_fabric() {
        match imports("wasi:config/store@") {
            true => {
                "fabric, world kvwasm:fabric/configured-fabric (configure under [fabrics.NAME])"
            }
            false => "fabric, world kvwasm:fabric/fabric (configure under [fabrics.NAME])",
        }
    } else if !d.is_kv_store_backend() {
        "not a kvwasm guest (no kvwasm:kv-store/store, kvwasm:fabric/transport or \
         kvwasm:events/subscriber export)"
    } else {
        match (
            imports("kvwasm:kv-store/payload-io@"),
            imports("wasi:config/store@"),
        ) {
            (true, true) => "kv-store backend, world kvwasm:kv-store/any-backend",
            (true, false) => "kv-store backend, world kvwasm:kv-store/filesystem-backend",
            (false, true) => "kv-store backend, world kvwasm:kv-store/configured-backend",
            (false, false) => "kv-store backend, world kvwasm:kv-store/backend",
        }
    };
    println!("kind       {kind}");
    println!("\nimports (what it could ask for)        granted by");
    for import in &d.imports {
        println!("  {import:<38} {}", grant_for(import));
    }
    println!("\nexports");
    for export in &d.exports {
        println!("  {export}");
    }
    Ok(())
}

/// The config key that makes an import do anything.
fn grant_for(interface: &str) -> &'static str {
    let name = interface.split('@').next().unwrap_or(interface);
    match name {
        "wasi:filesystem/types" | "wasi:filesystem/preopens" => "dir / dirs",
        "kvwasm:kv-store/payload-io" => "dir / dirs (host-side file I/O)",
        "wasi:sockets/ip-name-lookup" => "dns = true",
        n if n.starts_with("wasi:sockets/") => "net (tcp peers)",
        n if n.starts_with("wasi:http/") => "http (origins)",
        "wasi:tls/types" => "tls (handshakes by the host, operator's roots)",
        "wasi:cli/environment" => "env (variable names)",
        "wasi:config/store" => "settings (table)",
        n if n.starts_with("wasi:random/") || n.starts_with("wasi:clocks/") => "always (harmless)",
        "wasi:cli/stderr" => "always (goes to the host log)",
        n if n.starts_with("wasi:cli/") || n.starts_with("wasi:io/") => "always (inert)",
        "kvwasm:kv-store/types" => "always (payloads)",
        "kvwasm:kv-store/payload-streams" => "always (payloads to and from streams it holds)",
        "kvwasm:kv-store/known-chunks" => {
            "always (a bounded record of its own, per namespace, of chunks its server holds)"
        }
        "kvwasm:events/types" => "always (event records)",
        "kvwasm:events/block-hash" => "always (pure hashing)",
        _ => "unknown to kvwasm: instantiation will fail",
    }
}
