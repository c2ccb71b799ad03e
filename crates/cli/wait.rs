//! `doorbell wait`: block until a request is closed or waits for input (`--any`: until its
//! first response), following the journal as the judge appends to it. Exit 0 when it
//! completed, waits for input or (with `--any`) got an answer; 4 when it failed, was
//! rejected or canceled; 124 on timeout.

use std::time::Instant;

use doorbell_core::duration::parse_duration;
use doorbell_core::State;
use serde_json::value::RawValue;

use crate::args::WaitArgs;
use crate::exit::{refused, OK};
use crate::session::{view, Session};
use doorbell_daemon::waiter::{judge_if_idle, Events, GRACE};

/// `wait` gave up.
pub const TIMED_OUT: i32 = 124;
/// The request ended failed, rejected or canceled.
pub const ENDED_BADLY: i32 = 4;

/// The last response seen: its id, to print it.
struct Answer {
    state: State,
    id: String,
}

pub fn run(session: &Session, args: &WaitArgs) -> anyhow::Result<i32> {
    let timeout = parse_duration(&args.timeout).map_err(|e| refused(format!("--timeout: {e}")))?;
    let deadline = Instant::now() + timeout;
    let bridge = session.bridge()?;
    let done = |known: Option<(State, u32)>| {
        known.is_some_and(|(state, responses)| {
            state.is_terminal() || state == State::InputRequired || (args.any && responses > 0)
        })
    };
    // Answered already: no need to watch anything.
    let first = view(&bridge)?
        .request(&args.id)
        .map(|r| (r.state, r.responses));
    if let (true, Some((state, _))) = (done(first), first) {
        return finish(&bridge, &args.id, state, None, args.json);
    }
    // Watch before looking again, so that nothing between the look and the watch is missed.
    let events = Events::new(&bridge)?;
    let view = view(&bridge)?;
    let mut known = view.request(&args.id).map(|r| (r.state, r.responses));
    let mut follower = view.updates();
    drop(view);
    let mut answer: Option<Answer> = None;
    let grace = Instant::now() + GRACE;
    loop {
        if let Some((state, _)) = known {
            if done(known) {
                return finish(&bridge, &args.id, state, answer.as_ref(), args.json);
            }
        } else if Instant::now() > grace {
            return Err(refused(format!(
                "no request '{}' in the ledger (doorbell debts lists open ones)",
                args.id
            )));
        }
        let wake_by = if known.is_none() {
            grace.min(deadline)
        } else {
            deadline
        };
        if !events.wait(Some(wake_by)) && Instant::now() >= deadline {
            eprintln!("doorbell: timed out waiting for {}", args.id);
            return Ok(TIMED_OUT);
        }
        if events.take_unjudged() {
            judge_if_idle(&bridge)?;
        }
        follower.accepted(&mut |line| {
            if line.id == args.id {
                known.get_or_insert((State::Submitted, 0));
            } else if line.correlates_to.as_deref() == Some(&args.id) {
                if let Some(state) = line.state {
                    let responses = known.map_or(0, |k| k.1) + 1;
                    known = Some((state, responses));
                    answer = Some(Answer {
                        state,
                        id: line.id.clone(),
                    });
                }
            }
        })?;
    }
}

fn finish(
    bridge: &doorbell_store::Bridge,
    id: &str,
    state: State,
    answer: Option<&Answer>,
    json: bool,
) -> anyhow::Result<i32> {
    // The answer's line, found by its id once the wait is over.
    let line = match answer {
        Some(answer) => doorbell_store::View::open(bridge)?
            .message(&answer.id)?
            .and_then(|found| found.line),
        None => None,
    };
    if json {
        let envelope: Option<&RawValue> = line
            .as_ref()
            .and_then(|bytes| serde_json::from_slice(bytes).ok());
        let doc = serde_json::json!({ "id": id, "state": state.as_str(), "response": envelope });
        out!("{doc}")?;
    } else {
        out!("{id}: {state}")?;
        if let Some(envelope) = line.as_deref().and_then(doorbell_store::view::envelope_of) {
            debug_assert_eq!(envelope.state, answer.map(|a| a.state));
            out_text!("{}", crate::output::message(&envelope, chrono::Utc::now()))?;
        }
    }
    Ok(match state {
        State::Failed | State::Rejected | State::Canceled => ENDED_BADLY,
        _ => OK,
    })
}
