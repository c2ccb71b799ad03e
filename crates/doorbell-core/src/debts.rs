//! The doorbell's schedule: when an open request rings its debtor again, and when it is
//! escalated to the human station. Pure: fed a request and the judge's time, it says what is
//! due and when, so the daemon can sleep until then and tests can run in virtual time.
//!
//! With `R = ring_after / (1, 1, 2, 4)[priority]` and `b = backoff`: ring 1 is due at `t0 + R`
//! (or at `replyBy` when that is earlier); ring `k+1` at ring `k` + `R·b^k`, counted from when
//! ring `k` was actually written, so a long downtime yields one late ring, never a burst. One
//! interval after ring `max_rings` the debt is escalated once to the human station, unless
//! the human owes it. A state change starts a new epoch with no rings.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::ledger::Request;
use crate::notice::{LoopNote, Notice};
use crate::State;

/// The `[debts]` settings that shape the schedule.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    pub ring_after: Duration,
    pub backoff: f64,
    pub max_rings: u32,
}

/// What is due for a debt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Ring number `n` (from 1) of the current epoch, to the debtor.
    Ring(u32),
    /// Tell the human station that the debt went unanswered.
    Escalate,
}

/// `R` for a priority: critical debts ring four times sooner.
#[must_use]
pub fn interval(schedule: &Schedule, priority: u8) -> Duration {
    let divisor = match priority {
        0 | 1 => 1,
        2 => 2,
        _ => 4,
    };
    schedule.ring_after / divisor
}

/// `from + span`, or `None` when that lies past the last representable time: never due.
/// Settings the config accepts (a long `ring_after`, `backoff` up to 100) get there.
fn later(from: DateTime<Utc>, span: Duration) -> Option<DateTime<Utc>> {
    from.checked_add_signed(chrono::Duration::from_std(span).ok()?)
}

/// The next thing due for `request` and when, or `None` when nothing ever is again.
#[must_use]
pub fn next_due(
    request: &Request,
    schedule: &Schedule,
    human: &str,
) -> Option<(DateTime<Utc>, Due)> {
    if !request.is_open() {
        return None;
    }
    let r = interval(schedule, request.priority);
    let sent = request.rings;
    // The interval after ring k is R·b^k; ring 0 is the moment the epoch began.
    let after = |k: u32| -> Option<Duration> {
        let factor = schedule.backoff.powi(i32::try_from(k).unwrap_or(i32::MAX));
        Duration::try_from_secs_f64(r.as_secs_f64() * factor.min(1e9)).ok()
    };
    let last = request.last_ring_at.unwrap_or(request.state_since);
    if sent == 0 && schedule.max_rings > 0 {
        // A replyBy moves ring 1 earlier in the first epoch, and in later ones only while it
        // is still ahead: a passed deadline must not ring at every heartbeat.
        let reply_by = request
            .reply_by
            .filter(|t| request.epoch == 0 || *t > request.state_since);
        let due = later(request.state_since, r)
            .into_iter()
            .chain(reply_by)
            .min()?;
        return Some((due, Due::Ring(1)));
    }
    if sent < schedule.max_rings {
        return Some((later(last, after(sent)?)?, Due::Ring(sent + 1)));
    }
    if request.escalated || request.debtor_station() == human {
        return None;
    }
    Some((later(last, after(sent)?)?, Due::Escalate))
}

/// The reserved id of ring `n` of `request`'s current epoch.
#[must_use]
pub fn ring_id(request: &Request, n: u32) -> String {
    format!(
        "ring:{:016x}:{}:{n}",
        xxhash_rust::xxh3::xxh3_64(request.id.as_bytes()),
        request.epoch
    )
}

/// The reserved id of `request`'s escalation in its current epoch.
#[must_use]
pub fn escalation_id(request: &Request) -> String {
    format!(
        "escalation:{:016x}:{}",
        xxhash_rust::xxh3::xxh3_64(request.id.as_bytes()),
        request.epoch
    )
}

fn note(id: String, to: &str, request: &Request, text: &str, now: DateTime<Utc>) -> Notice {
    let line = LoopNote {
        id: &id,
        from: "debt-loop",
        to,
        correlates_to: Some(&request.id),
        context_id: Some(&request.context_id),
        priority: Some(request.priority),
        text,
        data: None,
    }
    .line(now);
    Notice {
        id,
        to: to.to_owned(),
        line,
    }
}

