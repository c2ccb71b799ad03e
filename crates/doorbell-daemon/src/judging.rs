//! The judging thread: the only place the daemon judges. It owns the `Judge`, sleeps on its
//! channel until a hint or one of its own deadlines (the notice window, the next checkpoint)
//! arrives, and never wakes otherwise.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
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
    /// A reader moved its cursor: the board's unread counts changed.
    Read,
    /// Use this (validated) config for lines judged from now on.
    Reload(Box<Config>),
    /// Look at the deadlines again (one came sooner).
    Wake,
    /// Write what is due, checkpoint, and return.
    Stop,
    /// The bridge folder itself was removed or moved: its watch ended with it.
    Gone,
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
    /// A reader moved its cursor.
    read: bool,
    /// Told to stop, or the folder went: the end of judging.
    end: Option<Input>,
    /// A new config to judge with from now on (the latest, when several came).
    config: Option<Config>,
    /// How many reloads came in it.
    reloads: usize,
    /// When the doorbell next rings, as of this wake.
    ring: Option<Instant>,
}

/// The judge and what it is due to do. The judging thread owns it between its waits; while
/// it waits, the watch's own thread judges an inbox the moment its event arrives (no hop
/// from one thread to another on the way from an append to a verdict).
struct Judging {
    judge: Judge,
    due: Deadlines,
    arrivals: UnboundedSender<(String, Arrival)>,
    /// Who is told what was journaled, after every step.
    watchers: Option<Watchers>,
    /// When the judging thread wakes next unless an input comes (`None`: only for one).
    sleeps_until: Option<Instant>,
    /// Why judging must end now (its state folder was replaced under it).
    ended: Option<doorbell_store::Error>,
}

/// Where the judge sits: empty before the start-up catch-up is done and once stopping began.
/// While a reload waits for the judging thread, hints go there too: a line written after
/// the reload was announced is judged with the new config.
#[derive(Debug, Clone, Default)]
pub struct Seat(Arc<Mutex<Option<Judging>>>, Arc<AtomicUsize>);

impl std::fmt::Debug for Judging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Judging").finish_non_exhaustive()
    }
}

