//! `doorbell watch`: print an agent's backlog, then each new accepted message as it is
//! judged. A running daemon tells it what it journals over its socket (`.doorbell/watch.sock`);
//! otherwise it follows the journal file as the judge appends to it. Either way no replay and
//! no polling; the cursor moves only after the output was flushed; a closed pipe ends it
//! quietly. With no daemon running, it judges what arrives itself, briefly taking the lock
//! each time.

use std::os::unix::fs::MetadataExt;

use doorbell_daemon::tell::{Next, Told};
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
    follow(session, &args.agent, args.json, Until::Stopped, "watch")
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
    let bridge = session.bridge()?;
    let path = bridge.require_inbox(agent)?;
    // Told, or watching the files, before reading anything: no change between is missed.
    let mut source = Source::start(&bridge)?;
    let mut inbox = open_inbox(&path, false)?;
    let mut inbox_identity = identity(&inbox)?;
    // First, so that a reader refused (another bridge's station) says nothing else.
    let mut keeper = cursor::Keeper::new(&bridge, agent)?;
    let position = cursor::load(&bridge, agent, &inbox)?;
    warn_replaced(agent, position);
    let mut printed_to = position.offset();
    let (mut journal, mut follower) = {
        let view = view(&bridge)?;
        let journal = view
            .inbox(agent, printed_to)?
            .unwrap_or_else(|| InboxView::empty(agent));
        (journal, view.updates())
    };
    // What one turn prints goes out in one write (print_accepted flushes).
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    // The inbox is not the file the judge last read (changed in place since).
    let mut unsettled = false;
    loop {
        if inbox_identity == (journal.journal.dev, journal.journal.ino) {
            // One reader of the agent at a time; another may have read on meanwhile. `read
            // --wait` waits for it until its deadline, and a reader's wait past it (a message
            // came just before: another reader's turn of milliseconds is no failure).
            let turn = keeper.reading(
                &bridge,
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
                match print_accepted(&reading, &mut journal, printed_to, json, None, &mut out)? {
                    Printed::ClosedPipe => return Ok(OK),
                    Printed::Upto(to, count, _) => {
                        if to > printed_to {
                            keeper.advance(&bridge, &inbox, (inbox_identity, gen), to, via)?;
                            printed_to = to;
                        }
                        if count > 0 && matches!(until, Until::FirstMessages(_)) {
                            return Ok(OK);
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
        let deadline = match until {
            Until::Stopped => None,
            Until::FirstMessages(deadline) => Some(deadline),
        };
        let look_again = unsettled.then(|| std::time::Instant::now() + UNSETTLED_LOOK);
        let gen = journal.journal.gen;
        match source.next(&bridge, earliest(deadline, look_again))? {
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
                return Ok(crate::wait::TIMED_OUT);
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
