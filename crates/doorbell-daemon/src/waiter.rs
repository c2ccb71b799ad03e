//! Waiting for the bridge to change, for a process that is not the judge (`watch`, `wait`),
//! without polling: one `notify` watch on the bridge folder (inboxes) and one on `.doorbell/`
//! (the journal). Events are classified by the same `watcher::change` the daemon uses. Only
//! writes to inboxes and the journal wake a waiter; reads (our own included) and cursor files
//! do not. A write to an inbox wakes it only when no judge holds the lock: a running judge
//! will journal the line, and that wakes it then, without a useless turn on the way.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
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

/// One waiter's side of [`AfterTheJudge`]: asked after an inbox write seen while a judge
/// held the lock, it is woken (as if the write came now) once that judge lets go, and then
/// judges whatever the judge left unjudged itself.
struct Waiter {
    asked: AtomicBool,
    wake: Sender<()>,
    unjudged: Arc<AtomicBool>,
}

impl Waiter {
    fn ask(&self, service: &AfterTheJudge) {
        self.asked.store(true, Ordering::SeqCst);
        if !service.kicked.swap(true, Ordering::SeqCst) {
            let _ = service.kick.send(());
        }
    }
}

/// The thread that waits for the judge to let go of the bridge lock, one per process and
/// bridge for all its waiters: a long-lived process (`doorbell mcp`) waits again and again
/// while a daemon holds the lock for days, and a thread and an open lock for each wait never
/// ended before the daemon did.
struct AfterTheJudge {
    kick: Sender<()>,
    /// A kick is on its way: asks meanwhile need none of their own.
    kicked: AtomicBool,
    waiters: Mutex<Vec<Weak<Waiter>>>,
}

impl AfterTheJudge {
    /// The bridge's, started on first use.
    fn of(bridge: &Bridge) -> Result<Arc<AfterTheJudge>, Error> {
        static STARTED: OnceLock<Mutex<HashMap<PathBuf, Arc<AfterTheJudge>>>> = OnceLock::new();
        let (lock, path) = doorbell_store::lock::lock_file(bridge)?;
        let mut started = STARTED
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(service) = started.get(&path) {
            return Ok(Arc::clone(service));
        }
        let (kick, kicks) = channel::<()>();
        let service = Arc::new(AfterTheJudge {
            kick,
            kicked: AtomicBool::new(false),
            waiters: Mutex::default(),
        });
        let serving = Arc::clone(&service);
        let at = path.clone();
        std::thread::Builder::new()
            .name("after-the-judge".into())
            .spawn(move || serving.serve(&kicks, lock, &at))
            .map_err(Error::Thread)?;
        started.insert(path, Arc::clone(&service));
        Ok(service)
    }

    fn join(&self, asked: &Arc<Waiter>) {
        let mut waiters = self
            .waiters
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        waiters.retain(|waiter| waiter.strong_count() > 0);
        waiters.push(Arc::downgrade(asked));
    }

    /// For every kick: the waiters asked before it wait for the judge holding the lock to let
    /// go (a shared lock is taken and let go at once), then are woken. Those asked while it
    /// waits are served by the next round, after a lock taken after their ask.
    fn serve(&self, kicks: &Receiver<()>, mut lock: File, path: &std::path::Path) {
        while kicks.recv().is_ok() {
            while kicks.try_recv().is_ok() {}
            self.kicked.store(false, Ordering::SeqCst);
            let due: Vec<Arc<Waiter>> = {
                let mut waiters = self
                    .waiters
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                waiters.retain(|waiter| waiter.strong_count() > 0);
                waiters
                    .iter()
                    .filter_map(Weak::upgrade)
                    .filter(|waiter| waiter.asked.swap(false, Ordering::SeqCst))
                    .collect()
            };
            if due.is_empty() {
                continue;
            }
            // A lock file made anew (a restored `.doorbell/`) is the one judges take now.
            if !same_file(&lock, path) {
                if let Ok(again) = doorbell_store::lock::open_lock_file(path) {
                    lock = again;
                }
            }
            if lock.lock_shared().is_ok() {
                let _ = lock.unlock();
            }
            for waiter in due {
                waiter.unjudged.store(true, Ordering::Relaxed);
                let _ = waiter.wake.send(());
            }
        }
    }
}

/// Whether `file` is still the file at `path`.
fn same_file(file: &File, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(open), Ok(named)) => (open.dev(), open.ino()) == (named.dev(), named.ino()),
        _ => false,
    }
}

impl Events {
    /// Start watching before reading anything, so no change between the two is missed.
    pub fn new(bridge: &Bridge) -> Result<Events, Error> {
        let (tx, wakes) = channel();
        let state = bridge.state_dir()?;
        let (lock, _) = doorbell_store::lock::lock_file(bridge)?;
        let unjudged = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&unjudged);
        let service = AfterTheJudge::of(bridge)?;
        let asked = Arc::new(Waiter {
            asked: AtomicBool::new(false),
            wake: tx.clone(),
            unjudged: Arc::clone(&unjudged),
        });
        service.join(&asked);
        // Whatever the judge holding the lock now leaves unjudged (a daemon just killed, its
        // lines written before this waiter watched) is judged once it lets go: a killed
        // process lets go of its sockets and its lock in no set order, so the lock may still
        // be held when its watchers learn that it is gone.
        asked.ask(&service);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let wake = match change(&event) {
                    Change::Nothing | Change::Reports | Change::Cursor => false,
                    Change::Journal => true,
                    Change::Inbox(_) | Change::Rescan if judge_running(&lock) => {
                        // The judge holding the lock may not be the one that reads this
                        // write (a command's catch-up that passed this inbox, a daemon
                        // stopping): look again once it lets go.
                        asked.ask(&service);
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