impl Seat {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Judging>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hand a validated config to the judging thread; until it is applied, every hint
    /// waits for it there.
    pub fn reload(&self, config: Config, inputs: &Sender<Input>) {
        self.1.fetch_add(1, Ordering::SeqCst);
        if inputs.send(Input::Reload(Box::new(config))).is_err() {
            self.1.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Judge `inbox` now, on the calling thread (the watch's): true when done. False when the
    /// judging thread must (the start-up catch-up is not done, the daemon is stopping, or
    /// writes fail and wait for their retry): then hand it the hint.
    pub fn judge_now(&self, inbox: &str, inputs: &Sender<Input>) -> bool {
        if self.1.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let mut seat = self.lock();
        let Some(judging) = seat.as_mut() else {
            return false;
        };
        if judging.due.retry.is_some() {
            return false;
        }
        let batch = Batch {
            dirty: BTreeSet::from([inbox.to_owned()]),
            ..Batch::default()
        };
        if !judging.act(batch) {
            // Judging ends: the judging thread sees to it.
            let _ = inputs.send(Input::Wake);
            return true;
        }
        // The judging thread sleeps until its first deadline: wake it when one came sooner.
        let next = judging.next_wake();
        if next.is_some_and(|at| judging.sleeps_until.is_none_or(|until| at < until)) {
            judging.sleeps_until = next;
            let _ = inputs.send(Input::Wake);
        }
        true
    }
}

impl Judging {
    /// The first of the judge's own deadlines: the notice window, the next ring, the board,
    /// the next checkpoint, or the retry while writes fail.
    fn next_wake(&self) -> Option<Instant> {
        if self.due.retry.is_some() {
            return self.due.retry;
        }
        let ring = self.judge.next_due().map(|at| {
            let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            Instant::now() + wait
        });
        [self.due.notice, self.due.checkpoint, self.due.board, ring]
            .into_iter()
            .flatten()
            .min()
    }

    /// Do what `batch` asks, tell the watchers, announce the arrivals. False once judging
    /// must stop (an interrupted sweep).
    fn act(&mut self, mut batch: Batch) -> bool {
        // Ended (a hint judged on the watch's thread may come after): nothing more.
        if self.ended.is_some() {
            return false;
        }
        // Nothing is read or written there any more: not even to look, as a sweep would
        // (and could make files in a folder being restored).
        if matches!(batch.end, Some(Input::Gone)) {
            let e = doorbell_store::Error::FolderGone {
                dir: self.judge.bridge().dir().to_path_buf(),
            };
            tracing::error!(error = %e, "judging stops");
            self.ended = Some(e);
            return false;
        }
        if let Some(config) = batch.config.take() {
            if let Err(e) = self.judge.set_config(config) {
                failed(&mut self.due, &e);
            }
        }
        // While writes fail, inputs only wait for the retry (which reads everything anyway).
        if self.due.retry.is_some_and(|at| Instant::now() < at) {
            return true;
        }
        batch.ring = self.judge.next_due().map(|at| {
            let wait = (at - Utc::now()).to_std().unwrap_or(Duration::ZERO);
            Instant::now() + wait
        });
        let mut arrived = CatchUp::default();
        let going_on = match step(
            &mut self.judge,
            batch,
            &mut self.due,
            self.watchers.as_ref(),
            &mut arrived,
        ) {
            Ok(()) => {
                if self.due.retry.take().is_some() {
                    tracing::info!("writing works again: judging resumed");
                    self.due.backoff = Duration::ZERO;
                }
                true
            }
            Err(doorbell_store::Error::Interrupted) => false,
            Err(e @ doorbell_store::Error::StateReplaced { .. }) => {
                tracing::error!(error = %e, "judging stops");
                self.ended = Some(e);
                false
            }
            Err(e) => {
                failed(&mut self.due, &e);
                true
            }
        };
        // The watchers first: they are what an agent is looking at. What was judged was
        // told in the step, before its chores; this tells what they journaled (the notices'
        // intents), or everything when the step failed.
        tell(&mut self.judge, self.watchers.as_ref());
        announce(&self.judge, &arrived, &self.arrivals);
        going_on
    }
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
    watchers: Option<Watchers>,
    seat: &Seat,
    ready: impl FnOnce(&Ready),
) -> doorbell_store::Result<()> {
    if watchers.is_some() {
        judge.keep_journal_copy();
    }
    // A long-running judge rings from memory: every open request is there. Its saves run
    // on their own thread from the start, the start-up catch-up's included.
    judge.keep_open_in_memory()?;
    judge.save_in_background();
    // A bot that repeats its mistake every second gets one notice for each run of them.
    judge.space_notices();
    // From here a new id is known new without a query, once the filter's read is done.
    judge.filter_ids()?;
    // Read every inbox to its end, and the journal, before emitting anything.
    let stats = match judge.catch_up(Utc::now()) {
        Err(doorbell_store::Error::Interrupted) => return judge.checkpoint(),
        other => other?,
    };
    judge.checkpoint()?;
    judge.saves_give_way();
    tell(&mut judge, watchers.as_ref());
    announce(&judge, &stats, arrivals);
    ready(&Ready {
        dir: judge.bridge().dir().to_path_buf(),
        inboxes: judge.snapshot().inboxes.len(),
        judged: stats.judged(),
    });
    if judge.bridge().config.board {
        write_board(&judge);
    }
    // What the catch-up could not write (an inbox another process holds locked) is tried
    // again in a while, as after any step: nothing else may come to wake the judge.
    let mut due = Deadlines::default();
    if judge.has_untold() || judge.has_unwritten() {
        due.notice = Some(Instant::now() + NOTICE_RETRY);
    }
    *seat.lock() = Some(Judging {
        judge,
        due,
        arrivals: arrivals.clone(),
        watchers,
        sleeps_until: None,
        ended: None,
    });
    loop {
        // The first deadline is read with the judge in hand; the wait is without it.
        let next = seat.lock().as_mut().and_then(|judging| {
            judging.sleeps_until = judging.next_wake();
            judging.sleeps_until
        });
        let batch = receive(inputs, next);
        if matches!(batch.end, Some(Input::Stop)) {
            break;
        }
        let reloads = batch.reloads;
        let mut seated = seat.lock();
        let Some(judging) = seated.as_mut() else {
            break;
        };
        if judging.ended.is_some() {
            break;
        }
        let going_on = judging.act(batch);
        // Applied: hints may be judged where they arrive again.
        seat.1.fetch_sub(reloads, Ordering::SeqCst);
        if !going_on {
            break;
        }
    }
    // From here only this thread judges.
    let Some(Judging {
        mut judge,
        mut due,
        watchers,
        ended,
        ..
    }) = seat.lock().take()
    else {
        return Ok(());
    };
    if let Some(error) = ended {
        // Nothing more is written into files nobody reads: the next start judges from
        // what the folder holds now.
        return Err(error);
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
    let finished = finish(judge, arrivals);
    // The watchers are let go last: what the stop journaled they read from the file.
    drop(watchers);
    finished
}

/// Wait for inputs or the deadline `next`, and take every input already queued with it.
fn receive(inputs: &Receiver<Input>, next: Option<Instant>) -> Batch {
    let first = match next {
        Some(at) => match inputs.recv_timeout(at.saturating_duration_since(Instant::now())) {
            Ok(input) => Some(input),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Input::Stop),
        },
        None => Some(inputs.recv().unwrap_or(Input::Stop)),
    };
    let mut batch = Batch::default();
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
            Input::Read => batch.read = true,
            Input::Reload(config) => {
                batch.config = Some(*config);
                batch.reloads += 1;
            }
            Input::Wake => {}
            // The folder gone outweighs a stop: nothing more is written there either way.
            Input::Stop => {
                batch.end.get_or_insert(Input::Stop);
            }
            Input::Gone => batch.end = Some(Input::Gone),
        }
    }
    batch
}

/// Judge what the batch names, and do what is due: notices, rings, reports, a checkpoint.
/// What reached inboxes is added to `arrived`.
fn step(
    judge: &mut Judge,
    batch: Batch,
    due: &mut Deadlines,
    watchers: Option<&Watchers>,
    arrived: &mut CatchUp,
) -> doorbell_store::Result<()> {
    if due.retry.is_some() {
        judge.reload()?;
    }
    let (rescan, reports) = (
        batch.rescan || due.retry.is_some(),
        batch.reports || due.retry.is_some(),
    );
    // What was read changes the board's unread counts, though nothing was judged.
    if batch.read && judge.bridge().config.board {
        due.board
            .get_or_insert_with(|| Instant::now() + BOARD_AFTER);
    }
    let now = Utc::now();
    let stats = if rescan {
        Some(judge.sweep_all(now)?)
    } else if batch.dirty.is_empty() {
        None
    } else {
        let names: Vec<String> = batch.dirty.into_iter().collect();
        match watchers {
            // A long run of lines reaches the watchers in steps while the rest is judged.
            Some(watchers) => Some(judge.sweep_telling(&names, now, &mut |appended| {
                watchers.tell(appended, true);
            })?),
            None => Some(judge.sweep(&names, now)?),
        }
    };
    // What was judged reaches the watchers before the judge's own chores below (a
    // checkpoint's preparation took up to 0.7 ms, every 256 KB of journal).
    tell(judge, watchers);
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
        *arrived = stats;
    }
    if let Some(at) = judge.untold_due(Utc::now()) {
        // The earliest wins: a new sender is told within the window, whoever else waits.
        let at = Instant::now() + untold_wait(at);
        due.notice = Some(due.notice.map_or(at, |planned| planned.min(at)));
    } else if judge.has_unwritten() {
        // A notice whose inbox another process holds locked: try again in a while.
        due.notice
            .get_or_insert_with(|| Instant::now() + NOTICE_RETRY);
    }
    let now_instant = Instant::now();
    let ringing = batch.ring.is_some_and(|at| at <= now_instant);
    if reports || ringing || due.notice.is_some_and(|at| at <= now_instant) {
        due.notice = None;
        let mut stats = CatchUp::default();
        // The notices come back as file events and are judged then.
        judge.emit(Utc::now(), &mut stats)?;
        if judge.has_unwritten() {
            // An inbox still locked by another process: try again in a while, and again,
            // until it is let go (nothing else may come to wake the judge).
            due.notice = Some(Instant::now() + NOTICE_RETRY);
        }
        if let Some(at) = judge.untold_due(Utc::now()) {
            // A sender told a moment ago: the rest waits for the end of its spacing.
            let at = Instant::now() + untold_wait(at);
            due.notice = Some(due.notice.map_or(at, |retry| retry.min(at)));
        }
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
        Ok(Some(appended)) => watchers.tell(appended, false),
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

/// How long from now until refusals due at `at` are told: never sooner than the window
/// that gathers a burst into one notice.
fn untold_wait(at: chrono::DateTime<Utc>) -> Duration {
    (at - Utc::now())
        .to_std()
        .unwrap_or_default()
        .max(NOTICE_WINDOW)
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
    announce(&judge, &stats, arrivals);
    if judge.has_untold() {
        judge.emit(Utc::now(), &mut stats)?;
    }
    judge.checkpoint()?;
    if judge.bridge().config.board {
        if let Err(error) =
            doorbell_store::board::write_no_judge(judge.bridge(), "the daemon stopped")
        {
            tracing::warn!(%error, "could not write the board (STATUS.md)");
        }
    }
    tracing::info!("stopped");
    Ok(())
}

fn announce(judge: &Judge, stats: &CatchUp, arrivals: &UnboundedSender<(String, Arrival)>) {
    if stats.judged() > 0 {
        tracing::debug!(
            accepted = stats.accepted,
            duplicate = stats.duplicate,
            refused = stats.refused,
            "judged"
        );
    }
    // Only an agent with a hook is rung: the others' arrivals wake nobody. (The judge's config
    // and the hooks' change together on a reload.)
    let config = &judge.bridge().config;
    for (agent, arrival) in &stats.arrivals {
        if config.hook(agent).is_some() {
            let _ = arrivals.send((agent.clone(), arrival.clone()));
        }
    }
}
