//! `doorbell wait`: block until a request is closed or waits for input (`--any`: until its
//! first response), following the journal as the judge appends to it. Exit 0 when it
//! completed, waits for input or (with `--any`) got an answer; 4 when it failed, was
//! rejected or canceled; 124 on timeout.

use std::time::Instant;

use doorbell_core::duration::parse_duration;
use doorbell_core::State;
use doorbell_store::index::MessageRow;
use serde_json::value::RawValue;

use crate::args::WaitArgs;
use crate::exit::{refused, OK};
use crate::session::{view, Session};
use doorbell_daemon::waiter::{judge_if_idle, Events, GRACE};

/// `wait` gave up.
pub const TIMED_OUT: i32 = 124;
/// The request ended failed, rejected or canceled.
pub const ENDED_BADLY: i32 = 4;

/// How often a wait that can be cancelled asks whether it was.
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// What is known of one awaited request, from its thread's accepted lines in the order the
/// judge accepted them.
#[derive(Default)]
struct Awaited {
    /// Its state (`None`: not judged yet).
    state: Option<State>,
    /// Who asked: a response of theirs (their input after `input-required`) answers nothing.
    requester: Option<String>,
    /// Whether the last response was someone's other than the requester's.
    answered: bool,
    /// The last answer, to print it.
    answer: Option<String>,
    /// Where, in the order lines were accepted, the wait for it ended (for `--any`: which
    /// came first).
    done_at: Option<u64>,
}

impl Awaited {
    /// Take in an accepted line of the request `id`'s thread.
    fn saw(&mut self, id: &str, row: &MessageRow, any: bool) {
        if row.id == id {
            self.state.get_or_insert(State::Submitted);
            self.requester = Some(row.from.clone());
        } else if row.correlates_to.as_deref() == Some(id) {
            let Some(state) = row.state else { return };
            self.state = Some(state);
            // The requester's input (after `input-required`) hands the turn back: it answers
            // nothing, and is not the answer shown, unless it ends the request (a cancel).
            let theirs = self.requester.as_deref() != Some(row.from.as_str());
            self.answered = theirs;
            if theirs || state.is_terminal() {
                self.answer = Some(row.id.clone());
            }
        } else {
            return;
        }
        self.done_at = if self.done(any) {
            self.done_at.or(Some(row.seq))
        } else {
            None
        };
    }

    /// Closed, waiting for input, or with `any` answered.
    fn done(&self, any: bool) -> bool {
        self.state.is_some_and(|state| {
            state.is_terminal() || state == State::InputRequired || (any && self.answered)
        })
    }
}

/// How a wait ended: the requests answered (each one, or with `any` the first answered), with
/// their states and the last response seen, in id order; those still waited for (with `any`, the
/// others still unanswered); and whether the deadline passed first.
pub struct Waited {
    pub answered: Vec<(String, State, Option<String>)>,
    pub waiting: Vec<String>,
    pub timed_out: bool,
}

/// How much of the inboxes' unjudged tails is searched for an id at most; past it, the judge
/// is far behind (a catch-up) and what is awaited is taken to be in what it has yet to read.
const SEARCHED_UNJUDGED: u64 = 256 << 20;

/// How much of a tail is read at a time.
const SEARCH_CHUNK: usize = 1 << 20;

