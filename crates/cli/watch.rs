//! `doorbell watch`: print an agent's backlog, then each new accepted message as it is
//! judged. A running daemon tells it what it journals over its socket (`.doorbell/watch.sock`);
//! otherwise it follows the journal file as the judge appends to it. Either way no replay and
//! no polling; the cursor moves only after the output was flushed; a closed pipe ends it
//! quietly. With no daemon running, it judges what arrives itself, briefly taking the lock
//! each time.

use std::os::unix::fs::MetadataExt;

use std::os::fd::AsFd;

use doorbell_daemon::deliver::{Record, Request};
use doorbell_daemon::tell::{Handed, Next, Returned, Told};
use doorbell_store::append::open_inbox;
use doorbell_store::cursor;
use doorbell_store::journal::Appended;
use doorbell_store::view::InboxView;
use doorbell_store::Bridge;

use crate::args::WatchArgs;
use crate::exit::OK;
use crate::read::{print_accepted, warn_replaced, Inbox, Printed};
use crate::session::{view, Session};
use doorbell_daemon::waiter::{judge_if_idle, Events};

pub fn run(session: &Session, args: &WatchArgs) -> anyhow::Result<i32> {
    let hand_over = args.json && !args.keep_output && stdout_is_a_pipe();
    follow_handing_over(
        session,
        &args.agent,
        args.json,
        Until::Stopped,
        "watch",
        hand_over,
    )
}

fn stdout_is_a_pipe() -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(stdout) = std::io::stdout().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(stdout)
        .metadata()
        .is_ok_and(|meta| meta.file_type().is_fifo())
}

/// How long to follow an inbox.
#[derive(Clone, Copy)]
pub enum Until {
    /// Until the reader goes away (`watch`).
    Stopped,
    /// Until at least one message was printed, or this deadline (`read --wait`: exit 124).
    FirstMessages(std::time::Instant),
}

/// Print `agent`'s unread messages, then each new one as it is judged, moving the cursor
/// after each flush; the read log names the path as `via`.
pub fn follow(
    session: &Session,
    agent: &str,
    json: bool,
    until: Until,
    via: &str,
) -> anyhow::Result<i32> {
    follow_handing_over(session, agent, json, until, via, false)
}

/// [`follow`]; with `hand_over`, once the backlog is out, the output (a pipe) is handed to
/// the running daemon, which prints each new message to it itself, until it hands it back
/// (then this process prints from the cursor again) or the pipe's reader goes away.
fn follow_handing_over(
    session: &Session,
    agent: &str,
    json: bool,
    until: Until,
    via: &str,
    hand_over: bool,
) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    // What one turn prints goes out in one write (print_accepted flushes).
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let mut handing = HandOver {
        enabled: hand_over,
        next: std::time::Instant::now(),
    };
    loop {
        let following = Following {
            bridge: &bridge,
            agent,
            json,
            until,
            via,
        };
        if let Followed::Ended(code) = following.run(&mut out, &mut handing)? {
            return Ok(code);
        }
    }
}

/// When this watch may hand its output to the daemon.
struct HandOver {
    enabled: bool,
    /// Not before this: it was handed back a moment ago.
    next: std::time::Instant,
}

/// After the daemon handed the output back, or would not take it, this process prints for
/// at least this long before it asks again.
const HAND_OVER_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

impl HandOver {
    fn due(&self) -> bool {
        self.enabled && std::time::Instant::now() >= self.next
    }

    fn later(&mut self) {
        self.next = std::time::Instant::now() + HAND_OVER_PAUSE;
    }
}

/// How one run of following ended.
enum Followed {
    Ended(i32),
    /// The daemon printed for a while: start again from the cursor.
    Again,
}

/// One run of following, from the cursor.
struct Following<'a> {
    bridge: &'a Bridge,
    agent: &'a str,
    json: bool,
    until: Until,
    via: &'a str,
}

