//! `reconcile`: GitOps for SGLang inference servers run as systemd services.
//!
//! The core is pure (manifest -> unit -> plan, the `reconcile-core` crate); `remote` is the only
//! layer that reaches hosts, and `main` only parses the command line, runs it, and turns the result
//! into an exit code.

use std::process::ExitCode;

use clap::Parser;

use reconcile::cli::Cli;
use reconcile::run::{init_logging, report_error, run};

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            report_error(&e);
            ExitCode::from(1)
        }
    }
}
