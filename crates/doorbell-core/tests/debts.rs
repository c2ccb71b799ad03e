//! The doorbell's schedule (DESIGN §4) in virtual time: when an open request rings its debtor,
//! when it is escalated to the human station, and when everything stops.
//!
//! `Sim` is a tiny daemon with a virtual clock. It runs a pass when the earliest due time
//! arrives (or, after a downtime, at the restart time) and in each pass writes at most one item
//! per debt, at the pass time, exactly as the daemon will: it builds the note, checks it as a
//! line like any other, lets the judge accept it into the recipient's inbox, and records the
//! ring in the ledger. Every expected time below is written out by hand from the contract.
//!
//! The cast: `design` asks `web` (request `r1`) unless a test says otherwise; `human` is the
//! human station; `ci` is another station.

use std::collections::BTreeSet;
use std::time::Duration as StdDuration;

use chrono::{DateTime, Duration, TimeZone, Utc};
use doorbell_core::debts::{
    escalation_id, escalation_note, interval, next_due, ring_id, ring_note, Due, Reached, Schedule,
};
use doorbell_core::notice::Notice;
use doorbell_core::{
    is_reserved_id, judge_line, judge_stateless, Kind, Ledger, Limits, Registry, Request, State,
    Verdict,
};
mod common;
use common::{note, request, response, Msg};
use serde_json::Value;

const HUMAN: &str = "human";

/// `[debts]` as in the example config: `R` = 30 min, `b` = 2, four rings.
const SCHEDULE: Schedule = Schedule {
    ring_after: StdDuration::from_secs(30 * 60),
    backoff: 2.0,
    max_rings: 4,
};

// ---- the clock ---------------------------------------------------------------------------

/// `t(m)`: `m` minutes after 08:00, when most requests below are seen.
fn t(minutes: i64) -> DateTime<Utc> {
    ts(minutes * 60)
}

/// `ts(s)`: `s` seconds after 08:00 (priority 3 rings on half minutes).
fn ts(seconds: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 9, 3, 8, 0, 0).unwrap() + Duration::seconds(seconds)
}

/// Thirty days after 08:00: the end of a long downtime.
fn day30() -> DateTime<Utc> {
    t(30 * 24 * 60)
}

fn a_year() -> Duration {
    Duration::days(366)
}

// ---- what the loop wrote -----------------------------------------------------------------

/// One item the debt loop wrote: when, for which request, what, and to whom.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Written {
    at: DateTime<Utc>,
    request: String,
    due: Due,
    to: String,
}

fn ring(at: DateTime<Utc>, request: &str, n: u32, to: &str) -> Written {
    Written {
        at,
        request: request.to_owned(),
        due: Due::Ring(n),
        to: to.to_owned(),
    }
}

fn escalation(at: DateTime<Utc>, request: &str) -> Written {
    Written {
        at,
        request: request.to_owned(),
        due: Due::Escalate,
        to: HUMAN.to_owned(),
    }
}

/// The note that went with a written item: its reserved id and its text.
#[derive(Debug, Clone)]
struct Sent {
    id: String,
    text: String,
}

// ---- the virtual daemon ------------------------------------------------------------------

struct Sim {
    ledger: Ledger,
    registry: Registry,
    schedule: Schedule,
    /// Ids the judge wrote itself (its journal), for `own_line`.
    own: BTreeSet<String>,
    /// The virtual clock: the time of the last pass or the last line seen.
    now: DateTime<Utc>,
    written: Vec<Written>,
    sent: Vec<Sent>,
}

impl Sim {
    fn new(schedule: Schedule) -> Self {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        Self {
            ledger: Ledger::new(),
            registry: Registry {
                stations: names(&["web", "design", HUMAN, "ci"]),
                loops: BTreeSet::new(),
                owners: std::collections::BTreeMap::default(),
                ..Registry::default()
            },
            schedule,
            own: BTreeSet::new(),
            now: t(0),
            written: Vec::new(),
            sent: Vec::new(),
        }
    }

