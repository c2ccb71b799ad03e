//! `doorbell watch`: print an agent's backlog, then each new accepted message as it is
//! judged. It follows the journal as the judge appends to it (no replay, no polling); the
//! cursor moves only after the output was flushed; a closed pipe ends it quietly. With no
//! daemon running, it judges what arrives itself, briefly taking the lock each time.

use std::os::unix::fs::MetadataExt;

use doorbell_store::append::open_inbox;
use doorbell_store::cursor;
use doorbell_store::view::InboxView;

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
    let events = Events::new(&bridge)?;
    let mut inbox = open_inbox(&path, false)?;
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
    let mut out = std::io::stdout().lock();
    loop {
        if identity(&inbox)? == (journal.journal.dev, journal.journal.ino) {
            // One reader of the agent at a time; another may have read on meanwhile.
            let _reading = cursor::reading(&bridge, agent)?;
            if let cursor::Position::At(at) = cursor::load(&bridge, agent, &inbox)? {
                printed_to = printed_to.max(at);
            }
            let reading = Inbox {
                agent,
                path: &path,
                file: &inbox,
            };
            match print_accepted(&reading, &mut journal, printed_to, json, &mut out)? {
                Printed::ClosedPipe => return Ok(OK),
                Printed::Upto(to, count) => {
                    if to > printed_to {
                        cursor::advance(&bridge, agent, &inbox, to, via)?;
                        printed_to = to;
                    }
                    if count > 0 && matches!(until, Until::FirstMessages(_)) {
                        return Ok(OK);
                    }
                }
            }
        }
        match until {
            Until::Stopped => {
                events.wait(None);
            }
            Until::FirstMessages(deadline) => {
                if !events.wait(Some(deadline)) && std::time::Instant::now() >= deadline {
                    eprintln!("doorbell: nothing arrived for {agent} before the timeout");
                    return Ok(crate::wait::TIMED_OUT);
                }
            }
        }
        if events.take_unjudged() {
            judge_if_idle(&bridge)?;
        }
        let gen = journal.journal.gen;
        follower.follow(&mut journal)?;
        // The judge started a new generation (truncated, replaced, recreated): start over,
        // on the file the judge is reading now.
        if journal.journal.gen != gen {
            printed_to = 0;
        }
        let judged = (journal.journal.dev, journal.journal.ino);
        if identity(&inbox)? != judged {
            if let Ok(current) = open_inbox(&path, false) {
                if identity(&current)? == judged {
                    inbox = current;
                }
            }
        }
    }
}

fn identity(file: &std::fs::File) -> std::io::Result<(u64, u64)> {
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}