/// Whether one of `ids` may be in a line the judge has not read yet: found as a JSON string
/// (`"ID"`) in the bytes past where judging stopped in some inbox, or a backlog too large to
/// search.
fn waiting_for_judge(bridge: &doorbell_store::Bridge, ids: &[&str]) -> anyhow::Result<bool> {
    use std::os::unix::fs::FileExt;
    let quoted: Vec<Vec<u8>> = ids
        .iter()
        .map(|id| format!("\"{id}\"").into_bytes())
        .collect();
    let longest = quoted.iter().map(Vec::len).max().unwrap_or(0);
    let mut budget = SEARCHED_UNJUDGED;
    let view = view(bridge)?;
    let mut chunk = vec![0; SEARCH_CHUNK];
    for (name, journal) in view.inboxes() {
        let Ok(file) = doorbell_store::append::open_inbox(&bridge.inbox_path(name)?, false) else {
            continue;
        };
        let size = file.metadata()?.len();
        let mut at = journal.judged_to;
        while at < size {
            if budget == 0 {
                return Ok(true);
            }
            let want = usize::try_from((size - at).min(SEARCH_CHUNK as u64))?;
            let n = file.read_at(&mut chunk[..want], at)?;
            if n == 0 {
                break;
            }
            let bytes = &chunk[..n];
            if quoted
                .iter()
                .any(|q| memchr::memmem::find(bytes, q).is_some())
            {
                return Ok(true);
            }
            budget = budget.saturating_sub(n as u64);
            // The next chunk starts a little back: an id across the two is found too.
            let step = if at + (n as u64) < size {
                n.saturating_sub(longest).max(1)
            } else {
                n
            };
            at += step as u64;
        }
    }
    Ok(false)
}

pub fn run(session: &Session, args: &WaitArgs) -> anyhow::Result<i32> {
    let timeout = parse_duration(&args.timeout).map_err(|e| refused(format!("--timeout: {e}")))?;
    let bridge = session.bridge()?;
    let waited = wait_for(&bridge, &args.ids, args.any, Instant::now() + timeout, None)?;
    // What was answered is printed, timed out or not: a script waiting on several learns
    // which ones it no longer waits for.
    let mut code = OK;
    for (id, state, answer) in &waited.answered {
        if finish(&bridge, id, *state, answer.as_deref(), args.json)? != OK {
            code = ENDED_BADLY;
        }
    }
    if waited.timed_out {
        eprintln!(
            "doorbell: timed out waiting for {}",
            waited.waiting.join(", ")
        );
        return Ok(TIMED_OUT);
    }
    Ok(code)
}

/// Wait until each of `ids` (a broadcast's id stands for its requests) is answered: closed or
/// waiting for input, or with `any` at the first response of any of them.
/// `cancelled`, when given, is asked about once a second: a caller that gave up (an MCP
/// client's cancel) frees what the wait holds at once, not at its deadline.
pub fn wait_for(
    bridge: &doorbell_store::Bridge,
    ids: &[String],
    any: bool,
    deadline: Instant,
    cancelled: Option<&dyn Fn() -> bool>,
) -> anyhow::Result<Waited> {
    if ids.is_empty() {
        return Err(crate::exit::refused(
            "no request to wait for: give at least one id",
        ));
    }
    let look = |view: &doorbell_store::View| look(view, ids, any);
    // Where the wait stands: what is answered, and what is still waited for.
    let standing = |awaited: &[(String, Awaited)], timed_out: bool| {
        let answered: Vec<(String, State, Option<String>)> = awaited
            .iter()
            .filter(|(_, a)| a.done(any))
            .filter_map(|(id, a)| Some((id.clone(), a.state?, a.answer.clone())))
            .collect();
        let waiting = awaited
            .iter()
            .filter(|(_, a)| !a.done(any))
            .map(|(id, _)| id.clone())
            .collect();
        Waited {
            answered,
            waiting,
            timed_out,
        }
    };
    let settled = |awaited: &[(String, Awaited)]| {
        let mut standing = standing(awaited, false);
        if any && !standing.answered.is_empty() {
            // The one answered first, not the first by id.
            let first = awaited
                .iter()
                .filter(|(_, a)| a.done(any))
                .min_by_key(|(_, a)| a.done_at)
                .map(|(id, _)| id);
            standing.answered.retain(|(id, ..)| Some(id) == first);
            Some(standing)
        } else if standing.waiting.is_empty() {
            Some(standing)
        } else {
            None
        }
    };
    // Answered already: nothing to watch.
    if let Some(waited) = settled(&look(&view(bridge)?)?) {
        return Ok(waited);
    }
    // Watch before looking again, so that nothing between the look and the watch is missed.
    let events = Events::new(bridge)?;
    let view = view(bridge)?;
    let mut awaited = look(&view)?;
    let mut follower = view.updates();
    drop(view);
    let mut grace = Instant::now() + GRACE;
    loop {
        if let Some(waited) = settled(&awaited) {
            return Ok(waited);
        }
        if cancelled.is_some_and(|cancelled| cancelled()) {
            anyhow::bail!("cancelled");
        }
        let unknown: Vec<&str> = awaited
            .iter()
            .filter(|(_, a)| a.state.is_none())
            .map(|(id, _)| id.as_str())
            .collect();
        if !unknown.is_empty() && Instant::now() > grace && !waiting_for_judge(bridge, &unknown)? {
            return Err(refused(format!(
                "no request '{}' in the ledger (doorbell debts lists open ones)",
                unknown.join("', '")
            )));
        }
        if Instant::now() > grace {
            // Written and not judged yet (a busy or stopped daemon): look again later.
            grace = Instant::now() + GRACE;
        }
        let mut wake_by = if unknown.is_empty() {
            deadline
        } else {
            grace.min(deadline)
        };
        if cancelled.is_some() {
            wake_by = wake_by.min(Instant::now() + CANCEL_POLL);
        }
        if !events.wait(Some(wake_by)) && Instant::now() >= deadline {
            return Ok(standing(&awaited, true));
        }
        if events.take_unjudged() {
            judge_if_idle(bridge)?;
        }
        // A request of a broadcast waited on, judged since the wait last looked (the judge
        // may read a broadcast's inboxes in several sweeps): its id is awaited too.
        let mut broadcast = false;
        follower.accepted(&mut |line| {
            for (id, a) in &mut awaited {
                a.saw(id, line, any);
            }
            broadcast |=
                is_request_of(ids, &line.id) && !awaited.iter().any(|(id, _)| *id == line.id);
        })?;
        if broadcast {
            awaited = look(&crate::session::view(bridge)?)?;
        }
    }
}

