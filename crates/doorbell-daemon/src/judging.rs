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

use crate::tell::Watchers;
use crate::Ready;

/// How often a notice that could not be written is tried again.
const NOTICE_RETRY: Duration = Duration::from_secs(2);
/// Refusals to one sender within this window share one notice.
const NOTICE_WINDOW: Duration = Duration::from_millis(200);
/// How long judged lines may wait for a checkpoint. The journal is the truth in between;
/// the checkpoint (a save of what changed into the index) only shortens the replay of a
/// restart or a reader. Saving less often writes fewer pages per message.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(30);
/// The board is written this long after the first change since it was last written, so a
/// burst of lines makes one write.
const BOARD_AFTER: Duration = Duration::from_secs(1);
/// The live journal is sealed as a segment once it is this large.
const SEGMENT_BYTES: u64 = 64 << 20;
/// A checkpoint is due sooner once the journal grew this much: what a reader replays stays
/// small under heavy traffic.
const CHECKPOINT_AFTER_BYTES: u64 = 256 << 10;

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
    Reload(Box<Config>),
    /// Write what is due, checkpoint, and return.
    Stop,
}

/// The judging thread's own deadlines.
#[derive(Debug, Default)]
struct Deadlines {
    notice: Option<Instant>,
    checkpoint: Option<Instant>,
    /// Set while writes fail: when to reload from the disk and try again.
    retry: Option<Instant>,
    /// How long the last wait before a retry was.
    backoff: Duration,
    /// When to write the board (`board = true`): shortly after the bridge changed.
    board: Option<Instant>,
}

/// What the inputs taken at one wake ask for.
#[derive(Debug, Default)]
struct Batch {
    dirty: BTreeSet<String>,
    rescan: bool,
    reports: bool,
    stop: bool,
    /// A new config to judge with from now on (the latest, when several came).
    config: Option<Config>,
    /// When the doorbell next rings, as of this wake.
    ring: Option<Instant>,
}

/// Judge until told to stop. Arrivals of accepted lines go to `arrivals` for the hooks.
///
/// A failed write (a full disk, a read-only file system) does not stop the daemon: it logs
/// the error, throws away what it knows, and after a pause (1 s, doubling up to 30 s) loads
/// it again from the disk and reads every inbox to its end. Nothing journaled is lost and
/// nothing unjournaled was acted on, so the retry judges exactly the lines that were not.
pub fn run(
    mut judge: Judge,
    inputs: &Receiver<Input>,
    arrivals: &UnboundedSender<(String, Arrival)>,
    watchers: Option<&Watchers>,
    ready: impl FnOnce(&Ready),
) -> doorbell_store::Result<()> {
    if watchers.is_some() {
        judge.keep_journal_copy();
    }
    // A long-running judge rings from memory: every open request is there. Its saves run
    // on their own thread from the start, the start-up catch-up's included.
    judge.keep_open_in_memory()?;
    judge.save_in_background();
    // Read every inbox to its end, and the journal, before emitting anything.
    let stats = match judge.catch_up(Utc::now()) {
        Err(doorbell_store::Error::Interrupted) => return judge.checkpoint(),
        other => other?,
    };
    judge.checkpoint()?;
    tell(&mut judge, watchers);
    announce(&stats, arrivals);
    ready(&Ready {
        dir: judge.bridge().dir().to_path_buf(),
        inboxes: judge.snapshot().inboxes.len(),
        judged: stats.judged(),
    });
    let mut due = Deadlines::default();
    if judge.bridge().config.board {
        write_board(&judge);
    }
    loop {
        let mut batch = receive(&judge, inputs, &due);
        if batch.stop {
            break;
        }
        if let Some(config) = batch.config.take() {
            if let Err(e) = judge.set_config(config) {
                failed(&mut due, &e);
            }
        }
        // While writes fail, inputs only wait for the retry (which reads everything anyway).
        if due.retry.is_some_and(|at| Instant::now() < at) {
            continue;
        }
        match step(&mut judge, batch, &mut due, arrivals) {
            Ok(()) => {
                if due.retry.take().is_some() {
                    tracing::info!("writing works again: judging resumed");
                    due.backoff = Duration::ZERO;
                }
            }
            Err(doorbell_store::Error::Interrupted) => break,
            Err(e) => failed(&mut due, &e),
        }
        tell(&mut judge, watchers);
    }
    if let Err(error) = judge.settle() {
        // The journal has what the index missed; the next start replays it.
        tracing::error!(%error, "could not save the last checkpoint");
        due.retry.get_or_insert_with(Instant::now);
    }
    if due.retry.is_some() {
        tracing::warn!("stopped while writes fail; unjudged lines wait for the next start");
        return Ok(());
    }
    finish(judge, arrivals)
}

