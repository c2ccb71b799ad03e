//! `doorbell reply` and `doorbell cancel`: answer a request by its id. The ledger says who
//! the other party is and which thread it is in (`View::answer`); the message then goes out
//! exactly as `doorbell send` would send it, pre-checks included.

use doorbell_store::send::Message;

use crate::args::{CancelArgs, ReplyArgs, SendArgs};
use crate::exit::OK;
use crate::session::{view, Session};

/// Answer request `id` as `from` with `state`; `content` gives its text, data, id and how
/// long to wait for a locked inbox, as `send` takes them.
fn answer(
    session: &Session,
    id: &str,
    from: Option<String>,
    state: &str,
    content: &SendArgs,
) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let view = view(&bridge)?;
    let answer = view.answer(id, from, state)?;
    // Text and data are read and checked as `send` reads them.
    let content = crate::send::message(content)?;
    let ids = view.send(&Message {
        id: content.id,
        text: content.text,
        data: content.data,
        lock_wait: content.lock_wait,
        ..answer
    })?;
    crate::send::print_ids(&ids)?;
    Ok(OK)
}

pub fn reply(session: &Session, args: ReplyArgs) -> anyhow::Result<i32> {
    let content = SendArgs {
        text: args.text,
        data: args.data,
        id: args.reply_id,
        lock: args.lock,
        ..SendArgs::default()
    };
    answer(session, &args.id, args.from, &args.state, &content)
}

/// Cancel request `id`, or every open request of the broadcast `id` its sender asked.
pub fn cancel(session: &Session, args: CancelArgs) -> anyhow::Result<i32> {
    // Read once: every cancel of a broadcast says it.
    let text = match args.text {
        Some(text) if text == "-" => crate::send::read_stdin()?,
        Some(text) => text,
        None => "canceled".to_owned(),
    };
    let ids = view(&session.bridge()?)?.to_cancel(&args.id, args.from.as_deref())?;
    for id in ids {
        let content = SendArgs {
            text: Some(text.clone()),
            lock: args.lock.clone(),
            ..SendArgs::default()
        };
        answer(session, &id, args.from.clone(), "canceled", &content)?;
    }
    Ok(OK)
}