    /// Judge `line` in `owner`'s inbox; it must be accepted. Apply it, seen at `at`.
    fn accept(&mut self, owner: &str, line: &str, at: DateTime<Utc>) {
        let own = &self.own;
        let (verdict, envelope) = judge_line(
            line.as_bytes(),
            owner,
            &Limits::default(),
            &self.registry,
            &self.ledger,
            &|id| own.contains(id),
        );
        assert_eq!(verdict, Verdict::Accepted, "{line}");
        let mut accepted = self
            .ledger
            .accepted(&envelope.expect("an accepted line has an envelope"));
        // A loop's request carries the station that answers for it, as the judge sets it.
        if accepted.kind == doorbell_core::Kind::Request {
            accepted.owner = self.registry.owners.get(&accepted.from).cloned();
        }
        self.ledger.apply(accepted, at);
    }

    /// The daemon runs until `at`, then the judge sees `m` (in the inbox it is addressed to).
    fn send(&mut self, m: &Msg, at: DateTime<Utc>) {
        self.advance_to(at);
        self.accept(&m.to(), &m.line(), at);
    }

    /// What `next_due` says for every request, earliest first (ties by request id).
    fn due(&self) -> Vec<(DateTime<Utc>, String, Due)> {
        let mut due: Vec<_> = self
            .ledger
            .requests()
            .filter_map(|r| next_due(r, &self.schedule, HUMAN).map(|(at, d)| (at, r.id.clone(), d)))
            .collect();
        due.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        due
    }

    /// The daemon is up until `until`: a pass whenever the earliest due time arrives.
    fn advance_to(&mut self, until: DateTime<Utc>) {
        assert!(until >= self.now, "virtual time runs forward");
        let mut passes = 0;
        loop {
            let due = self.due();
            let Some(&(earliest, ..)) = due.first() else {
                break;
            };
            if earliest > until {
                break;
            }
            // An overdue item (a `replyBy` already past, or a restart) is written right away.
            let now = earliest.max(self.now);
            // One pass: every debt with something due by now, once, in request-id order (the
            // order within a pass is not part of the contract).
            let mut pass: Vec<_> = due.into_iter().filter(|(when, ..)| *when <= now).collect();
            pass.sort_by(|a, b| a.1.cmp(&b.1));
            for (_, id, item) in pass {
                self.write(&id, item, now);
            }
            self.now = now;
            passes += 1;
            assert!(passes < 10_000, "the schedule never settles");
        }
        self.now = until;
    }

    /// The daemon was down from now until `until`; it restarts then and keeps running.
    fn down_until(&mut self, until: DateTime<Utc>) {
        assert!(until >= self.now, "virtual time runs forward");
        self.now = until;
        self.advance_to(until);
    }

    /// Write `due` for request `id` at `now`, as the daemon does.
    fn write(&mut self, id: &str, due: Due, now: DateTime<Utc>) {
        let request = self
            .ledger
            .request(id)
            .expect("due for a known request")
            .into_owned();
        let (notice, to) = match due {
            Due::Ring(n) => (
                ring_note(&request, n, self.schedule.max_rings, now),
                request.debtor_station().to_owned(),
            ),
            Due::Escalate => (
                escalation_note(&request, HUMAN, Reached::Every, now),
                HUMAN.to_owned(),
            ),
        };
        let text = check_note(&request, due, &notice, &to, self.schedule.max_rings);
        // The judge journals the id, writes the line into the recipient's inbox, and then
        // judges that line like any other: it must be accepted and must not move the clock.
        self.own.insert(notice.id.clone());
        self.accept(&to, &notice.line, now);
        self.ledger.rang(id, request.epoch, due, now);

        let after = self.ledger.request(id).expect("still known");
        assert_eq!(
            (after.state, after.state_since, after.epoch),
            (request.state, request.state_since, request.epoch),
            "a ring or an escalation never changes the request's state or its clock"
        );
        if let Some((next, item)) = next_due(&after, &self.schedule, HUMAN) {
            assert!(
                next > now,
                "{id}: {item:?} due at {next} right after {due:?} at {now}: a burst"
            );
        }
        self.written.push(Written {
            at: now,
            request: id.to_owned(),
            due,
            to,
        });
        self.sent.push(Sent {
            id: notice.id,
            text,
        });
    }

    /// Items written since index `from`.
    fn since(&self, from: usize) -> &[Written] {
        &self.written[from..]
    }

