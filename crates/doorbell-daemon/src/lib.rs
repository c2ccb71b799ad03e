//! The long-running judge. One `notify` watch on the bridge folder turns file events into
//! hints; a dedicated judging thread reads the hinted inboxes to their end (reading to EOF is
//! the truth, events are only hints), writes notices after a short coalescing window, and
//! saves checkpoints off the hot path. Hooks run on tokio tasks, one per agent.
//!
//! It never polls: when nothing is written, every thread is blocked on a channel or a timer
//! that is due.

pub mod deliver;
mod hooks;
mod judging;
pub mod tell;
pub mod waiter;
mod watcher;

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use doorbell_store::{Bridge, BridgeLock, Config, Judge};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

pub use judging::Input;

/// What can stop the daemon.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] doorbell_store::Error),
    #[error("watching {dir}: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
    #[error("setting up signals: {0}")]
    Signals(#[source] std::io::Error),
    #[error("starting a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the judging thread stopped unexpectedly")]
    JudgeGone,
}

/// What the daemon needs to start.
#[derive(Debug)]
pub struct Options {
    pub bridge: Bridge,
    pub lock: BridgeLock,
    /// The config file to read again on SIGHUP (`None`: the default path).
    pub config_path: Option<PathBuf>,
    /// SIGHUP's listener, made as early as the caller could: until one is made, a SIGHUP
    /// ends the process (its default action), and one that comes while the judge opens and
    /// catches up reloads the config once it is ready. `None`: made first thing here.
    pub hangup: Option<tokio::signal::unix::Signal>,
}

/// SIGHUP's listener, made now.
fn hangup() -> Result<tokio::signal::unix::Signal, Error> {
    signal(SignalKind::hangup()).map_err(Error::Signals)
}

/// What the daemon found when it became ready.
#[derive(Debug, Clone)]
pub struct Ready {
    pub dir: PathBuf,
    pub inboxes: usize,
    pub judged: u64,
}

/// Run the judge until `shutdown` completes. `ready` is called once the startup catch-up is
/// done and every later write will be seen. SIGHUP reloads the config (validated first).
pub async fn run(
    mut options: Options,
    ready: impl FnOnce(&Ready) + Send + 'static,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut hangup = options.hangup.take().map_or_else(hangup, Ok)?;
    let dir = options.bridge.dir().to_path_buf();
    // A write past the file-size limit (`ulimit -f`, systemd's `LimitFSIZE=`) fails with
    // EFBIG, as any failed write, instead of SIGXFSZ killing the daemon: the judge pauses
    // and retries, a watch it printed for takes its output back.
    let mut too_large = signal(SignalKind::from_raw(rustix::process::Signal::XFSZ.as_raw()))
        .map_err(Error::Signals)?;
    let (inputs, receiver) = std::sync::mpsc::channel();
    // Until the start-up catch-up is done the seat is empty and hints queue for the
    // judging thread; from then on the watch's thread judges an inbox as its event comes.
    let seat = judging::Seat::default();
    // The watch exists before the first sweep, so an inbox created in between is seen.
    let _watcher = watcher::watch(&dir, inputs.clone(), seat.clone())?;
    let judge = Judge::open(options.bridge.clone(), options.lock)?;
    let interrupt = judge.interrupt_flag();
    let (arrivals_tx, mut arrivals_rx) = tokio::sync::mpsc::unbounded_channel();
    let (config_tx, config_rx) =
        tokio::sync::watch::channel(Arc::new(options.bridge.config.clone()));
    // Watchers are told what is journaled directly; without the socket they read the file.
    let watchers = options
        .bridge
        .state_dir()
        .map_err(std::io::Error::other)
        .and_then(|state| tell::Watchers::listen(&state, Some(options.bridge.clone())))
        .inspect_err(|error| {
            tracing::warn!(%error, "cannot listen for watchers: they follow the journal file");
        })
        .ok();
    let judging_seat = seat.clone();
    let judging = tokio::task::spawn_blocking(move || {
        judging::run(
            judge,
            &receiver,
            &arrivals_tx,
            watchers,
            &judging_seat,
            ready,
        )
    });
    let cancel = CancellationToken::new();
    let mut hooks = hooks::Hooks::new(config_rx, cancel.clone());
    tokio::pin!(shutdown);
    tokio::pin!(judging);
    // The file the config in use came from: a reload that finds none there keeps it.
    let mut loaded_from = options.bridge.config.path.clone();
    let outcome = loop {
        tokio::select! {
            () = &mut shutdown => {
                tracing::info!("stopping");
                interrupt.store(true, Ordering::Relaxed);
                let _ = inputs.send(Input::Stop);
                break (&mut judging).await;
            }
            result = &mut judging => break result,
            Some(()) = too_large.recv() => {
                tracing::warn!(
                    "a write went past the file-size limit (ulimit -f, LimitFSIZE=) and failed; what it was for is said where it was made"
                );
            }
            Some(()) = hangup.recv() => {
                match Config::load(options.config_path.as_deref()) {
                    // The default file, gone since (moved away, or mid-edit by a tool that
                    // writes a new file): the defaults are not what was meant.
                    Ok(config) if config.path.is_none() && loaded_from.is_some() => {
                        tracing::error!(
                            path = ?loaded_from,
                            "config not reloaded: the file it was loaded from is gone; keeping the old one"
                        );
                    }
                    Ok(config) => {
                        loaded_from.clone_from(&config.path);
                        let path = config.path.clone();
                        if config.dir != options.bridge.config.dir {
                            tracing::warn!(
                                ?path,
                                judging = %options.bridge.dir().display(),
                                "the config's 'dir' changed: it takes effect when the daemon starts; until then this one judges the folder it started on"
                            );
                        }
                        if (&config.remotes, config.a2a_listen)
                            != (&options.bridge.config.remotes, options.bridge.config.a2a_listen)
                        {
                            // The forwarders and the gateway are made at the start, while
                            // readers read the file as it is: say that they differ now.
                            tracing::warn!(
                                ?path,
                                "[[remote]] and [a2a] take effect when the daemon starts: restart it for the forwarders and the gateway to follow the new ones"
                            );
                        }
                        let _ = config_tx.send(Arc::new(config.clone()));
                        let mut bridge = options.bridge.clone();
                        bridge.config = config.clone();
                        seat.reload(config, &inputs);
                        // Logged once handed over: a line written after this is judged with it.
                        tracing::info!(?path, "config reloaded");
                        for warning in bridge.config_warnings().unwrap_or_default() {
                            tracing::warn!("{warning}");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "config not reloaded; keeping the old one"),
                }
            }
            Some((agent, arrival)) = arrivals_rx.recv() => hooks.deliver(&agent, arrival),
        }
    };
    cancel.cancel();
    hooks.stop().await;
    match outcome {
        Ok(result) => result.map_err(Error::from),
        Err(_) => Err(Error::JudgeGone),
    }
}
