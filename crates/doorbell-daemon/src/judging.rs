//! The judging thread: the only place the daemon judges. It owns the `Judge`, sleeps on its
//! channel until a hint or one of its own deadlines (the notice window, the next checkpoint)
//! arrives, and never wakes otherwise.

use std::collections::BTreeSet;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use chrono::Utc;
use doorbell_store::judge::Arrival;
use doorbell_store::{CatchUp, Config, Judge};
use tokio::sync::mpsc::UnboundedSender;

use crate::Ready;

/// Refusals to one sender within this window share one notice.
const NOTICE_WINDOW: Duration = Duration::from_millis(200);
/// How long judged lines may wait for a checkpoint. The journal is the truth in between;
/// the checkpoint only shortens the replay after a restart.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);

/// What the judging thread is told.
#[derive(Debug)]
pub enum Input {
    /// Read this inbox to its end.
    Inbox(String),
    /// Events were lost: read every inbox to its end.
    Rescan,
    /// A daily report was written: announce it.
    Reports,
    /// Use this (validated) config for lines judged from now on.
    Reload(Config),
    /// Write what is due, checkpoint, and return.
    Stop,
}

/// Judge until told to stop. Arrivals of accepted lines go to `arrivals` for the hooks.
pub fn run(
    mut judge: Judge,
    inputs: &Receiver<Input>,
    arrivals: &UnboundedSender<(String, Arrival)>,
    ready: impl FnOnce(&Ready),
) -> doorbell_store::Result<()> {
    // Read every inbox to its end, and the journal, before emitting anything.
    let stats = match judge.catch_up(Utc::now()) {
        Err(doorbell_store::Error::Interrupted) => return judge.checkpoint(),
        other => other?,
    };
    judge.checkpoint()?;
    announce(&stats, arrivals);
    ready(&Ready {
        dir: judge.bridge().dir().to_path_buf(),
        inboxes: judge.snapshot().inboxes.len(),
        judged: stats.judged(),
    });
    let mut notice_due: Option<Instant> = None;
    let mut checkpoint_due: Option<Instant> = None;
    loop {
        // The doorbell's next ring, on the judge's clock, as a deadline on this thread's.
        let ring_due = judge.next_due().map(|at| {
            let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            Instant::now() + wait
        });
        let due = [notice_due, checkpoint_due, ring_due]
            .into_iter()
            .flatten()
            .min();
        let first = match due {
            Some(due) => match inputs.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(input) => Some(input),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(Input::Stop),
            },
            None => Some(inputs.recv().unwrap_or(Input::Stop)),
        };
        let mut dirty = BTreeSet::new();
        let mut rescan = false;
        let mut stop = false;
        let mut announce_reports = false;
        let mut take = |input: Input, judge: &mut Judge| -> doorbell_store::Result<()> {
            match input {
                Input::Inbox(name) => {
                    dirty.insert(name);
                }
                Input::Rescan => rescan = true,
                Input::Reports => announce_reports = true,
                Input::Reload(config) => judge.set_config(config)?,
                Input::Stop => stop = true,
            }
            Ok(())
        };
        if let Some(input) = first {
            take(input, &mut judge)?;
            // Everything already queued joins this sweep.
            while let Ok(input) = inputs.try_recv() {
                take(input, &mut judge)?;
            }
        }
        if stop {
            break;
        }
        let now = Utc::now();
        let stats = if rescan {
            Some(judge.sweep_all(now))
        } else if dirty.is_empty() {
            None
        } else {
            let names: Vec<String> = dirty.into_iter().collect();
            Some(judge.sweep(&names, now))
        };
        if let Some(stats) = stats {
            let stats = match stats {
                // Stopping: everything journaled so far stands; the rest waits for the next start.
                Err(doorbell_store::Error::Interrupted) => break,
                other => other?,
            };
            if stats.judged() > 0 {
                checkpoint_due.get_or_insert_with(|| Instant::now() + CHECKPOINT_EVERY);
            }
            announce(&stats, arrivals);
        }
        if judge.has_untold() {
            notice_due.get_or_insert_with(|| Instant::now() + NOTICE_WINDOW);
        }
        let now_instant = Instant::now();
        let ringing = ring_due.is_some_and(|due| due <= now_instant);
        if announce_reports || ringing || notice_due.is_some_and(|due| due <= now_instant) {
            notice_due = None;
            let mut stats = CatchUp::default();
            // The notices come back as file events and are judged then.
            judge.emit(Utc::now(), &mut stats)?;
        }
        if checkpoint_due.is_some_and(|due| due <= now_instant) {
            checkpoint_due = None;
            judge.checkpoint()?;
        }
    }
    let mut stats = judge.drain_replaced(Utc::now())?;
    if stats.judged() > 0 {
        tracing::info!(
            lines = stats.judged(),
            "judged the rest of a replaced or deleted inbox before stopping"
        );
    }
    announce(&stats, arrivals);
    if judge.has_untold() {
        judge.emit(Utc::now(), &mut stats)?;
    }
    judge.checkpoint()?;
    tracing::info!("stopped");
    Ok(())
}

fn announce(stats: &CatchUp, arrivals: &UnboundedSender<(String, Arrival)>) {
    if stats.judged() > 0 {
        tracing::debug!(
            accepted = stats.accepted,
            duplicate = stats.duplicate,
            refused = stats.refused,
            "judged"
        );
    }
    for (agent, arrival) in &stats.arrivals {
        let _ = arrivals.send((agent.clone(), arrival.clone()));
    }
}