    fn request(&self, id: &str) -> Request {
        self.ledger
            .request(id)
            .expect("request is in the ledger")
            .into_owned()
    }
}

/// Every loop note: a valid line for its recipient's inbox, from `debt-loop`, a `note` that
/// `correlatesTo` the request, under the reserved id, naming who waits and the exact command.
/// Returns its text.
#[track_caller]
fn check_note(request: &Request, due: Due, notice: &Notice, to: &str, max_rings: u32) -> String {
    let envelope = judge_stateless(notice.line.as_bytes(), Some(to), &Limits::default())
        .unwrap_or_else(|refusal| panic!("{} is refused: {refusal}", notice.line));
    let expected_id = match due {
        Due::Ring(n) => ring_id(request, n),
        Due::Escalate => escalation_id(request),
    };
    assert_eq!(notice.to, to);
    assert_eq!(notice.id, expected_id);
    assert_eq!(envelope.id, expected_id);
    assert!(
        is_reserved_id(&expected_id) && expected_id.contains(':'),
        "{expected_id}"
    );
    assert!(expected_id.len() <= 128, "{expected_id}");
    assert_eq!(envelope.from, "debt-loop");
    assert_eq!(envelope.to, to);
    assert_eq!(envelope.kind, Kind::Note);
    assert_eq!(envelope.state, None);
    assert_eq!(envelope.correlates_to.as_deref(), Some(request.id.as_str()));
    assert_eq!(
        envelope.context_id.as_deref(),
        Some(request.context_id.as_str())
    );

    let text = envelope.message.text();
    let command_state = if request.state == State::InputRequired {
        "working"
    } else {
        "completed"
    };
    let command = format!("doorbell reply {} --state {command_state}", request.id);
    for needle in [request.id.as_str(), request.creditor(), command.as_str()] {
        assert!(text.contains(needle), "{needle:?} missing from {text:?}");
    }
    match due {
        Due::Ring(n) => {
            let which = format!("Ring {n} of {max_rings}");
            assert!(text.contains(&which), "{which:?} missing from {text:?}");
        }
        Due::Escalate => {
            let debtor = request.debtor();
            assert!(text.contains(debtor), "{debtor:?} missing from {text:?}");
        }
    }
    text
}

/// `design` asks `to` for `r1`, seen at `t(0)`, with extra fields.
fn asked_with(schedule: Schedule, to: &str, fields: &[(&str, Value)]) -> Sim {
    let mut sim = Sim::new(schedule);
    let mut m = request("r1", "design", to);
    for (key, value) in fields {
        m = m.set(key, value.clone());
    }
    sim.send(&m, t(0));
    sim
}

fn asked() -> Sim {
    asked_with(SCHEDULE, "web", &[])
}

/// The full uninterrupted schedule of a priority-1 debt seen at `t0` and owed to `to`.
fn standard_schedule(t0: DateTime<Utc>, id: &str, to: &str) -> Vec<Written> {
    vec![
        ring(t0 + Duration::minutes(30), id, 1, to),
        ring(t0 + Duration::minutes(90), id, 2, to),
        ring(t0 + Duration::minutes(210), id, 3, to),
        ring(t0 + Duration::minutes(450), id, 4, to),
        escalation(t0 + Duration::minutes(930), id),
    ]
}

// ---- 1. the plain schedule ---------------------------------------------------------------

