//! `kvwasm metrics`: read the counters of a running process.

/// Read the counters a running process serves (KVWASM_METRICS_ADDR).
///
/// Any process using kvwasm, such as an inference engine with the shim,
/// started with KVWASM_METRICS_ADDR=ADDR serves them at http://ADDR/metrics.
#[derive(clap::Args)]
#[command(verbatim_doc_comment)]
pub struct MetricsArgs {
    /// Where the process serves its metrics (its KVWASM_METRICS_ADDR).
    #[arg(long, value_name = "HOST:PORT")]
    addr: String,
    /// Print the raw Prometheus text instead of a table.
    #[arg(long)]
    prometheus: bool,
}

pub fn run(args: MetricsArgs) -> anyhow::Result<()> {
    let url = format!("http://{}/metrics", args.addr);
    let text = reqwest::blocking::get(&url)
        .and_then(|r| r.error_for_status())
        .and_then(|r| r.text())
        .map_err(|e| anyhow::anyhow!("reading {url}: {e}"))?;
    if args.prometheus {
        print!("{text}");
        return Ok(());
    }
    const COLUMNS: [&str; 7] = [
        "calls",
        "errors",
        "traps",
        "timeouts",
        "denials",
        "bytes_in",
        "bytes_out",
    ];
    let mut rows: std::collections::BTreeMap<String, [u64; 7]> = Default::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some((metric, labels)) = series.split_once('{') else {
            continue;
        };
        let Some(column) = COLUMNS
            .iter()
            .position(|c| metric == format!("kvwasm_{c}_total"))
        else {
            continue;
        };
        let backend = labels
            .trim_start_matches("backend=\"")
            .trim_end_matches("\"}")
            .to_owned();
        rows.entry(backend).or_default()[column] = value.parse().unwrap_or(0);
    }
    print!("{:<20}", "backend");
    COLUMNS.iter().for_each(|c| print!(" {c:>12}"));
    println!();
    for (backend, values) in rows {
        print!("{backend:<20}");
        values.iter().for_each(|v| print!(" {v:>12}"));
        println!();
    }
    Ok(())
}
