//! `kvwasm check-config`: validate a config and show the effective grants.

use std::path::PathBuf;

use kvwasm_host::component::GuestKind;
use kvwasm_host::config::{self, Config};
use kvwasm_host::limits::Limits;

/// Validate a config file and print the effective grants of every backend, fabric and event subscriber.
///
/// Components are loaded and their pins checked, peers resolved, limits and
/// tenant limits shown. Nothing is created or changed: a missing directory
/// is reported.
/// Environment variables are shown by name and whether they are set, never
/// by value. Exit status 1 if any of them is broken.
#[derive(clap::Args)]
#[command(verbatim_doc_comment, visible_alias = "run-check-config")]
pub struct CheckConfigArgs {
    /// The config file (default: $KVWASM_CONFIG, then the XDG and /etc locations).
    file: Option<PathBuf>,
}

pub fn run(args: CheckConfigArgs) -> anyhow::Result<std::process::ExitCode> {
    let path = match args.file {
        Some(path) => path,
        None => config::locate().map_err(anyhow::Error::msg)?,
    };
    let config = Config::load(&path).map_err(anyhow::Error::msg)?;
    println!(
        "config {}: {} backend(s), {} fabric(s), {} subscriber(s)",
        path.display(),
        config.backends.len(),
        config.fabrics.len(),
        config.subscribers.len()
    );
    let backends = config.backends.iter().map(|(name, spec)| {
        (
            "backends",
            name,
            spec,
            config.inspect(GuestKind::KvStore, name),
        )
    });
    let fabrics = config.fabrics.iter().map(|(name, spec)| {
        (
            "fabrics",
            name,
            spec,
            config.inspect(GuestKind::Fabric, name),
        )
    });
    let subscribers = config.subscribers.iter().map(|(name, spec)| {
        let built = config.inspect(GuestKind::Subscriber, name);
        ("subscribers", name, spec, built)
    });
    let mut broken = 0;
    for (table, name, spec, built) in backends.chain(fabrics).chain(subscribers) {
        println!("\n[{table}.{name}]");
        if !spec.tiers.is_empty() {
            // Validated with the whole file; its tiers are listed on their own.
            println!("  {}", tiered(&config, name));
            continue;
        }
        let backend = match built {
            Ok(b) => b,
            Err(e) => {
                broken += 1;
                println!("  ERROR      {e}");
                continue;
            }
        };
        let c = &backend.component;
        let pin = match &spec.sha256 {
            Some(_) => "pinned, matches",
            None => "not pinned",
        };
        println!(
            "  component  {} ({} bytes, sha256 {}, {pin})",
            backend.source, c.size, c.sha256
        );
        if c.is_advisor() {
            println!("  world      kvwasm:events/storage-advisor (a tiered store's advisor)");
        }
        let g = &backend.grants;
        // Validation changes nothing: a missing writable directory is
        // reported, and created only when the guest is loaded to run.
        let dirs: Vec<String> = g
            .dirs
            .iter()
            .map(|d| match (d.host.is_dir(), d.read_only) {
                (true, _) => d.describe(),
                (false, false) => format!(
                    "{}; missing: created when the guest is loaded",
                    d.describe()
                ),
                (false, true) => format!("{}; missing", d.describe()),
            })
            .collect();
        let origins: Vec<String> = g.http.origins.iter().map(|o| o.to_string()).collect();
        grant("dirs", &dirs);
        if g.list_dirs {
            grant(
                "listing",
                &["directory listings granted (list_dirs)".to_owned()],
            );
        }
        grant("net", &g.net.describe());
        grant("http", &origins);
        grant("env", &g.env.describe());
        grant("settings", &g.settings.describe());
        if let Some(tls) = &g.tls {
            grant("tls", &tls.describe());
        }
        println!("  limits     {}", limits(&backend.limits));
        let calls = backend
            .max_concurrent_calls
            .map_or("unlimited".to_string(), |n| n.to_string());
        if table == "subscribers" {
            let tokens = match backend.prehash_tokens {
                true => "hashed by the host (prehash_tokens)",
                false => "delivered as token ids",
            };
            println!(
                "             one instance, max concurrent calls {calls}; stored tokens {tokens}"
            );
        } else if table != "backends" {
            println!("             one instance, max concurrent calls {calls}");
        } else {
            let release = match (backend.idle_release_ms, backend.warm_handles) {
                (0, _) => "never".to_string(),
                (ms, 0) => format!("after {ms} ms"),
                (ms, warm) => format!(
                    "after {ms} ms, except on the {warm} most recently used handle(s) \
                     per directory (warm_handles)"
                ),
            };
            println!(
                "             max instances per handle {}, max concurrent calls {calls}, \
                 idle instances released {release}",
                backend.max_instances
            );
        }
        for (tenant, l) in &backend.tenant_limits {
            println!("  tenant     {tenant}: {}", limits(l));
        }
    }
    Ok(if broken == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        eprintln!("kvwasm: {broken} guest(s) cannot be loaded");
        std::process::ExitCode::FAILURE
    })
}

/// A tiered entry in one line: its tiers, their capacities, its knobs.
fn tiered(config: &Config, name: &str) -> String {
    let Ok(Some(t)) = kvwasm_host::tiering::config::TieredConfig::of(config, name) else {
        return "tiered store".into();
    };
    let tiers: Vec<String> = t
        .tiers
        .iter()
        .zip(&t.capacities)
        .map(|(tier, c)| match c {
            Some(bytes) => format!("{tier} ({} MiB)", bytes >> 20),
            None => format!("{tier} (last: durable, manifests)"),
        })
        .collect();
    format!(
        "tiered     {}\n             advisor {}, advised moves <= {}/s and {} MiB/s, \
         background demotion to {}% every {} ms",
        tiers.join(" -> "),
        t.advisor.as_deref().unwrap_or("(none)"),
        t.max_moves_per_sec,
        t.max_move_bytes_per_sec >> 20,
        t.low_water_pct,
        t.demote_interval_ms
    )
}

fn limits(l: &Limits) -> String {
    let fuel = l
        .fuel
        .map_or(String::new(), |f| format!(", fuel {f} per call"));
    format!(
        "memory {} MiB, call deadline {} ms, max payload {} MiB{fuel}",
        l.memory_limit_mib, l.call_timeout_ms, l.max_payload_mib
    )
}

/// One grant's lines under its title, or `(none)`.
fn grant(title: &str, lines: &[String]) {
    println!("  {title}");
    if lines.is_empty() {
        println!("             (none)");
    }
    for line in lines {
        println!("             {line}");
    }
}