impl Following<'_> {
    #[allow(clippy::too_many_lines)]
    fn run(
        &self,
        out: &mut impl std::io::Write,
        handing: &mut HandOver,
    ) -> anyhow::Result<Followed> {
        let Following {
            bridge,
            agent,
            json,
            until,
            via,
        } = *self;
        let path = bridge.require_inbox(agent)?;
        // Told, or watching the files, before reading anything: no change between is missed.
        let mut source = Source::start(bridge)?;
        let mut inbox = open_inbox(&path, false)?;
        let mut inbox_identity = identity(&inbox)?;
        // First, so that a reader refused (another bridge's station) says nothing else.
        let mut keeper = cursor::Keeper::new(bridge, agent)?;
        let position = cursor::load(bridge, agent, &inbox)?;
        warn_replaced(agent, position);
        let mut printed_to = position.offset();
        let (mut journal, mut follower) = {
            let view = view(bridge)?;
            let journal = view
                .inbox(agent, printed_to)?
                .unwrap_or_else(|| InboxView::empty(agent));
            (journal, view.updates())
        };
        // The inbox is not the file the judge last read (changed in place since).
        let mut unsettled = false;
        loop {
            if inbox_identity == (journal.journal.dev, journal.journal.ino) {
                // One reader of the agent at a time; another may have read on meanwhile. `read
                // --wait` waits for it until its deadline, and a reader's wait past it (a message
                // came just before: another reader's turn of milliseconds is no failure).
                let turn = keeper.reading(
                    bridge,
                    match until {
                        Until::Stopped => None,
                        Until::FirstMessages(deadline) => {
                            Some(deadline.max(std::time::Instant::now() + cursor::READER_WAIT))
                        }
                    },
                )?;
                // The judge may have begun a new file while this reader waited for its turn (it
                // holds the turn while it marks one): nothing more of the old one is printed.
                // A new file may also go on as the same generation (a copy of the old bytes, or
                // one taken before anything in the old was judged): it is the one read on.
                let gen = journal.journal.gen;
                follower.follow(&mut journal)?;
                let moved = inbox_identity != (journal.journal.dev, journal.journal.ino);
                if journal.journal.gen != gen || moved {
                    if journal.journal.gen != gen {
                        printed_to = 0;
                    }
                    drop(turn);
                    follow_file(&path, &journal, &mut inbox, &mut inbox_identity)?;
                    continue;
                }
                let position = keeper.load(&inbox, inbox_identity, gen)?;
                // The inbox cut or rewritten in place (a restore with `cp`) since the judge last
                // read it: its offsets are not the picture's lines. Nothing is shown from it, nor
                // the cursor moved, until it is the file the judge read again, or the judge has
                // read it anew (it is looked at again shortly: the same bytes back tell nothing).
                if journal.describes(&inbox, &inbox.metadata()?) {
                    unsettled = false;
                    if let cursor::Position::At(at) = position {
                        printed_to = printed_to.max(at);
                    }
                    let reading = Inbox {
                        agent,
                        file: &inbox,
                    };
                    match print_accepted(&reading, &mut journal, printed_to, json, None, out)? {
                        Printed::ClosedPipe => return Ok(Followed::Ended(OK)),
                        Printed::Upto(to, count, _) => {
                            if to > printed_to {
                                keeper.advance(
                                    bridge,
                                    &inbox,
                                    (inbox_identity, gen),
                                    to,
                                    via,
                                    None,
                                )?;
                                printed_to = to;
                            }
                            if count > 0 && matches!(until, Until::FirstMessages(_)) {
                                return Ok(Followed::Ended(OK));
                            }
                        }
                    }
                } else {
                    if !unsettled {
                        tracing::debug!(agent, "the inbox changed in place since the judge read it: waiting for it to be whole, or read again");
                    }
                    unsettled = true;
                    drop(turn);
                }
            }
            if let (true, false, Source::Told(told)) = (handing.due(), unsettled, &mut source) {
                let request = Request {
                    printed_to,
                    dev: inbox_identity.0,
                    ino: inbox_identity.1,
                    gen: journal.journal.gen,
                    agent: agent.to_owned(),
                };
                let record = Record::create(printed_to)?;
                match told.hand_over(&request, std::io::stdout().as_fd(), &record) {
                    Handed::Delivering => {
                        let returned = told.wait_return();
                        handing.later();
                        return self.handed_back(&returned, &record, &inbox, &request, out);
                    }
                    Handed::Refused(why, told) => {
                        tracing::debug!(agent, why, "the daemon does not print for this watch");
                        handing.later();
                        // What it told meanwhile, and what it journaled after, as after a wait.
                        let gen = journal.journal.gen;
                        for appended in &told {
                            follower.take(appended, &mut journal)?;
                        }
                        follower.follow(&mut journal)?;
                        if journal.journal.gen != gen {
                            printed_to = 0;
                        }
                        follow_file(&path, &journal, &mut inbox, &mut inbox_identity)?;
                        continue;
                    }
                    Handed::Gone => {
                        handing.later();
                        return Ok(Followed::Again);
                    }
                }
            }
            let deadline = match until {
                Until::Stopped => None,
                Until::FirstMessages(deadline) => Some(deadline),
            };
            let look_again = unsettled.then(|| std::time::Instant::now() + UNSETTLED_LOOK);
            let gen = journal.journal.gen;
            match source.next(bridge, earliest(deadline, look_again))? {
                Change::Appended(appended) => {
                    for appended in &appended {
                        follower.take(appended, &mut journal)?;
                    }
                }
                Change::Files => follower.follow(&mut journal)?,
                Change::TimedOut
                    if deadline.is_none_or(|deadline| std::time::Instant::now() < deadline) =>
                {
                    follower.follow(&mut journal)?;
                }
                Change::TimedOut => {
                    eprintln!("doorbell: nothing arrived for {agent} before the timeout");
                    return Ok(Followed::Ended(crate::wait::TIMED_OUT));
                }
            }
            // The judge started a new generation (truncated, replaced, recreated): start over,
            // on the file the judge is reading now.
            if journal.journal.gen != gen {
                printed_to = 0;
            }
            follow_file(&path, &journal, &mut inbox, &mut inbox_identity)?;
        }
    }

    /// The daemon printed for this watch until `returned`, as far as `record` says: end
    /// the lines it began, if it began some, see that the cursor is past what it printed
    /// (a daemon killed between its write and its cursor move), and start again from the
    /// cursor — or end, with the pipe's reader gone.
    fn handed_back(
        &self,
        returned: &Returned,
        record: &Record,
        inbox: &std::fs::File,
        request: &Request,
        out: &mut impl std::io::Write,
    ) -> anyhow::Result<Followed> {
        if *returned == Returned::Closed {
            return Ok(Followed::Ended(OK));
        }
        let printed = match record.load() {
            Ok(printed) => printed,
            Err(e) => {
                tracing::warn!(
                    agent = self.agent,
                    "reading what the daemon printed: {e}; printing from the cursor"
                );
                return Ok(Followed::Again);
            }
        };
        if printed.upto <= request.printed_to {
            return Ok(Followed::Again);
        }
        let mut keeper = cursor::Keeper::new(self.bridge, self.agent)?;
        let _turn = keeper.reading(self.bridge, None)?;
        if printed.upto > printed.printed_to {
            match out.write_all(&printed.rest).and_then(|()| out.flush()) {
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    return Ok(Followed::Ended(OK))
                }
                other => other?,
            }
        }
        let file = ((request.dev, request.ino), request.gen);
        let behind = match keeper.load(inbox, file.0, file.1)? {
            cursor::Position::At(at) => at < printed.upto,
            cursor::Position::Fresh => true,
            cursor::Position::Replaced { .. } => false,
        };
        if behind {
            keeper.advance(self.bridge, inbox, file, printed.upto, self.via, None)?;
        }
        Ok(Followed::Again)
    }
}