#[test]
fn rings_back_off_then_escalate_once_then_silence() {
    let mut sim = asked();

    sim.advance_to(t(29));
    assert_eq!(sim.written, [], "nothing before t0 + R");
    sim.advance_to(t(30));
    assert_eq!(
        sim.written,
        [ring(t(30), "r1", 1, "web")],
        "exactly one ring at t0 + R"
    );

    sim.advance_to(t(0) + a_year());
    assert_eq!(
        sim.written,
        [
            ring(t(30), "r1", 1, "web"),  // t0 + R
            ring(t(90), "r1", 2, "web"),  // + R·b   = 60 min
            ring(t(210), "r1", 3, "web"), // + R·b²  = 120 min
            ring(t(450), "r1", 4, "web"), // + R·b³  = 240 min
            escalation(t(930), "r1"),     // + R·b⁴  = 480 min, to the human station
        ]
    );

    let r1 = sim.request("r1");
    assert_eq!((r1.rings, r1.rings_total, r1.escalated), (4, 4, true));
    assert_eq!(r1.last_ring_at, Some(t(450)));
    assert_eq!(r1.state_since, t(0), "rings never reset t0");
    assert_eq!(next_due(&r1, &SCHEDULE, HUMAN), None, "silence forever");

    // Who waits and since when, in the debtor's words; every note has its own reserved id.
    let spans = [
        "30 min",
        "1 h 30 min",
        "3 h 30 min",
        "7 h 30 min",
        "15 h 30 min",
    ];
    for (sent, span) in sim.sent.iter().zip(spans) {
        assert!(sent.text.contains("design"), "who waits: {}", sent.text);
        assert!(
            sent.text.contains(span),
            "since when ({span}): {}",
            sent.text
        );
    }
    let ids: BTreeSet<_> = sim.sent.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids.len(), 5, "distinct reserved ids: {ids:?}");
    assert!(sim.sent[0]
        .text
        .contains("doorbell reply r1 --state completed"));
}

#[test]
fn notes_and_retries_do_not_reset_the_clock() {
    let mut sim = asked();
    sim.send(
        &note("n1", "design", "web").set("correlatesTo", "r1"),
        t(10),
    );
    sim.send(
        &note("n2", "web", "design").set("correlatesTo", "r1"),
        t(20),
    );
    // A safe retry of the request is a duplicate: not applied, no new epoch.
    let retry = request("r1", "design", "web").set("createdAt", "2026-09-03T07:59:00Z");
    let own = &sim.own;
    let (verdict, _) = judge_line(
        retry.line().as_bytes(),
        "web",
        &Limits::default(),
        &sim.registry,
        &sim.ledger,
        &|id| own.contains(id),
    );
    assert_eq!(verdict, Verdict::Duplicate);

    sim.advance_to(t(100));
    assert_eq!(
        sim.written,
        [ring(t(30), "r1", 1, "web"), ring(t(90), "r1", 2, "web")]
    );
}

// ---- 2. a heartbeat starts a new epoch ---------------------------------------------------

#[test]
fn a_working_heartbeat_starts_a_new_epoch() {
    let mut sim = asked();
    sim.advance_to(t(100));
    assert_eq!(sim.request("r1").rings, 2);

    sim.send(&response("h1", "web", "design", "r1", "working"), t(100));
    let r1 = sim.request("r1").clone();
    assert_eq!((r1.epoch, r1.rings, r1.escalated), (1, 0, false));
    assert_eq!((r1.state_since, r1.last_ring_at), (t(100), None));
    assert_eq!(
        next_due(&r1, &SCHEDULE, HUMAN),
        Some((t(130), Due::Ring(1))),
        "heartbeat + R"
    );

    // A record for the old epoch (the state moved on meanwhile) changes nothing.
    sim.ledger.rang("r1", 0, Due::Ring(3), t(101));
    sim.ledger.rang("r1", 0, Due::Escalate, t(101));
    assert_eq!(sim.request("r1"), r1);

    sim.send(&response("h2", "web", "design", "r1", "working"), t(200));
    sim.advance_to(t(0) + a_year());
    assert_eq!(
        sim.written,
        [
            ring(t(30), "r1", 1, "web"),
            ring(t(90), "r1", 2, "web"),
            // epoch 1, from the heartbeat at 100
            ring(t(130), "r1", 1, "web"),
            ring(t(190), "r1", 2, "web"),
            // epoch 2, from the heartbeat at 200: the full schedule again
            ring(t(230), "r1", 1, "web"),
            ring(t(290), "r1", 2, "web"),
            ring(t(410), "r1", 3, "web"),
            ring(t(650), "r1", 4, "web"),
            escalation(t(1130), "r1"),
        ]
    );
    let r1 = sim.request("r1");
    assert_eq!((r1.epoch, r1.rings, r1.rings_total), (2, 4, 8));

    // Ring 1 of each epoch has its own id, so none is mistaken for one already written.
    let first_rings: BTreeSet<_> = [0, 2, 4].iter().map(|&i| &sim.sent[i].id).collect();
    assert_eq!(first_rings.len(), 3, "{first_rings:?}");
    let all: BTreeSet<_> = sim.sent.iter().map(|s| &s.id).collect();
    assert_eq!(all.len(), sim.sent.len());
}

