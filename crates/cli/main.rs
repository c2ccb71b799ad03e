//! The `doorbell` binary: parse the command line, set up logging, run the command, and turn
//! its outcome into an exit code. Everything else lives in the modules beside this file.

#[macro_use]
mod output;
mod agent;
mod args;
mod check;
mod daemon;
mod exit;
mod read;
mod reply;
mod report;
mod send;
mod session;
mod show;
mod status;
mod wait;
mod watch;

fn main() {
    let args = <args::Cli as clap::Parser>::parse();
    let code = match args.run() {
        Ok(code) => code,
        Err(error) => exit::report(&error),
    };
    std::process::exit(code);
}