/// How soon a follower looks again at an inbox changed in place under the judge: written
/// back with the bytes the judge read, it tells nothing new.
const UNSETTLED_LOOK: std::time::Duration = std::time::Duration::from_millis(50);

fn earliest(
    a: Option<std::time::Instant>,
    b: Option<std::time::Instant>,
) -> Option<std::time::Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Open the inbox at `path` again when the judge reads another file than `inbox` now.
fn follow_file(
    path: &std::path::Path,
    journal: &InboxView,
    inbox: &mut std::fs::File,
    inbox_identity: &mut (u64, u64),
) -> anyhow::Result<()> {
    let judged = (journal.journal.dev, journal.journal.ino);
    if *inbox_identity != judged {
        if let Ok(current) = open_inbox(path, false) {
            if identity(&current)? == judged {
                *inbox = current;
                *inbox_identity = judged;
            }
        }
    }
    Ok(())
}

/// Where a follower learns that the journal grew: the daemon's socket, or file events.
enum Source {
    Told(Told),
    Files(Events),
}

/// What changed.
enum Change {
    /// The daemon told what it appended to the journal (all it has told so far).
    Appended(Vec<Appended>),
    /// Files changed: read the journal.
    Files,
    TimedOut,
}

impl Source {
    fn start(bridge: &Bridge) -> anyhow::Result<Source> {
        Ok(match Told::connect(&bridge.state_dir()?) {
            Some(told) => Source::Told(told),
            None => Source::Files(Events::new(bridge)?),
        })
    }

    /// Wait for the next change, until `deadline` if one is given.
    fn next(
        &mut self,
        bridge: &Bridge,
        deadline: Option<std::time::Instant>,
    ) -> anyhow::Result<Change> {
        match self {
            Source::Told(told) => match told.next(deadline) {
                Next::Appended(first) => {
                    // What came meanwhile is printed with it: one print, one cursor move.
                    let rest = std::iter::from_fn(|| told.ready());
                    Ok(Change::Appended(
                        std::iter::once(first).chain(rest).collect(),
                    ))
                }
                Next::TimedOut => Ok(Change::TimedOut),
                Next::Gone => {
                    // The daemon stopped (or let this watcher go): watch the files from now
                    // on, and judge at once what it may have left unjudged.
                    *self = Source::Files(Events::new(bridge)?);
                    judge_if_idle(bridge)?;
                    Ok(Change::Files)
                }
            },
            Source::Files(events) => {
                if !events.wait(deadline)
                    && deadline.is_some_and(|at| std::time::Instant::now() >= at)
                {
                    return Ok(Change::TimedOut);
                }
                if events.take_unjudged() {
                    judge_if_idle(bridge)?;
                }
                // A daemon that started meanwhile tells from now on; what came before is
                // read from the journal now.
                if let Some(told) = Told::connect(&bridge.state_dir()?) {
                    *self = Source::Told(told);
                }
                Ok(Change::Files)
            }
        }
    }
}

fn identity(file: &std::fs::File) -> std::io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}