#[test]
fn a_heartbeat_after_the_escalation_starts_over() {
    let mut sim = asked();
    sim.advance_to(t(1000));
    assert_eq!(sim.written, standard_schedule(t(0), "r1", "web"));

    sim.send(&response("h1", "web", "design", "r1", "working"), t(1000));
    sim.advance_to(t(1000) + a_year());
    assert_eq!(sim.since(5), standard_schedule(t(1000), "r1", "web"));
    assert_ne!(
        sim.sent[4].id, sim.sent[9].id,
        "escalation ids differ by epoch"
    );
}

// ---- 3. input-required turns the debt around ---------------------------------------------

#[test]
fn input_required_rings_the_requester_until_it_gives_input() {
    let mut sim = asked();
    sim.send(
        &response("q1", "web", "design", "r1", "input-required"),
        t(40),
    );
    sim.send(&response("i1", "design", "web", "r1", "working"), t(150));
    sim.send(&response("c1", "web", "design", "r1", "completed"), t(200));
    sim.advance_to(t(0) + a_year());
    assert_eq!(
        sim.written,
        [
            ring(t(30), "r1", 1, "web"),
            // input-required at 40: design owes
            ring(t(70), "r1", 1, "design"),
            ring(t(130), "r1", 2, "design"),
            // design's input (working) at 150: web owes again
            ring(t(180), "r1", 1, "web"),
        ]
    );
    let to_design = &sim.sent[1].text;
    assert!(to_design.contains("web"), "web waits: {to_design}");
    assert!(to_design.contains("Ring 1 of 4"), "{to_design}");
    assert!(
        to_design.contains("doorbell reply r1 --state working"),
        "{to_design}"
    );
    let back_to_web = &sim.sent[3].text;
    assert!(
        back_to_web.contains("doorbell reply r1 --state completed"),
        "{back_to_web}"
    );
}

#[test]
fn an_unanswered_question_is_escalated_as_the_requesters_debt() {
    let mut sim = asked();
    sim.send(
        &response("q1", "web", "design", "r1", "input-required"),
        t(10),
    );
    sim.advance_to(t(0) + a_year());
    assert_eq!(
        sim.written,
        [
            ring(t(40), "r1", 1, "design"),
            ring(t(100), "r1", 2, "design"),
            ring(t(220), "r1", 3, "design"),
            ring(t(460), "r1", 4, "design"),
            escalation(t(940), "r1"),
        ]
    );
}

// ---- 4. closing stops everything ---------------------------------------------------------

#[test]
fn canceled_and_terminal_states_stop_everything() {
    // (name, the responses that close r1, each as (from, state)).
    let paths: &[(&str, &[(&str, &str)])] = &[
        ("completed", &[("web", "completed")]),
        ("failed", &[("web", "failed")]),
        ("rejected", &[("web", "rejected")]),
        ("canceled", &[("design", "canceled")]),
        (
            "working, completed",
            &[("web", "working"), ("web", "completed")],
        ),
        (
            "working, canceled",
            &[("web", "working"), ("design", "canceled")],
        ),
        (
            "input-required, failed",
            &[("web", "input-required"), ("web", "failed")],
        ),
        (
            "input-required, canceled",
            &[("web", "input-required"), ("design", "canceled")],
        ),
    ];
    // Closed before ring 1, and after it.
    for (start, rang_before) in [(10, vec![]), (40, vec![ring(t(30), "r1", 1, "web")])] {
        for (name, steps) in paths {
            let mut sim = asked();
            for ((from, state), minute) in steps.iter().zip(start..) {
                let to = if *from == "web" { "design" } else { "web" };
                let id = format!("x{minute}");
                sim.send(&response(&id, from, to, "r1", state), t(minute));
            }
            assert!(!sim.request("r1").is_open(), "{name}");
            assert_eq!(
                next_due(&sim.request("r1"), &SCHEDULE, HUMAN),
                None,
                "{name} at {start}"
            );
            sim.advance_to(t(0) + a_year());
            assert_eq!(sim.written, rang_before, "{name} at {start}");
        }
    }
}

