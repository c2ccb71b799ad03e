//! `doorbell daemon`: become the bridge's judge and run until SIGTERM or SIGINT.

use doorbell_core::report::plural;
use std::path::Path;

use doorbell_store::BridgeLock;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::OK;
use crate::session::Session;

/// Take the bridge lock for good. A command holds it only while it catches up (and a waiter
/// only probes it for an instant), so give it a moment; another daemon is refused (exit 3,
/// naming it) once it is seen holding the lock twice in a row.
pub fn acquire(bridge: &doorbell_store::Bridge, role: &str) -> anyhow::Result<BridgeLock> {
    let patience = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut daemon_seen = false;
    loop {
        if let Some(lock) = BridgeLock::try_acquire(bridge, role)? {
            return Ok(lock);
        }
        let holder = doorbell_store::lock::holder(bridge);
        // The lock file keeps its last holder's words; a waiter's probe can make the lock
        // look held for an instant, so one sighting of a daemon is not enough.
        let daemon = holder.ends_with(&format!("({ROLE})"));
        if (daemon && daemon_seen) || std::time::Instant::now() > patience {
            return Err(doorbell_store::Error::Locked {
                dir: bridge.dir().to_path_buf(),
                holder,
            }
            .into());
        }
        daemon_seen = daemon;
        // Pacing a retry against a short-lived holder, not waiting for a result.
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

const ROLE: &str = "doorbell daemon";

/// The A2A side of the daemon: the gateway when the config has `[a2a] listen` (bound now, so
/// a bad address stops the start), and a forwarder per `[[remote]]` with a `url`; both begin
/// when the returned sender is told the daemon is ready.
async fn a2a(bridge: &doorbell_store::Bridge) -> anyhow::Result<tokio::sync::oneshot::Sender<()>> {
    let (started, ready) = tokio::sync::oneshot::channel::<()>();
    doorbell_a2a::make_remote_inboxes(bridge)?;
    let remotes = doorbell_a2a::forward::remotes(bridge)?;
    let gateway = match bridge.config.a2a_listen {
        Some(listen) => Some(doorbell_a2a::bind(bridge.clone(), listen).await?),
        None => None,
    };
    let bridge = bridge.clone();
    tokio::spawn(async move {
        if ready.await.is_err() {
            return;
        }
        if let Err(error) = doorbell_a2a::forward::start(&bridge, remotes) {
            tracing::error!(%error, "the A2A forwarders did not start");
        }
        if let Some((listener, gateway)) = gateway {
            eprintln!(
                "doorbell: serving A2A on http://{}/a2a/<station>",
                gateway.addr()
            );
            if let Err(error) = doorbell_a2a::serve(listener, gateway, std::future::pending()).await
            {
                tracing::error!(%error, "the A2A gateway stopped");
            }
        }
    });
    Ok(started)
}

pub fn run(session: &Session, config_path: Option<&Path>) -> anyhow::Result<i32> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // SIGHUP is listened for first: its default action ends the process, and a reload
    // asked while the daemon starts (`systemctl reload` after a start, the index rebuilt
    // from a long journal) ended it for good (systemd does not restart a daemon a SIGHUP
    // ended). One that comes before the judge is ready reloads once it is.
    let hangup = {
        let _inside = runtime.enter();
        signal(SignalKind::hangup())?
    };
    let bridge = session.bridge()?;
    let lock = acquire(&bridge, ROLE)?;
    for warning in bridge.config_warnings()? {
        tracing::warn!("{warning}");
    }
    runtime.block_on(async {
        let mut terminate = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        // The gateway and the forwarders start once the catch-up is done: a retry that
        // comes at once is then judged against every line that came before it.
        let started = a2a(&bridge).await?;
        let options = doorbell_daemon::Options {
            bridge,
            lock,
            config_path: config_path.map(Path::to_path_buf),
            hangup: Some(hangup),
        };
        let ready = move |ready: &doorbell_daemon::Ready| {
            let _ = started.send(());
            eprintln!(
                "doorbell: judging {} ({}; {} caught up)",
                ready.dir.display(),
                plural(ready.inboxes, "inbox", "inboxes"),
                plural(ready.judged, "line", "lines")
            );
        };
        doorbell_daemon::run(options, ready, shutdown).await?;
        anyhow::Ok(())
    })?;
    Ok(OK)
}
