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
    let bridge = session.bridge()?;
    let path = bridge.require_inbox(&args.agent)?;
    let events = Events::new(&bridge)?;
    let mut inbox = open_inbox(&path, false)?;
    let position = cursor::load(&bridge, &args.agent, &inbox)?;
    warn_replaced(&args.agent, position);
    let mut printed_to = position.offset();
    let (mut journal, mut follower) = {
        let view = view(&bridge)?;
        let journal = view
            .inbox(&args.agent, printed_to)?
            .unwrap_or_else(|| InboxView::empty(&args.agent));
        (journal, view.updates())
    };
    let mut out = std::io::stdout().lock();
    loop {
        if identity(&inbox)? == (journal.journal.dev, journal.journal.ino) {
            let reading = Inbox {
                agent: &args.agent,
                path: &path,
                file: &inbox,
            };
            match print_accepted(&reading, &mut journal, printed_to, args.json, &mut out)? {
                Printed::ClosedPipe => return Ok(OK),
                Printed::Upto(to) => {
                    if to > printed_to {
                        cursor::advance(&bridge, &args.agent, &inbox, to)?;
                        printed_to = to;
                    }
                }
            }
        }
        events.wait(None);
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