// ---- 5. priority -------------------------------------------------------------------------

#[test]
fn priority_divides_the_interval() {
    // (priority, R in seconds); `None` leaves the field out (normal).
    let rows: [(Option<u8>, i64); 5] = [
        (None, 1800),
        (Some(0), 1800),
        (Some(1), 1800),
        (Some(2), 900),
        (Some(3), 450),
    ];
    for (priority, r) in rows {
        let fields: Vec<(&str, Value)> = priority
            .map(|p| ("priority", p.into()))
            .into_iter()
            .collect();
        let mut sim = asked_with(SCHEDULE, "web", &fields);
        assert_eq!(
            interval(&SCHEDULE, priority.unwrap_or(1)),
            StdDuration::from_secs(r.unsigned_abs()),
            "R for priority {priority:?}"
        );
        sim.advance_to(t(0) + a_year());
        // R, then R·2, R·4, R·8 after each ring, then R·16 to the escalation.
        assert_eq!(
            sim.written,
            [
                ring(ts(r), "r1", 1, "web"),
                ring(ts(3 * r), "r1", 2, "web"),
                ring(ts(7 * r), "r1", 3, "web"),
                ring(ts(15 * r), "r1", 4, "web"),
                escalation(ts(31 * r), "r1"),
            ],
            "priority {priority:?}"
        );
    }
}

// ---- 6. replyBy --------------------------------------------------------------------------

#[test]
fn reply_by_brings_the_first_ring_forward_never_back() {
    // (priority, replyBy in seconds from t0, ring 1, ring 2), times in seconds from t0.
    // Ring 2 is always R·b after ring 1 as actually written.
    let rows: [(u8, Option<i64>, i64, i64); 8] = [
        (1, None, 1800, 5400),
        (1, Some(600), 600, 4200), // earlier than t0 + R: rings at replyBy
        (1, Some(1800), 1800, 5400), // equal
        (1, Some(7200), 1800, 5400), // later: changes nothing
        (1, Some(-3600), 0, 3600), // already past when seen: the first pass
        (1, Some(-30 * 86_400), 0, 3600), // long past: still one ring, not a burst
        (3, Some(300), 300, 1200), // R = 7.5 min, replyBy at 5 min
        (3, Some(600), 450, 1350), // replyBy later than R/4: changes nothing
    ];
    for (priority, reply_by, first, second) in rows {
        let mut fields = vec![("priority", Value::from(priority))];
        if let Some(offset) = reply_by {
            fields.push(("replyBy", ts(offset).to_rfc3339().into()));
        }
        let mut sim = asked_with(SCHEDULE, "web", &fields);
        sim.advance_to(ts(second));
        assert_eq!(
            sim.written,
            [
                ring(ts(first), "r1", 1, "web"),
                ring(ts(second), "r1", 2, "web")
            ],
            "priority {priority}, replyBy {reply_by:?}"
        );
    }
}

/// A ring says the deadline the request gave: one that has passed is why ring 1 comes at
/// once, "since 0 s ago".
#[test]
fn a_ring_says_the_deadline_it_rings_for() {
    for (reply_by, at, said) in [
        (
            Some(-3600),
            0,
            Some("Its deadline (replyBy) passed 1 h 0 min ago."),
        ),
        (
            Some(7200),
            1800,
            Some("Its deadline (replyBy) is in 1 h 30 min."),
        ),
        (None, 1800, None),
    ] {
        let fields: Vec<(&str, Value)> = reply_by
            .map(|offset| vec![("replyBy", ts(offset).to_rfc3339().into())])
            .unwrap_or_default();
        let mut sim = asked_with(SCHEDULE, "web", &fields);
        sim.advance_to(ts(at));
        let text = &sim.sent.first().expect("ring 1").text;
        match said {
            Some(said) => assert!(text.contains(said), "{reply_by:?}: {text}"),
            None => assert!(!text.contains("deadline"), "{text}"),
        }
    }
}

// ---- 7. the human's own debts ------------------------------------------------------------