/// How a person reads a span: `2 d 4 h`, `35 min`.
#[must_use]
pub fn span(from: DateTime<Utc>, to: DateTime<Utc>) -> String {
    let secs = (to - from).num_seconds().max(0);
    match secs {
        s if s < 60 => format!("{s} s"),
        s if s < 3600 => format!("{} min", s / 60),
        s if s < 86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        s => format!("{} d {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// The command that pays the debt, for the debtor to run.
#[must_use]
pub fn answer_command(request: &Request) -> String {
    answer_command_from(request, None)
}

/// The command that pays the debt, naming the sender (for an agent whose shell may not have
/// `DOORBELL_AGENT` set).
#[must_use]
pub fn answer_command_from(request: &Request, from: Option<&str>) -> String {
    answer_command_by("doorbell", request, from)
}

/// [`answer_command_from`], run as `program` (a full path, a `--dir`).
#[must_use]
pub fn answer_command_by(program: &str, request: &Request, from: Option<&str>) -> String {
    let from = from.map(|f| format!(" --from {f}")).unwrap_or_default();
    let state = if request.state == State::InputRequired {
        "working"
    } else {
        "completed"
    };
    format!("{program} reply {}{from} --state {state} \"…\"", request.id)
}

/// Ring `n` of `request`, to its current debtor.
#[must_use]
pub fn ring_note(request: &Request, n: u32, max_rings: u32, now: DateTime<Utc>) -> Notice {
    let mut text = format!(
        "doorbell: {} is waiting for you on {} ({}) since {} ago. Ring {n} of {max_rings}.",
        waiting(request),
        request.id,
        request.state,
        span(request.state_since, now),
    );
    // A deadline moves ring 1 earlier: the ring says why it comes so soon.
    match request.reply_by {
        Some(by) if by <= now => {
            let _ = write!(
                text,
                " Its deadline (replyBy) passed {} ago.",
                span(by, now)
            );
        }
        Some(by) => {
            let _ = write!(text, " Its deadline (replyBy) is in {}.", span(now, by));
        }
        None => {}
    }
    let _ = write!(text, " Answer with: {}", answer_command(request));
    note(
        ring_id(request, n),
        request.debtor_station(),
        request,
        &text,
        now,
    )
}

/// Who waits, as a ring says it: a loop that asked is named with the owner its answer goes to.
#[must_use]
pub fn waiting(request: &Request) -> String {
    match &request.owner {
        Some(owner) if request.creditor() == request.requester => {
            format!("{} (its owner {owner} gets the answer)", request.requester)
        }
        _ => request.creditor().to_owned(),
    }
}

/// "once", "twice", "N times".
fn times(n: u32) -> String {
    match n {
        1 => "once".to_owned(),
        2 => "twice".to_owned(),
        n => format!("{n} times"),
    }
}

/// Whether the debtor's rings reached it, as an escalation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reached {
    /// Every ring was written to its inbox.
    Every,
    /// The last ring could not be written yet (another process holds the inbox, a write
    /// fails).
    HeldBack,
    /// The debtor has no inbox: no ring can be written.
    NoInbox,
}

/// The escalation of `request` to the human station; `reached` says whether the debtor's
/// rings reached it (one not in its inbox is not counted as rung).
#[must_use]
pub fn escalation_note(
    request: &Request,
    human: &str,
    reached: Reached,
    now: DateTime<Utc>,
) -> Notice {
    let rang = match reached {
        Reached::HeldBack if request.rings <= 1 => {
            "has not been rung: ring 1 could not be written to its inbox yet".to_owned()
        }
        Reached::HeldBack => format!(
            "rang {} without an answer, and ring {} could not be written to its inbox yet",
            times(request.rings - 1),
            request.rings
        ),
        Reached::NoInbox if request.rings == 0 => {
            "has not been rung: it has no inbox (deleted or renamed?)".to_owned()
        }
        Reached::NoInbox => format!(
            "rang {} without an answer, and it has no inbox now (deleted or renamed?)",
            times(request.rings)
        ),
        Reached::Every => format!("rang {} without an answer", times(request.rings)),
    };
    let text = format!(
        "doorbell: {} has owed {} an answer on {} ({}) for {}; {rang}. \
         The debtor answers with: {}",
        request.debtor_station(),
        waiting(request),
        request.id,
        request.state,
        span(request.state_since, now),
        answer_command(request),
    );
    note(escalation_id(request), human, request, &text, now)
}

#[cfg(test)]
mod tests {
    use super::times;
    use crate::report::plural;

    #[test]
    fn counts_read_as_english() {
        let said: Vec<String> = [0, 1, 2, 3].map(times).into();
        assert_eq!(said, ["0 times", "once", "twice", "3 times"]);
        assert_eq!(plural(1_u64, "line", "lines"), "1 line");
        assert_eq!(plural(0_usize, "line", "lines"), "0 lines");
        assert_eq!(plural(11_u32, "ring", "rings"), "11 rings");
    }
}
