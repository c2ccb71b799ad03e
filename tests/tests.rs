//! End-to-end tests: the real `doorbell` binary and `scripts/doorbell-send` on real files in
//! a temporary bridge folder. One test binary, one module per feature.

mod util;

mod a2a;
mod catch_up;
mod check;
mod daemon;
#[cfg(feature = "long")]
mod disk;
mod doorbell;
mod federation;
mod folder;
mod generated;
mod history;
mod hooks;
mod mcp;
mod model;
mod order;
mod read;
mod script;
mod security;
mod seeds;
mod send;
mod senders;
mod setup;
mod torture;
mod waiting;
mod watchers;