#[test]
fn a_debt_the_human_owes_is_never_escalated() {
    // design asks the human: rings up to max_rings, then silence.
    let mut sim = asked_with(SCHEDULE, HUMAN, &[]);
    sim.advance_to(t(0) + a_year());
    let mut expected = standard_schedule(t(0), "r1", HUMAN);
    expected.pop();
    assert_eq!(sim.written, expected);
    assert_eq!(next_due(&sim.request("r1"), &SCHEDULE, HUMAN), None);

    // The human asked web, and web asked back: now the human owes, and is not escalated to.
    let mut sim = Sim::new(SCHEDULE);
    sim.send(&request("r1", HUMAN, "web"), t(0));
    sim.send(&response("q1", "web", HUMAN, "r1", "input-required"), t(10));
    sim.advance_to(t(0) + a_year());
    let mut expected = standard_schedule(t(10), "r1", HUMAN);
    expected.pop();
    assert_eq!(sim.written, expected);

    // While web owes the human, the debt is escalated (to the human, who is its creditor).
    let mut sim = Sim::new(SCHEDULE);
    sim.send(&request("r1", HUMAN, "web"), t(0));
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written, standard_schedule(t(0), "r1", "web"));
}

/// A loop whose owner is the human asked web, and web asked back: the owner, the human, owes
/// the next move, so it is rung and never escalated (to itself).
#[test]
fn a_question_on_a_loops_request_owed_by_the_human_owner_is_never_escalated() {
    let mut sim = Sim::new(SCHEDULE);
    sim.registry.loops.insert("nightly".to_owned());
    sim.registry
        .owners
        .insert("nightly".to_owned(), HUMAN.to_owned());
    sim.send(&request("r1", "nightly", "web"), t(0));
    sim.send(&response("q1", "web", HUMAN, "r1", "input-required"), t(10));
    sim.advance_to(t(0) + a_year());
    let mut expected = standard_schedule(t(10), "r1", HUMAN);
    expected.pop();
    assert_eq!(sim.written, expected);
}

// ---- 8. downtime -------------------------------------------------------------------------

#[test]
fn a_long_downtime_yields_one_late_ring_not_a_burst() {
    let mut sim = asked();
    sim.down_until(day30());
    assert_eq!(
        sim.written,
        [ring(day30(), "r1", 1, "web")],
        "one ring, not a burst"
    );

    sim.advance_to(day30() + a_year());
    let d = |minutes| day30() + Duration::minutes(minutes);
    assert_eq!(
        sim.since(1),
        [
            ring(d(60), "r1", 2, "web"),  // R·b after the ring as written
            ring(d(180), "r1", 3, "web"), // + R·b²
            ring(d(420), "r1", 4, "web"), // + R·b³
            escalation(d(900), "r1"),     // + R·b⁴
        ]
    );
}

#[test]
fn after_a_downtime_each_debt_gets_at_most_one_item() {
    let mut sim = Sim::new(SCHEDULE);
    sim.send(&request("r1", "design", "web"), t(0));
    sim.send(&request("r2", "design", "web").set("priority", 3), t(0));
    sim.send(&request("r3", "design", HUMAN), t(0));
    sim.send(&request("r4", "design", "ci"), t(110));
    sim.advance_to(t(120));
    assert_eq!(
        sim.written,
        [
            ring(ts(450), "r2", 1, "web"),
            ring(ts(1350), "r2", 2, "web"),
            ring(t(30), "r1", 1, "web"),
            ring(t(30), "r3", 1, HUMAN),
            ring(ts(3150), "r2", 3, "web"),
            ring(t(90), "r1", 2, "web"),
            ring(t(90), "r3", 2, HUMAN),
            ring(ts(6750), "r2", 4, "web"),
        ]
    );

    // Down from 10:00 for 30 days. Overdue: r1 ring 3 (since 11:30), r2's escalation (since
    // 11:52:30), r3 ring 3, r4 ring 1 (since 10:20) — and many more after each of them.
    sim.down_until(day30());
    let d = |minutes| day30() + Duration::minutes(minutes);
    assert_eq!(
        sim.since(8),
        [
            ring(d(0), "r1", 3, "web"),
            escalation(d(0), "r2"),
            ring(d(0), "r3", 3, HUMAN),
            ring(d(0), "r4", 1, "ci"),
        ],
        "the restart pass: one item per debt"
    );

    sim.advance_to(day30() + a_year());
    assert_eq!(
        sim.since(12),
        [
            ring(d(60), "r4", 2, "ci"),
            ring(d(180), "r4", 3, "ci"),
            ring(d(240), "r1", 4, "web"),
            ring(d(240), "r3", 4, HUMAN),
            ring(d(420), "r4", 4, "ci"),
            escalation(d(720), "r1"),
            escalation(d(900), "r4"),
        ]
    );
}

