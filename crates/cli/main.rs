//! The `doorbell` binary: parse the command line, set up logging, run the command, and turn
//! its outcome into an exit code. Everything else lives in the modules beside this file.

#[macro_use]
mod output;
mod a2a;
mod agent;
mod args;
mod check;
mod daemon;
mod exit;
mod export;
mod hook;
mod mcp;
mod read;
mod reply;
mod report;
mod send;
mod session;
mod setup;
mod show;
mod status;
mod wait;
mod watch;

fn main() {
    let args = match <args::Cli as clap::Parser>::try_parse() {
        Ok(args) => args,
        // A harness reads exit 2 from a hook as "block": a hook's bad command line is a
        // plain failure (1) instead, with clap's message.
        Err(error) if error.use_stderr() && is_hook() => {
            let _ = error.print();
            std::process::exit(exit::FAILURE);
        }
        Err(error) => error.exit(),
    };
    let code = match args.run() {
        Ok(code) => code,
        Err(error) => exit::report(&error),
    };
    std::process::exit(code);
}

/// Whether the command line may be a hook's: `hook` is one of its words. A line clap
/// could not read may not say where its command is (`--dir "$UNSET" hook …` takes `hook`
/// for the folder), and a hook's must never exit 2.
fn is_hook() -> bool {
    std::env::args_os().skip(1).any(|arg| arg == "hook")
}