/// Wait for inputs or the first deadline, and take every input already queued with it.
fn receive(judge: &Judge, inputs: &Receiver<Input>, due: &Deadlines) -> Batch {
    // The doorbell's next ring, on the judge's clock, as a deadline on this thread's.
    let ring = judge.next_due().map(|at| {
        let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        Instant::now() + wait
    });
    let next = if due.retry.is_some() {
        due.retry
    } else {
        [due.notice, due.checkpoint, due.board, ring]
            .into_iter()
            .flatten()
            .min()
    };
    let first = match next {
        Some(at) => match inputs.recv_timeout(at.saturating_duration_since(Instant::now())) {
            Ok(input) => Some(input),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Input::Stop),
        },
        None => Some(inputs.recv().unwrap_or(Input::Stop)),
    };
    let mut batch = Batch {
        ring,
        ..Batch::default()
    };
    for input in first
        .into_iter()
        .chain(std::iter::from_fn(|| inputs.try_recv().ok()))
    {
        match input {
            Input::Inbox(name) => {
                batch.dirty.insert(name);
            }
            Input::Rescan => batch.rescan = true,
            Input::Reports => batch.reports = true,
            Input::Reload(config) => batch.config = Some(*config),
            Input::Stop => batch.stop = true,
        }
    }
    batch
}

/// Judge what the batch names, and do what is due: notices, rings, reports, a checkpoint.
fn step(
    judge: &mut Judge,
    mut batch: Batch,
    due: &mut Deadlines,
    arrivals: &UnboundedSender<(String, Arrival)>,
) -> doorbell_store::Result<()> {
    if due.retry.is_some() {
        judge.reload()?;
        batch.rescan = true;
        batch.reports = true;
    }
    let now = Utc::now();
    let stats = if batch.rescan {
        Some(judge.sweep_all(now)?)
    } else if batch.dirty.is_empty() {
        None
    } else {
        let names: Vec<String> = batch.dirty.into_iter().collect();
        Some(judge.sweep(&names, now)?)
    };
    if let Some(stats) = stats {
        if stats.judged() > 0 {
            due.checkpoint
                .get_or_insert_with(|| Instant::now() + CHECKPOINT_EVERY);
            if judge.bridge().config.board {
                due.board
                    .get_or_insert_with(|| Instant::now() + BOARD_AFTER);
            }
        }
        if judge.unsaved_bytes() > CHECKPOINT_AFTER_BYTES {
            due.checkpoint = Some(Instant::now());
        }
        announce(&stats, arrivals);
    }
    if judge.has_untold() {
        due.notice
            .get_or_insert_with(|| Instant::now() + NOTICE_WINDOW);
    } else if judge.has_unwritten() {
        // A notice whose inbox another process holds locked: try again in a while.
        due.notice
            .get_or_insert_with(|| Instant::now() + NOTICE_RETRY);
    }
    let now_instant = Instant::now();
    let ringing = batch.ring.is_some_and(|at| at <= now_instant);
    if batch.reports || ringing || due.notice.is_some_and(|at| at <= now_instant) {
        due.notice = None;
        let mut stats = CatchUp::default();
        // The notices come back as file events and are judged then.
        judge.emit(Utc::now(), &mut stats)?;
    }
    if due.board.is_some_and(|at| at <= now_instant) {
        due.board = None;
        write_board(judge);
    }
    if due.checkpoint.is_some_and(|at| at <= now_instant) {
        // A large live journal is sealed as a segment (after a save of everything), so that
        // `doorbell compact` can compress it; otherwise the save goes to its thread.
        due.checkpoint =
            if judge.roll_if_over(SEGMENT_BYTES)? || judge.checkpoint_in_background()? {
                None
            } else {
                // The last one is still being saved: try again a little later.
                Some(now_instant + CHECKPOINT_EVERY / 5)
            };
    }
    Ok(())
}

/// Hand the watchers what was journaled since they were last told. A failure here is the
/// journal's own (its next write fails too, and is handled there).
fn tell(judge: &mut Judge, watchers: Option<&Watchers>) {
    let Some(watchers) = watchers else {
        return;
    };
    match judge.take_appended() {
        Ok(Some(appended)) => watchers.tell(&appended),
        Ok(None) => {}
        Err(error) => tracing::debug!(%error, "nothing told to the watchers"),
    }
}

/// Write the board from what is journaled now; a failure is logged, never fatal.
fn write_board(judge: &Judge) {
    if let Err(error) = doorbell_store::board::write(judge.bridge()) {
        tracing::warn!(%error, "could not write the board (STATUS.md)");
    }
}

/// A write failed: say so plainly, and plan the retry.
fn failed(due: &mut Deadlines, error: &doorbell_store::Error) {
    due.backoff = (due.backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(30));
    if due.retry.is_none() {
        tracing::error!(%error, "judging paused: a write failed; nothing journaled is lost, and every inbox is read again once writing works");
    } else {
        tracing::warn!(%error, retry_in = ?due.backoff, "writing still fails");
    }
    due.retry = Some(Instant::now() + due.backoff);
}

/// Stopping: drain what only this process can reach, write what is due, checkpoint.
fn finish(
    mut judge: Judge,
    arrivals: &UnboundedSender<(String, Arrival)>,
) -> doorbell_store::Result<()> {
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