/// Whether `line` is the id of a request of a broadcast among `ids` (`ID.station`).
fn is_request_of(ids: &[String], line: &str) -> bool {
    ids.iter().any(|id| {
        line.strip_prefix(id.as_str())
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

/// What the ledger knows of each awaited request. A broadcast's id stands for its requests;
/// an id the ledger does not know yet is waited for as itself (it may be judged in a moment).
fn look(
    view: &doorbell_store::View,
    ids: &[String],
    any: bool,
) -> anyhow::Result<Vec<(String, Awaited)>> {
    let mut named: Vec<String> = Vec::new();
    for id in ids {
        match view.requests_named(id)? {
            found if found.is_empty() => named.push(id.clone()),
            found => named.extend(found),
        }
    }
    named.sort();
    named.dedup();
    named
        .into_iter()
        .map(|id| {
            let mut awaited = Awaited::default();
            if let Some(request) = view.request(&id) {
                // What came before the wait began, taken in as the wait takes what comes.
                for message in view.thread(&request.context_id)? {
                    awaited.saw(&id, &message.row, any);
                }
                // The ledger's word on its state; and on the rest, should its thread's rows
                // be gone.
                awaited.state = Some(request.state);
                if awaited.requester.is_none() {
                    awaited.requester = Some(request.requester.clone());
                    awaited.answered = request.responses > 0;
                }
            }
            Ok((id, awaited))
        })
        .collect()
}

fn finish(
    bridge: &doorbell_store::Bridge,
    id: &str,
    state: State,
    answer: Option<&str>,
    json: bool,
) -> anyhow::Result<i32> {
    // The answer's line, found by its id once the wait is over.
    let line = match answer {
        Some(answer) => doorbell_store::View::open(bridge)?
            .message(answer)?
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
            out_text!("{}", crate::output::message(&envelope, chrono::Utc::now()))?;
        }
    }
    Ok(match state {
        State::Failed | State::Rejected | State::Canceled => ENDED_BADLY,
        _ => OK,
    })
}
