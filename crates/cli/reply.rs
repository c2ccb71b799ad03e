//! `doorbell reply` and `doorbell cancel`: answer a request by its id. The ledger says who
//! the other party is and which thread it is in; the message then goes out exactly as
//! `doorbell send` would send it, pre-checks included.

use crate::args::{CancelArgs, ReplyArgs, SendArgs};
use crate::exit::refused;
use crate::session::{view, Session};

/// Answer request `id` as `from` with `state`.
fn answer(
    session: &Session,
    id: &str,
    from: Option<String>,
    state: &str,
    text: Option<String>,
    data: Option<String>,
    reply_id: Option<String>,
) -> anyhow::Result<i32> {
    let from =
        from.ok_or_else(|| refused("who is answering? give --from or set DOORBELL_AGENT"))?;
    let bridge = session.bridge()?;
    let view = view(&bridge)?;
    let Some(request) = view.request(id) else {
        return Err(refused(format!(
            "no request '{id}' in the ledger (doorbell debts lists the open ones)"
        )));
    };
    let to = if from == request.addressee {
        request.requester.clone()
    } else if from == request.requester {
        request.addressee.clone()
    } else {
        return Err(refused(format!(
            "'{from}' is not a party of {id} ({} asked {}); answer as one of them with --from",
            request.requester, request.addressee
        )));
    };
    let args = SendArgs {
        to: vec![to],
        from: Some(from),
        kind: Some("response".to_owned()),
        state: Some(state.to_owned()),
        correlates_to: Some(id.to_owned()),
        context_id: Some(request.context_id.clone()),
        text,
        data,
        id: reply_id,
        ..SendArgs::default()
    };
    drop(request);
    crate::send::send(&view, &args)
}

pub fn reply(session: &Session, args: ReplyArgs) -> anyhow::Result<i32> {
    answer(
        session,
        &args.id,
        args.from,
        &args.state,
        args.text,
        args.data,
        args.reply_id,
    )
}

pub fn cancel(session: &Session, args: CancelArgs) -> anyhow::Result<i32> {
    let text = Some(args.text.unwrap_or_else(|| "canceled".to_owned()));
    answer(session, &args.id, args.from, "canceled", text, None, None)
}
