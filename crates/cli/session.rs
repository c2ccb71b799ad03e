//! What every command starts from: the config, the bridge folder, and a view of the journal
//! that is caught up with the inboxes.

use std::path::{Path, PathBuf};

use anyhow::Context;
use doorbell_store::journal::Snapshot;
use doorbell_store::{Bridge, BridgeLock, Config, Judge};

/// The resolved config and bridge folder of one invocation.
pub struct Session {
    pub config: Config,
    pub dir: PathBuf,
}

impl Session {
    pub fn new(dir: Option<&Path>, config: Option<&Path>) -> anyhow::Result<Session> {
        let config = Config::load(config)?;
        let dir = doorbell_store::bridge::resolve_dir(dir, &config);
        Ok(Session { config, dir })
    }

    /// The existing bridge folder.
    pub fn bridge(&self) -> anyhow::Result<Bridge> {
        Ok(Bridge::open(&self.dir, self.config.clone())?)
    }

    /// The bridge folder, created when missing.
    pub fn bridge_or_create(&self) -> anyhow::Result<Bridge> {
        Ok(Bridge::create(&self.dir, self.config.clone())?)
    }
}

/// A command that caught up saves a checkpoint when the journal grew by more than this, so
/// the next command need not replay it.
const CHECKPOINT_AFTER: u64 = 4 << 20;

/// What the journal says, after catching up when no other judge runs. When one does, its
/// journal is read as it stands: a command never judges behind a judge's back.
pub fn caught_up(bridge: &Bridge) -> anyhow::Result<Snapshot> {
    match BridgeLock::try_acquire(bridge, "doorbell catch-up")? {
        Some(lock) => {
            let mut judge = Judge::open(bridge.clone(), lock)?;
            judge
                .catch_up(chrono::Utc::now())
                .context("catching up with the inboxes")?;
            judge.checkpoint_if_behind(CHECKPOINT_AFTER)?;
            Ok(judge.into_snapshot())
        }
        None => Ok(Snapshot::load(bridge)?),
    }
}

/// Log to stderr, with the level from `DOORBELL_LOG` (default: warnings).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DOORBELL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// `doorbell daemon --once`: become the judge, judge everything waiting, exit.
pub fn daemon_once(session: &Session) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let lock = crate::daemon::acquire(&bridge, "doorbell daemon --once")?;
    let mut judge = Judge::open(bridge, lock)?;
    let stats = judge.catch_up(chrono::Utc::now())?;
    judge.checkpoint()?;
    // The lock and the files close now; the ledger is left for the exit to reclaim: freeing
    // half a million entries one by one took a tenth of a large catch-up.
    std::mem::forget(judge.into_snapshot());
    eprintln!(
        "judged {} lines: {} accepted, {} duplicate, {} refused; {} notices written",
        stats.judged(),
        stats.accepted,
        stats.duplicate,
        stats.refused,
        stats.notices
    );
    Ok(crate::exit::OK)
}
