//! `drover-csi-check`: holds a CSI plugin to the spec. Point it at a plugin's socket:
//!
//! ```sh
//! cargo run --bin drover-csi-check -- unix:///path/csi.sock
//! ```
//!
//! Every case the plugin advertises what it needs for runs (volumes and snapshots it makes
//! are removed after); the rest are listed as skipped. Node cases stage and publish under
//! `--work-dir` (bind mounts: run as root, on the node the plugin serves), unless
//! `--controller-only`. Exits 1 when a case fails.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "drover-csi-check",
    about = "A CSI conformance check, written from the CSI spec"
)]
struct Args {
    /// The plugin's socket: unix:///path/csi.sock (or the path).
    endpoint: String,
    /// Where node cases make staging and target paths (default: a fresh temporary dir).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Skip the node service (a controller-only plugin, or no root to mount).
    #[arg(long)]
    controller_only: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let given = args.work_dir.is_some();
    let work_dir = args
        .work_dir
        .unwrap_or_else(|| std::env::temp_dir().join(format!("drover-csi-check-{}", std::process::id())));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("drover-csi-check: {error}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async move {
        let check =
            match drover_host::csi_check::Check::connect(&args.endpoint, work_dir.clone(), !args.controller_only).await
            {
                Ok(check) => check,
                Err(error) => {
                    eprintln!("drover-csi-check: {error}");
                    return ExitCode::from(2);
                }
            };
        let report = check.run().await;
        println!("{report}");
        // Its own work dir goes; an operator's stays. Nothing that holds a file is deleted
        // (it may be a mount a case could not undo): it is named, and the run fails.
        let left = drover_host::csi_check::remove_empty_dirs(&work_dir, given);
        if !left.is_empty() {
            eprintln!("drover-csi-check: could not clean up the work dir; left behind:");
            for path in &left {
                eprintln!("  {}", path.display());
            }
            return ExitCode::from(1);
        }
        if report.passed() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    })
}
