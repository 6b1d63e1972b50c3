//! The `verdict` command. Parsing and dispatch only; the work is in the library.

use clap::Parser;

fn main() -> std::process::ExitCode {
    verdict::init_logging();
    let cli = verdict::Cli::parse();
    match verdict::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verdict: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