#[test]
fn a_checkpoint_mid_schedule_resumes_the_same_schedule() {
    let mut sim = asked();
    sim.advance_to(t(100));
    // The requests go into the index and come back after a restart.
    let saved: Vec<String> = sim
        .ledger
        .requests()
        .map(|r| serde_json::to_string(r).expect("a request serialises"))
        .collect();
    sim.ledger = doorbell_core::Ledger::new();
    sim.ledger.load(
        saved
            .iter()
            .map(|r| serde_json::from_str(r).expect("a request deserialises")),
    );
    let r1 = sim.request("r1");
    assert_eq!((r1.rings, r1.last_ring_at), (2, Some(t(90))));
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written, standard_schedule(t(0), "r1", "web"));
}

// ---- 9. no rings at all ------------------------------------------------------------------

#[test]
fn max_rings_zero_escalates_once_at_t0_plus_r() {
    let schedule = Schedule {
        max_rings: 0,
        ..SCHEDULE
    };
    let mut sim = asked_with(schedule, "web", &[]);
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written, [escalation(t(30), "r1")]);
    assert_eq!(sim.request("r1").rings_total, 0);

    let mut sim = asked_with(schedule, "web", &[("priority", 3.into())]);
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written, [escalation(ts(450), "r1")]);

    // The human's own debt: neither rung nor escalated.
    let mut sim = asked_with(schedule, HUMAN, &[]);
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written, []);
}

// ---- reserved ids ------------------------------------------------------------------------

#[test]
fn reserved_ids_fit_even_for_the_longest_request_id() {
    let long = "a".repeat(128);
    let mut sim = Sim::new(SCHEDULE);
    sim.send(&request(&long, "design", "web"), t(0));
    sim.send(&request("b", "design", "web"), t(0));
    sim.advance_to(t(0) + a_year());
    assert_eq!(sim.written.len(), 10);
    // check_note already parsed each line; ids are also unique across requests.
    let ids: BTreeSet<_> = sim.sent.iter().map(|s| &s.id).collect();
    assert_eq!(ids.len(), 10);
    assert!(ids.iter().all(|id| id.len() <= 128));
}

// ---- the end of time ---------------------------------------------------------------------

#[test]
fn a_due_time_past_the_end_of_time_is_never_not_a_panic() {
    // Settings the config accepts (backoff 1–100, any positive ring_after): ring 4 comes
    // 2,700 years on, and R·b⁴ after it (273,000 years) lies past what a timestamp can hold.
    let schedule = Schedule {
        ring_after: StdDuration::from_secs(86_400),
        backoff: 100.0,
        max_rings: 4,
    };
    let mut sim = asked_with(schedule, "web", &[]);
    sim.advance_to(t(0) + Duration::days(3000 * 366));
    let day = |days: i64| t(days * 24 * 60);
    assert_eq!(
        sim.written,
        [
            ring(day(1), "r1", 1, "web"),
            ring(day(101), "r1", 2, "web"),
            ring(day(10_101), "r1", 3, "web"),
            ring(day(1_010_101), "r1", 4, "web"),
        ]
    );
    assert_eq!(next_due(&sim.request("r1"), &schedule, HUMAN), None);

    // The longest ring_after the config parses: even ring 1 is never due.
    let schedule = Schedule {
        ring_after: StdDuration::from_secs(u64::from(u32::MAX) * 7 * 86_400),
        ..SCHEDULE
    };
    let sim = asked_with(schedule, "web", &[]);
    assert_eq!(next_due(&sim.request("r1"), &schedule, HUMAN), None);
    // ... unless the requester's replyBy says when.
    let sim = asked_with(schedule, "web", &[("replyBy", t(10).to_rfc3339().into())]);
    assert_eq!(
        next_due(&sim.request("r1"), &schedule, HUMAN),
        Some((t(10), Due::Ring(1)))
    );
}
