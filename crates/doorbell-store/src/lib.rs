//! doorbell's files: the bridge folder and its inboxes, appends under `flock` with torn-tail
//! repair, a line reader that never buffers more than one allowed line, agent cursors, the
//! bridge lock, the verdict journal, and the synchronous catch-up that judges every unjudged
//! line.
//!
//! Invariants kept here: an inbox is never rewritten by doorbell; nothing inside the bridge
//! folder is followed through a symlink; a verdict is journaled before anything acts on it.

pub mod append;
pub mod atomic;
pub mod board;
pub mod bridge;
pub mod checkpoint;
pub mod config;
pub mod cursor;
mod error;
pub mod fault;
#[doc(hidden)]
pub mod fuzzing;
pub mod halves;
pub mod hash;
pub mod ids;
pub mod index;
pub mod journal;
mod journal_json;
pub mod judge;
pub mod lock;
pub mod reader;
pub mod refused;
pub mod reports;
pub mod seal;
pub mod segments;
pub mod send;
mod turns;
pub mod view;

pub use bridge::Bridge;
pub use config::Config;
pub use error::{Error, Result};
pub use judge::{CatchUp, Judge};
pub use lock::BridgeLock;
pub use view::View;
