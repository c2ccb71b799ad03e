//! Waiting for the bridge to change, for a process that is not the judge (`watch`, `wait`),
//! without polling: one `notify` watch on the bridge folder (inboxes) and one on `.doorbell/`
//! (the journal). Events are classified by the same `watcher::change` the daemon uses. Only
//! writes to inboxes and the journal wake a waiter; reads (our own included) and cursor files
//! do not. A write to an inbox wakes it only when no judge holds the lock: a running judge
//! will journal the line, and that wakes it then, without a useless turn on the way.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use doorbell_store::Bridge;
use notify::{RecommendedWatcher, RecursiveMode, Watcher};

use crate::watcher::{change, Change};
use crate::Error;

pub struct Events {
    _watcher: RecommendedWatcher,
    wakes: Receiver<()>,
    /// An inbox changed while no judge held the lock, since the last wait.
    unjudged: Arc<AtomicBool>,
}

/// Whether a judge holds the bridge lock right now. Probed with a shared lock that is let go
/// at once; an error counts as "no judge", which only costs a turn.
fn judge_running(lock: &File) -> bool {
    match lock.try_lock_shared() {
        Ok(()) => {
            let _ = lock.unlock();
            false
        }
        Err(std::fs::TryLockError::WouldBlock) => true,
        Err(std::fs::TryLockError::Error(_)) => false,
    }
}

/// A thread that, asked after an inbox write seen while a judge held the lock, waits for that
/// judge to let go and then wakes the waiter as if the write came now: whatever the judge left
/// unjudged, the waiter judges itself. While a daemon runs it simply waits on the lock.
fn after_the_judge(
    bridge: &Bridge,
    wake: Sender<()>,
    unjudged: Arc<AtomicBool>,
) -> Result<Sender<()>, Error> {
    let (lock, _) = doorbell_store::lock::lock_file(bridge)?;
    let (recheck, asked) = channel::<()>();
    std::thread::Builder::new()
        .name("after-the-judge".into())
        .spawn(move || {
            while asked.recv().is_ok() {
                if lock.lock_shared().is_ok() {
                    let _ = lock.unlock();
                }
                while asked.try_recv().is_ok() {}
                unjudged.store(true, Ordering::Relaxed);
                if wake.send(()).is_err() {
                    return;
                }
            }
        })
        .map_err(Error::Thread)?;
    Ok(recheck)
}

impl Events {
    /// Start watching before reading anything, so no change between the two is missed.
    pub fn new(bridge: &Bridge) -> Result<Events, Error> {
        let (tx, wakes) = channel();
        let state = bridge.state_dir()?;
        let (lock, _) = doorbell_store::lock::lock_file(bridge)?;
        let unjudged = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&unjudged);
        let recheck = after_the_judge(bridge, tx.clone(), Arc::clone(&unjudged))?;
        // Whatever the judge holding the lock now leaves unjudged (a daemon just killed, its
        // lines written before this waiter watched) is judged once it lets go: a killed
        // process lets go of its sockets and its lock in no set order, so the lock may still
        // be held when its watchers learn that it is gone.
        let _ = recheck.send(());
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let wake = match change(&event) {
                    Change::Nothing | Change::Reports | Change::Cursor => false,
                    Change::Journal => true,
                    Change::Inbox(_) | Change::Rescan if judge_running(&lock) => {
                        // The judge holding the lock may not be the one that reads this
                        // write (a command's catch-up that passed this inbox, a daemon
                        // stopping): look again once it lets go.
                        let _ = recheck.send(());
                        false
                    }
                    Change::Inbox(_) | Change::Rescan => {
                        flag.store(true, Ordering::Relaxed);
                        true
                    }
                };
                if wake {
                    let _ = tx.send(());
                }
            })
            .map_err(|source| Error::Watch {
                dir: bridge.dir().to_path_buf(),
                source,
            })?;
        for dir in [bridge.dir(), state.as_path()] {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .map_err(|source| Error::Watch {
                    dir: dir.to_path_buf(),
                    source,
                })?;
        }
        Ok(Events {
            _watcher: watcher,
            wakes,
            unjudged,
        })
    }

    /// Whether an inbox changed with no judge running since the last call: then the waiter
    /// should judge it itself.
    pub fn take_unjudged(&self) -> bool {
        self.unjudged.swap(false, Ordering::Relaxed)
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
pub fn judge_if_idle(bridge: &Bridge) -> Result<(), Error> {
    drop(doorbell_store::View::open(bridge)?);
    Ok(())
}

/// A short grace period for something just sent to be judged by a running daemon.
pub const GRACE: Duration = Duration::from_secs(2);
