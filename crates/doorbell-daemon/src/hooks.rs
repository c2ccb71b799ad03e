//! Per-agent hooks: an argv from the config, run without a shell when accepted lines arrive
//! for that agent. The environment is cleared to `PATH`, `HOME` and the `DOORBELL_*`
//! variables — never message text: a message is a doorbell, never an instruction. Bursts
//! within 500 ms coalesce into one call, one call is in flight per agent, a call is killed
//! after 10 s (with everything it started: each call is its own process group), and a
//! failure is logged, never fatal.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use doorbell_store::judge::Arrival;
use doorbell_store::Config;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

const COALESCE: Duration = Duration::from_millis(500);
const KILL_AFTER: Duration = Duration::from_secs(10);
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The hook tasks, one per agent that has a hook and has had arrivals.
pub struct Hooks {
    tasks: JoinSet<()>,
    senders: HashMap<String, UnboundedSender<Arrival>>,
    config: watch::Receiver<Arc<Config>>,
    cancel: CancellationToken,
}

impl Hooks {
    pub fn new(config: watch::Receiver<Arc<Config>>, cancel: CancellationToken) -> Hooks {
        Hooks {
            tasks: JoinSet::new(),
            senders: HashMap::new(),
            config,
            cancel,
        }
    }

    /// Tell `agent`'s hook about accepted lines, if it has a hook.
    pub fn deliver(&mut self, agent: &str, arrival: Arrival) {
        if self.config.borrow().hook(agent).is_none() {
            return;
        }
        let sender = self.senders.entry(agent.to_owned()).or_insert_with(|| {
            let (tx, rx) = unbounded_channel();
            self.tasks.spawn(agent_task(
                agent.to_owned(),
                rx,
                self.config.clone(),
                self.cancel.clone(),
            ));
            tx
        });
        let _ = sender.send(arrival);
    }

    /// Stop every hook task; a hook still running is killed.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        self.senders.clear();
        while self.tasks.join_next().await.is_some() {}
    }
}

async fn agent_task(
    agent: String,
    mut arrivals: UnboundedReceiver<Arrival>,
    config: watch::Receiver<Arc<Config>>,
    cancel: CancellationToken,
) {
    loop {
        let mut batch = tokio::select! {
            () = cancel.cancelled() => return,
            arrival = arrivals.recv() => match arrival {
                Some(arrival) => arrival,
                None => return,
            },
        };
        let window = tokio::time::sleep(COALESCE);
        tokio::pin!(window);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = &mut window => break,
                arrival = arrivals.recv() => match arrival {
                    Some(more) => {
                        batch.count += more.count;
                        batch.last_id = more.last_id;
                        batch.last_from = more.last_from;
                        batch.last_kind = more.last_kind;
                    }
                    None => break,
                },
            }
        }
        let hook = config.borrow().hook(&agent).map(<[String]>::to_vec);
        if let Some(hook) = hook {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = call(&agent, &hook, &batch) => {}
            }
        }
    }
}

/// Run one hook call to its end, or kill it after `KILL_AFTER`.
async fn call(agent: &str, hook: &[String], batch: &Arrival) {
    let mut command = tokio::process::Command::new(&hook[0]);
    command
        .args(&hook[1..])
        .env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .env("DOORBELL_AGENT", agent)
        .env("DOORBELL_ID", &batch.last_id)
        .env("DOORBELL_COUNT", batch.count.to_string())
        .env("DOORBELL_FROM", &batch.last_from)
        .env("DOORBELL_KIND", batch.last_kind.as_str())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group, so a timeout kills what it started too.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(home) = std::env::var_os("HOME") {
        command.env("HOME", home);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            tracing::warn!(agent, program = %hook[0], %error, "hook could not start");
            return;
        }
    };
    match tokio::time::timeout(KILL_AFTER, child.wait()).await {
        Ok(Ok(status)) if status.success() => tracing::debug!(agent, "hook ran"),
        Ok(Ok(status)) => tracing::warn!(agent, %status, "hook failed"),
        Ok(Err(error)) => tracing::warn!(agent, %error, "hook could not be waited for"),
        Err(_) => {
            let group = child
                .id()
                .and_then(|pid| rustix::process::Pid::from_raw(pid.cast_signed()));
            if let Some(group) = group {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            let _ = child.kill().await;
            tracing::warn!(
                agent,
                "hook ran longer than 10 s: killed, with its process group"
            );
        }
    }
}
