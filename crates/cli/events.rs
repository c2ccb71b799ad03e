//! Waiting for the bridge to change, without polling: one `notify` watch on the bridge folder
//! (inboxes) and one on `.doorbell/` (the journal). Only writes to inboxes and the journal
//! wake a waiter; reads (our own included) and cursor files do not.

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context;
use doorbell_store::bridge::inbox_name;
use doorbell_store::journal::JOURNAL_FILE;
use doorbell_store::{Bridge, BridgeLock, Judge};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

pub struct Events {
    _watcher: RecommendedWatcher,
    wakes: Receiver<()>,
}

fn wakes_us(event: &notify::Result<notify::Event>) -> bool {
    let Ok(event) = event else {
        return true;
    };
    if event.need_rescan() {
        return true;
    }
    if matches!(event.kind, EventKind::Access(_)) {
        return false;
    }
    event.paths.iter().any(|path| {
        path.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|name| name == JOURNAL_FILE || inbox_name(name).is_some())
    })
}

impl Events {
    /// Start watching before reading anything, so no change between the two is missed.
    pub fn new(bridge: &Bridge) -> anyhow::Result<Events> {
        let (tx, wakes) = channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if wakes_us(&event) {
                    let _ = tx.send(());
                }
            })
            .context("starting a file watcher")?;
        let state = bridge.state_dir()?;
        for dir in [bridge.dir(), state.as_path()] {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .with_context(|| format!("watching {}", dir.display()))?;
        }
        Ok(Events {
            _watcher: watcher,
            wakes,
        })
    }

    /// Block until something changed (true) or `deadline` passed (false).
    pub fn wait(&self, deadline: Option<Instant>) -> bool {
        let woke = match deadline {
            None => self.wakes.recv().is_ok(),
            Some(deadline) => match self
                .wakes
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(()) => true,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
            },
        };
        // Changes that came together are handled together.
        while self.wakes.try_recv().is_ok() {}
        woke
    }
}

/// When no judge runs, judge what is waiting, as `daemon --once` would, and step aside.
pub fn judge_if_idle(bridge: &Bridge) -> anyhow::Result<()> {
    if let Some(lock) = BridgeLock::try_acquire(bridge, "doorbell catch-up")? {
        let mut judge = Judge::open(bridge.clone(), lock)?;
        judge.catch_up(chrono::Utc::now())?;
        judge.checkpoint_if_behind(4 << 20)?;
    }
    Ok(())
}

/// A short grace period for something just sent to be judged by a running daemon.
pub const GRACE: Duration = Duration::from_secs(2);
