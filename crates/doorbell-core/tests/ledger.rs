//! The stateful rules (DESIGN §3) and the ledger (DESIGN §4), driven with plain data: JSON
//! lines in, verdicts out. Every expectation here is written out by hand from the contract;
//! nothing is computed with the crate's own tables.
//!
//! The cast: `design` asks `web` (request `r1`, in web's inbox). `ci` and `human` are other
//! stations, `review-loop` is a config loop, `stranger` is nobody.

use std::collections::BTreeSet;

use chrono::{DateTime, Duration, TimeZone, Utc};
use doorbell_core::{judge_line, Ledger, Limits, Registry, State, Verdict};
use serde_json::json;

mod common;
use common::{msg, note, request, response, Msg};

// ---- the judge, with a clock -------------------------------------------------------------

fn t(minutes: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 9, 3, 8, 0, 0).unwrap() + Duration::minutes(minutes)
}

/// A ledger, a registry and the judge's clock, which moves one minute per judged line.
struct Bridge {
    ledger: Ledger,
    registry: Registry,
    /// Ids the judge itself wrote (its journal), for `own_line`.
    own: BTreeSet<String>,
    minute: i64,
}

impl Bridge {
    fn new() -> Self {
        let names = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect();
        Self {
            ledger: Ledger::new(),
            registry: Registry {
                stations: names(&["web", "design", "human", "ci"]),
                loops: names(&["review-loop"]),
                owners: std::collections::BTreeMap::default(),
                ..Registry::default()
            },
            own: BTreeSet::new(),
            minute: 0,
        }
    }

    /// The judge's `seenAt` for the last line judged.
    fn now(&self) -> DateTime<Utc> {
        t(self.minute)
    }

    /// Judge `line` found in `owner`'s inbox; apply it when accepted. Returns `accepted`,
    /// `duplicate` or the refusal's reason code.
    fn judge_in(&mut self, owner: &str, line: &str) -> String {
        self.minute += 1;
        let own = &self.own;
        let (verdict, envelope) = judge_line(
            line.as_bytes(),
            owner,
            &Limits::default(),
            &self.registry,
            &self.ledger,
            &|id| own.contains(id),
        );
        if verdict == Verdict::Accepted {
            let envelope = envelope.expect("an accepted line has an envelope");
            let accepted = self.ledger.accepted(&envelope);
            self.ledger.apply(accepted, self.now());
        }
        match verdict {
            Verdict::Refused(refusal) => refusal.reason.code().to_owned(),
            other => other.word().to_owned(),
        }
    }

    /// Judge a message in the inbox it is addressed to.
    fn send(&mut self, m: &Msg) -> String {
        self.judge_in(&m.to(), &m.line())
    }

    /// Send a message that must be accepted (setting up a scenario).
    fn ok(&mut self, m: &Msg) {
        assert_eq!(self.send(m), "accepted", "setup line refused: {}", m.line());
    }

    fn state(&self, id: &str) -> State {
        self.ledger
            .request(id)
            .expect("request is in the ledger")
            .state
    }
}

/// The one assertion of the table tests: this message, in its own inbox, gets this verdict.
#[track_caller]
fn check(bridge: &mut Bridge, m: &Msg, expected: &str) {
    let got = bridge.send(m);
    assert_eq!(got, expected, "verdict for {}", m.line());
}

/// Same, for a message found in `owner`'s inbox.
#[track_caller]
fn check_in(bridge: &mut Bridge, owner: &str, m: &Msg, expected: &str) {
    let got = bridge.judge_in(owner, &m.line());
    assert_eq!(got, expected, "verdict for {} in {owner}'s inbox", m.line());
}

/// A bridge where `design` asked `web` (request `r1`).
fn asked() -> Bridge {
    let mut bridge = Bridge::new();
    bridge.ok(&request("r1", "design", "web"));
    bridge
}

// ---- the transition table, every cell ----------------------------------------------------

const OK: &str = "accepted";
const NA: &str = "not-addressee";
const RC: &str = "request-closed";
const BT: &str = "bad-transition";

/// Response states, in the column order of the grids below.
const SENT: [&str; 6] = [
    "working",
    "input-required",
    "completed",
    "failed",
    "canceled",
    "rejected",
];

/// DESIGN §4 written out cell by cell: from-state, then the verdict for each state in `SENT`.
/// The requester may only send `working` and `canceled` (anything else is `not-addressee`,
/// checked before `request-closed`); nobody moves a closed request.
#[rustfmt::skip]
const ADDRESSEE_GRID: [(&str, [&str; 6]); 7] = [
    //                  working input-req completed failed canceled rejected
    ("submitted",      [OK,     OK,       OK,       OK,    BT,      OK]),
    ("working",        [OK,     OK,       OK,       OK,    BT,      BT]),
    ("input-required", [OK,     BT,       OK,       OK,    BT,      BT]),
    ("completed",      [RC,     RC,       RC,       RC,    RC,      RC]),
    ("failed",         [RC,     RC,       RC,       RC,    RC,      RC]),
    ("canceled",       [RC,     RC,       RC,       RC,    RC,      RC]),
    ("rejected",       [RC,     RC,       RC,       RC,    RC,      RC]),
];

#[rustfmt::skip]
const REQUESTER_GRID: [(&str, [&str; 6]); 7] = [
    //                  working input-req completed failed canceled rejected
    ("submitted",      [BT,     NA,       NA,       NA,    OK,      NA]),
    ("working",        [BT,     NA,       NA,       NA,    OK,      NA]),
    ("input-required", [OK,     NA,       NA,       NA,    OK,      NA]),
    ("completed",      [RC,     NA,       NA,       NA,    RC,      NA]),
    ("failed",         [RC,     NA,       NA,       NA,    RC,      NA]),
    ("canceled",       [RC,     NA,       NA,       NA,    RC,      NA]),
    ("rejected",       [RC,     NA,       NA,       NA,    RC,      NA]),
];

/// A fresh bridge with `r1` brought to `state` by a legal path.
fn in_state(state: &str) -> Bridge {
    let mut bridge = asked();
    match state {
        "submitted" => {}
        "canceled" => bridge.ok(&response("p1", "design", "web", "r1", "canceled")),
        other => bridge.ok(&response("p1", "web", "design", "r1", other)),
    }
    assert_eq!(bridge.state("r1").as_str(), state);
    bridge
}

fn run_grid(grid: &[(&str, [&str; 6]); 7], by_addressee: bool) {
    for (from_state, row) in grid {
        for (sent, expected) in SENT.iter().zip(row) {
            let mut bridge = in_state(from_state);
            let before = bridge.ledger.request("r1").unwrap().into_owned();
            let m = if by_addressee {
                response("x1", "web", "design", "r1", sent)
            } else {
                response("x1", "design", "web", "r1", sent)
            };
            let side = if by_addressee {
                "addressee"
            } else {
                "requester"
            };
            let got = bridge.send(&m);
            assert_eq!(&got, expected, "{side} sends {sent} from {from_state}");
            let after = bridge.ledger.request("r1").unwrap();
            if got == OK {
                assert_eq!(
                    after.state.as_str(),
                    *sent,
                    "{side} {sent} from {from_state}"
                );
                assert_eq!(after.epoch, before.epoch + 1);
                assert_eq!(after.state_since, bridge.now());
                assert!(bridge.ledger.is_claimed("x1"));
            } else {
                assert_eq!(*after, before, "a refused line leaves the request alone");
                assert!(
                    !bridge.ledger.is_claimed("x1"),
                    "a refused line claims no id"
                );
            }
        }
    }
}

#[test]
fn transition_table_addressee() {
    run_grid(&ADDRESSEE_GRID, true);
}

#[test]
fn transition_table_requester() {
    run_grid(&REQUESTER_GRID, false);
}

#[test]
fn longer_legal_paths() {
    // submitted -> working -> working -> input-required -> (requester) working -> completed
    let mut bridge = asked();
    for (id, from, to, state) in [
        ("p1", "web", "design", "working"),
        ("p2", "web", "design", "working"),
        ("p3", "web", "design", "input-required"),
        ("p4", "design", "web", "working"),
        ("p5", "web", "design", "input-required"),
        ("p6", "design", "web", "canceled"),
    ] {
        check(&mut bridge, &response(id, from, to, "r1", state), OK);
        assert_eq!(bridge.state("r1").as_str(), state);
    }
    let r1 = bridge.ledger.request("r1").unwrap();
    assert_eq!((r1.epoch, r1.responses), (6, 6));
    assert_eq!(r1.closed_at, Some(r1.state_since));
    assert_eq!(r1.first_response_at, Some(t(2)));
}

// ---- debts -------------------------------------------------------------------------------

/// `(debtor, creditor, state)` of every open debt, oldest first.
fn debts(bridge: &Bridge) -> Vec<(String, String, &'static str)> {
    bridge
        .ledger
        .debts()
        .iter()
        .map(|d| {
            (
                d.debtor().to_owned(),
                d.creditor().to_owned(),
                d.request.state.as_str(),
            )
        })
        .collect()
}

fn debt(debtor: &str, creditor: &str, state: &'static str) -> (String, String, &'static str) {
    (debtor.to_owned(), creditor.to_owned(), state)
}

#[test]
fn input_required_turns_the_debt_around() {
    let mut bridge = asked();
    assert_eq!(debts(&bridge), [debt("web", "design", "submitted")]);

    bridge.ok(&response("p1", "web", "design", "r1", "input-required"));
    let r1 = bridge.ledger.request("r1").unwrap();
    assert_eq!((r1.debtor(), r1.creditor()), ("design", "web"));
    assert!(r1.is_open());
    assert_eq!(debts(&bridge), [debt("design", "web", "input-required")]);

    // The requester gives the input it was asked for: the addressee owes again.
    bridge.ok(&response("p2", "design", "web", "r1", "working"));
    let r1 = bridge.ledger.request("r1").unwrap();
    assert_eq!((r1.debtor(), r1.creditor()), ("web", "design"));
    assert_eq!(debts(&bridge), [debt("web", "design", "working")]);
}

#[test]
fn terminal_states_remove_the_debt() {
    for (from, to, state) in [
        ("web", "design", "completed"),
        ("web", "design", "failed"),
        ("web", "design", "rejected"),
        ("design", "web", "canceled"),
    ] {
        // From submitted, and from input-required (where the requester was the debtor).
        for via_input in [false, true] {
            let mut bridge = asked();
            if via_input {
                bridge.ok(&response("p0", "web", "design", "r1", "input-required"));
            }
            if via_input && state == "rejected" {
                // rejected is only allowed from submitted.
                check(&mut bridge, &response("p1", from, to, "r1", state), BT);
                continue;
            }
            check(&mut bridge, &response("p1", from, to, "r1", state), OK);
            assert!(
                debts(&bridge).is_empty(),
                "{state} (via input-required: {via_input})"
            );
            let r1 = bridge.ledger.request("r1").unwrap();
            assert!(!r1.is_open());
            assert_eq!(r1.closed_at, Some(bridge.now()));
        }
    }
}

#[test]
fn debts_of_several_requests_oldest_state_first() {
    let mut bridge = Bridge::new();
    bridge.ok(&request("a", "design", "web")); // t1
    bridge.ok(&request("b", "web", "ci")); // t2
    bridge.ok(&request("c", "ci", "human")); // t3
    let order = |bridge: &Bridge| -> Vec<String> {
        bridge
            .ledger
            .debts()
            .iter()
            .map(|d| d.request.id.clone())
            .collect()
    };
    assert_eq!(order(&bridge), ["a", "b", "c"]);
    // A heartbeat on the oldest makes it the newest; a note on b changes nothing.
    bridge.ok(&response("a1", "web", "design", "a", "working"));
    bridge.ok(&note("n1", "ci", "web").set("correlatesTo", "b"));
    assert_eq!(order(&bridge), ["b", "c", "a"]);
    // Closing c removes it; a request nobody answered stays.
    bridge.ok(&response("c1", "human", "ci", "c", "completed"));
    assert_eq!(order(&bridge), ["b", "a"]);
    assert_eq!(bridge.ledger.requests().count(), 3);
}

// ---- the clock: state_since (t0) and epoch -----------------------------------------------

#[test]
fn state_since_and_epoch() {
    let mut bridge = asked();
    let seen = bridge.now();
    let at = |bridge: &Bridge| {
        let r1 = bridge.ledger.request("r1").unwrap();
        (r1.state_since, r1.epoch, r1.responses)
    };
    let r1 = bridge.ledger.request("r1").unwrap();
    assert_eq!(
        (r1.seen_at, r1.first_response_at, r1.closed_at),
        (seen, None, None)
    );
    assert_eq!(at(&bridge), (seen, 0, 0));

    // Notes about the request, from either side or a third party, never reset the clock.
    bridge.ok(&note("n1", "web", "design").set("correlatesTo", "r1"));
    bridge.ok(&note("n2", "design", "web").set("correlatesTo", "r1"));
    bridge.ok(&note("n3", "ci", "web").set("correlatesTo", "r1"));
    assert_eq!(at(&bridge), (seen, 0, 0));

    // A working heartbeat is a state change: new epoch, new t0.
    bridge.ok(&response("p1", "web", "design", "r1", "working"));
    let first = bridge.now();
    assert_eq!(at(&bridge), (first, 1, 1));
    bridge.ok(&response("p2", "web", "design", "r1", "working"));
    let second = bridge.now();
    assert_eq!(at(&bridge), (second, 2, 2));

    // Refused lines and notes leave it alone.
    check(
        &mut bridge,
        &response("p3", "web", "design", "r1", "rejected"),
        BT,
    );
    bridge.ok(&note("n4", "web", "design").set("correlatesTo", "r1"));
    assert_eq!(at(&bridge), (second, 2, 2));

    let r1 = bridge.ledger.request("r1").unwrap();
    assert_eq!(r1.first_response_at, Some(first));
    assert_eq!(r1.seen_at, seen, "delivery time never moves");
}

// ---- misaddressed ------------------------------------------------------------------------

#[test]
fn misaddressed() {
    let mut bridge = asked();
    // `to` is not the inbox's owner.
    check_in(
        &mut bridge,
        "web",
        &request("q1", "design", "ci"),
        "misaddressed",
    );
    check_in(
        &mut bridge,
        "ci",
        &note("q2", "design", "web"),
        "misaddressed",
    );
    check_in(
        &mut bridge,
        "web",
        &response("q3", "web", "design", "r1", "working"),
        "misaddressed",
    );
    // A response written to the wrong party of its request (in that party's own inbox).
    for (m, why) in [
        (
            response("q4", "web", "web", "r1", "completed"),
            "the addressee answers itself",
        ),
        (
            response("q5", "web", "ci", "r1", "completed"),
            "the addressee answers a third agent",
        ),
        (
            response("q6", "design", "design", "r1", "canceled"),
            "the requester cancels to itself",
        ),
        (
            response("q7", "design", "human", "r1", "canceled"),
            "the requester cancels to a third agent",
        ),
        (
            response("q8", "ci", "ci", "r1", "completed"),
            "a third station answers to itself",
        ),
        (
            response("q9", "ci", "human", "r1", "completed"),
            "a third station to another third",
        ),
    ] {
        assert_eq!(bridge.send(&m), "misaddressed", "{why}");
    }
    // Notes may go anywhere, about any request.
    check(
        &mut bridge,
        &note("q10", "ci", "human").set("correlatesTo", "r1"),
        OK,
    );
    assert_eq!(bridge.state("r1"), State::Submitted);
}

// ---- not-addressee -----------------------------------------------------------------------

#[test]
fn not_addressee_for_a_third_station() {
    for state in SENT {
        let mut bridge = asked();
        // To either party: addressed fine, but ci is no party of r1.
        check(
            &mut bridge,
            &response("x1", "ci", "design", "r1", state),
            NA,
        );
        check(&mut bridge, &response("x2", "ci", "web", "r1", state), NA);
        check(
            &mut bridge,
            &response("x3", "human", "design", "r1", state),
            NA,
        );
        assert_eq!(bridge.state("r1"), State::Submitted);
    }
    // Even once the request is closed, a stranger to it is told it is no party first.
    let mut bridge = in_state("completed");
    check(
        &mut bridge,
        &response("x1", "ci", "design", "r1", "working"),
        NA,
    );
}

#[test]
fn asking_oneself() {
    // A request to oneself: both sides are the same station.
    let mut bridge = Bridge::new();
    bridge.ok(&request("s1", "web", "web"));
    check(
        &mut bridge,
        &response("s2", "web", "web", "s1", "input-required"),
        OK,
    );
    check(
        &mut bridge,
        &response("s3", "web", "web", "s1", "working"),
        OK,
    );
    check(
        &mut bridge,
        &response("s4", "web", "web", "s1", "completed"),
        OK,
    );
    check(
        &mut bridge,
        &response("s5", "web", "web", "s1", "canceled"),
        RC,
    );
    let mut bridge = Bridge::new();
    bridge.ok(&request("s1", "web", "web"));
    check(
        &mut bridge,
        &response("s2", "web", "web", "s1", "canceled"),
        OK,
    );
}

// ---- context-mismatch --------------------------------------------------------------------

#[test]
fn context_mismatch_and_inheritance() {
    let mut bridge = Bridge::new();
    // A request without contextId is its own thread; one that names a thread keeps it.
    let line = request("r0", "design", "web").line();
    let (verdict, envelope) = judge_line(
        line.as_bytes(),
        "web",
        &Limits::default(),
        &bridge.registry,
        &bridge.ledger,
        &|_| false,
    );
    assert_eq!(verdict, Verdict::Accepted);
    assert_eq!(bridge.ledger.accepted(&envelope.unwrap()).context_id, "r0");

    bridge.ok(&request("r1", "design", "web").set("contextId", "thread-1"));
    assert_eq!(bridge.ledger.request("r1").unwrap().context_id, "thread-1");

    // Naming another thread is refused; naming the request's own id is too, as it is not
    // the thread.
    check(
        &mut bridge,
        &response("p1", "web", "design", "r1", "working").set("contextId", "other"),
        "context-mismatch",
    );
    check(
        &mut bridge,
        &response("p2", "web", "design", "r1", "working").set("contextId", "r1"),
        "context-mismatch",
    );
    check(
        &mut bridge,
        &response("p3", "design", "web", "r1", "canceled").set("contextId", "other"),
        "context-mismatch",
    );
    assert_eq!(bridge.state("r1"), State::Submitted);

    // Naming the right one, or none, is accepted, and the one left out is inherited.
    check(
        &mut bridge,
        &response("p4", "web", "design", "r1", "working").set("contextId", "thread-1"),
        OK,
    );
    let omitted = response("p5", "web", "design", "r1", "input-required");
    let line = omitted.line();
    let (verdict, envelope) = judge_line(
        line.as_bytes(),
        "design",
        &Limits::default(),
        &bridge.registry,
        &bridge.ledger,
        &|_| false,
    );
    assert_eq!(verdict, Verdict::Accepted);
    let accepted = bridge.ledger.accepted(&envelope.unwrap());
    assert_eq!(accepted.context_id, "thread-1");
    assert_eq!(accepted.correlates_to.as_deref(), Some("r1"));

    // A note about the request inherits its thread too.
    let about = note("n1", "ci", "web").set("correlatesTo", "r1");
    let line = about.line();
    let (verdict, envelope) = judge_line(
        line.as_bytes(),
        "web",
        &Limits::default(),
        &bridge.registry,
        &bridge.ledger,
        &|_| false,
    );
    assert_eq!(verdict, Verdict::Accepted);
    assert_eq!(
        bridge.ledger.accepted(&envelope.unwrap()).context_id,
        "thread-1"
    );
}

// ---- duplicate and id-reused -------------------------------------------------------------

#[test]
fn duplicate_is_a_safe_retry() {
    let mut bridge = Bridge::new();
    let original = request("r1", "design", "web")
        .set("priority", 2)
        .set("taskId", "q-1");
    bridge.ok(&original);
    let before = bridge.ledger.request("r1").unwrap().into_owned();
    let claims = bridge.ledger.len();

    let retries = [
        original.clone().set("createdAt", "2026-09-03T02:00:00Z"),
        original
            .clone()
            .set("createdAt", "2026-09-03T03:26:51+02:00"),
        original.clone(),
        // The same envelope with the defaults written out.
        original
            .clone()
            .set("state", "submitted")
            .set("contextId", "r1")
            .set(
                "message",
                json!({"role": "agent", "parts": [{"type": "text", "text": "request r1"}]}),
            ),
    ];
    for retry in &retries {
        check(&mut bridge, retry, "duplicate");
    }
    // Field order and JSON escapes are not content.
    let reordered = r#"{"message":{"parts":[{"text":"request \u0072\u0031","type":"text"}]},"taskId":"q-1","priority":2,"createdAt":"2026-09-04T00:00:00Z","kind":"request","to":"web","from":"design","id":"r1"}"#;
    assert_eq!(bridge.judge_in("web", reordered), "duplicate");

    assert_eq!(bridge.ledger.len(), claims);
    assert_eq!(
        *bridge.ledger.request("r1").unwrap(),
        before,
        "a duplicate changes nothing"
    );
}

#[test]
fn duplicate_response_even_after_close() {
    let mut bridge = asked();
    let working = response("p1", "web", "design", "r1", "working");
    bridge.ok(&working);
    check(
        &mut bridge,
        &working.clone().set("createdAt", "2026-09-03T05:00:00Z"),
        "duplicate",
    );
    assert_eq!(
        bridge.ledger.request("r1").unwrap().epoch,
        1,
        "a retried heartbeat is counted once"
    );

    let done = response("p2", "web", "design", "r1", "completed");
    bridge.ok(&done);
    check(
        &mut bridge,
        &done.clone().set("createdAt", "2026-09-03T06:00:00Z"),
        "duplicate",
    );
    check(&mut bridge, &working, "duplicate");
    assert_eq!(bridge.ledger.request("r1").unwrap().responses, 2);
}

#[test]
fn id_reused() {
    let mut bridge = asked();
    bridge.ok(&note("n1", "web", "design"));
    bridge.ok(&response("p1", "web", "design", "r1", "working"));
    let table = [
        // Same id, different content.
        (
            request("r1", "design", "web").text("something else"),
            "id-reused",
        ),
        (
            request("r1", "design", "web").set("priority", 3),
            "id-reused",
        ),
        (
            request("r1", "design", "web").set("contextId", "t2"),
            "id-reused",
        ),
        (
            request("r1", "design", "web").set("replyBy", "2026-09-04T00:00:00Z"),
            "id-reused",
        ),
        (
            request("r1", "design", "web").set("taskId", "q-2"),
            "id-reused",
        ),
        (
            request("r1", "design", "web").set(
                "message",
                json!({"role": "user", "parts": [{"type": "text", "text": "request r1"}]}),
            ),
            "id-reused",
        ),
        (request("r1", "ci", "web"), "id-reused"),
        (
            response("p1", "web", "design", "r1", "input-required"),
            "id-reused",
        ),
        // Across kinds.
        (note("r1", "design", "web"), "id-reused"),
        (request("n1", "web", "design"), "id-reused"),
        (
            response("n1", "web", "design", "r1", "working"),
            "id-reused",
        ),
        (note("p1", "web", "design"), "id-reused"),
        (request("p1", "web", "design"), "id-reused"),
        // A response that reuses the id of the very request it answers.
        (
            response("r1", "web", "design", "r1", "completed"),
            "id-reused",
        ),
    ];
    for (m, expected) in &table {
        check(&mut bridge, m, expected);
    }
    assert_eq!(bridge.state("r1"), State::Working);
    assert_eq!(bridge.ledger.len(), 3);
}

// ---- unknown requests, senders, loops and borrowed names ---------------------------------

#[test]
fn unknown_request() {
    let mut bridge = asked();
    check(
        &mut bridge,
        &response("p1", "web", "design", "nope", "completed"),
        "unknown-request",
    );
    check(
        &mut bridge,
        &response("p2", "design", "web", "nope", "canceled"),
        "unknown-request",
    );
    check(
        &mut bridge,
        &note("n1", "web", "design").set("correlatesTo", "nope"),
        "unknown-request",
    );
    // A note or response naming a note or a response is no better.
    bridge.ok(&note("n2", "web", "design"));
    bridge.ok(&response("p3", "web", "design", "r1", "working"));
    check(
        &mut bridge,
        &response("p4", "web", "design", "n2", "completed"),
        "unknown-request",
    );
    check(
        &mut bridge,
        &response("p5", "web", "design", "p3", "completed"),
        "unknown-request",
    );
    check(
        &mut bridge,
        &note("n3", "web", "design").set("correlatesTo", "p3"),
        "unknown-request",
    );
    // A note about nothing in particular is fine.
    check(&mut bridge, &note("n4", "web", "design"), OK);
}

#[test]
fn senders_loops_and_borrowed_names() {
    let mut bridge = asked();
    let table = [
        (note("a1", "stranger", "web"), "unknown-sender"),
        (request("a2", "stranger", "web"), "unknown-sender"),
        // A config loop sends notes only.
        (note("a3", "review-loop", "web"), OK),
        (
            note("a4", "review-loop", "web").set("correlatesTo", "r1"),
            OK,
        ),
        (request("a5", "review-loop", "web"), "bad-field"),
        (
            response("a6", "review-loop", "design", "r1", "completed"),
            "bad-field",
        ),
        // The built-in loops' names and reserved ids belong to the judge.
        (note("a7", "bridge", "web"), "borrowed-name"),
        (
            note("a8", "debt-loop", "web").set("correlatesTo", "r1"),
            "borrowed-name",
        ),
        (note("a9", "report-loop", "human"), "borrowed-name"),
        (note("web:1", "web", "design"), "borrowed-name"),
        (request("ring:r1.0.1", "design", "web"), "borrowed-name"),
        (
            response("x:y", "web", "design", "r1", "completed"),
            "borrowed-name",
        ),
    ];
    for (m, expected) in &table {
        check(&mut bridge, m, expected);
    }
    assert_eq!(bridge.state("r1"), State::Submitted);
}

#[test]
fn the_judges_own_lines_may_use_reserved_names() {
    let mut bridge = asked();
    for id in ["notice-1", "ring:r1:0:1", "web:1", "report:2026-09-03"] {
        bridge.own.insert(id.to_owned());
    }
    check(&mut bridge, &note("notice-1", "bridge", "web"), OK);
    // A ring: a note from debt-loop about the request, which leaves its clock alone.
    let t0 = bridge.ledger.request("r1").unwrap().state_since;
    check(
        &mut bridge,
        &note("ring:r1:0:1", "debt-loop", "web").set("correlatesTo", "r1"),
        OK,
    );
    assert_eq!(bridge.ledger.request("r1").unwrap().state_since, t0);
    check(&mut bridge, &note("web:1", "web", "design"), OK);
    check(
        &mut bridge,
        &note("report:2026-09-03", "report-loop", "human"),
        OK,
    );
    // The journal's say-so covers only the ids it wrote.
    check(
        &mut bridge,
        &note("notice-2", "bridge", "web"),
        "borrowed-name",
    );
    check(
        &mut bridge,
        &note("web:2", "web", "design"),
        "borrowed-name",
    );
    // The judge's own retry is a duplicate like anyone's.
    check(&mut bridge, &note("notice-1", "bridge", "web"), "duplicate");
}

// ---- precedence between the stateful reasons ---------------------------------------------

#[test]
#[allow(clippy::too_many_lines)] // one row per case reads best as one table
fn precedence() {
    let mut bridge = asked();
    bridge.ok(&note("used", "web", "design"));
    bridge.own.insert("bridge:1".to_owned());
    bridge.ok(&note("bridge:1", "bridge", "web"));
    bridge.own.remove("bridge:1"); // from now on, a line with this id is a forgery
    bridge.ok(&request("r2", "web", "ci").set("contextId", "t2"));
    bridge.ok(&response("c2", "ci", "web", "r2", "completed"));

    let table = [
        // The stateless reasons come before every stateful one.
        (
            "web",
            request("a0", "stranger", "ci").unset("createdAt"),
            "missing-field",
        ),
        (
            "web",
            note("used", "bridge", "ci").set("priority", 7),
            "bad-field",
        ),
        (
            "web",
            msg("response", "a:0", "stranger", "ci").set("state", "completed"),
            "response-without-correlation",
        ),
        // misaddressed > unknown-sender (the owner, and the other party of a request).
        ("web", request("a1", "stranger", "ci"), "misaddressed"),
        (
            "human",
            response("a2", "stranger", "human", "r1", "completed"),
            "misaddressed",
        ),
        // unknown-sender > borrowed-name, id-reused, unknown-request.
        ("web", note("a:3", "stranger", "web"), "unknown-sender"),
        ("web", note("used", "stranger", "web"), "unknown-sender"),
        (
            "design",
            response("a4", "stranger", "design", "nope", "completed"),
            "unknown-sender",
        ),
        (
            "design",
            response("a5", "stranger", "design", "r1", "completed"),
            "unknown-sender",
        ),
        // A loop's request (bad-field) > borrowed-name.
        ("web", request("a:6", "review-loop", "web"), "bad-field"),
        // borrowed-name > id-reused.
        ("web", note("used", "bridge", "web"), "borrowed-name"),
        (
            "web",
            note("bridge:1", "bridge", "web").text("forged"),
            "borrowed-name",
        ),
        ("design", note("bridge:1", "web", "design"), "borrowed-name"),
        // borrowed-name > unknown-request.
        (
            "design",
            response("a:7", "web", "design", "nope", "completed"),
            "borrowed-name",
        ),
        // id-reused > unknown-request > not-addressee.
        (
            "design",
            response("used", "web", "design", "nope", "completed"),
            "id-reused",
        ),
        (
            "design",
            response("a8", "ci", "design", "nope", "completed"),
            "unknown-request",
        ),
        // not-addressee > request-closed > bad-transition > context-mismatch.
        (
            "web",
            response("a9", "design", "web", "r2", "completed"),
            "not-addressee",
        ),
        (
            "ci",
            response("a10", "web", "ci", "r2", "completed").set("contextId", "zzz"),
            "not-addressee",
        ),
        (
            "ci",
            response("a11", "web", "ci", "r2", "working").set("contextId", "zzz"),
            "request-closed",
        ),
        (
            "web",
            response("a12", "ci", "web", "r2", "canceled").set("contextId", "zzz"),
            "request-closed",
        ),
        (
            "design",
            response("a13", "web", "design", "r1", "canceled").set("contextId", "zzz"),
            "bad-transition",
        ),
        (
            "web",
            response("a14", "design", "web", "r1", "working").set("contextId", "zzz"),
            "bad-transition",
        ),
        (
            "design",
            response("a15", "web", "design", "r1", "working").set("contextId", "zzz"),
            "context-mismatch",
        ),
    ];
    for (owner, m, expected) in &table {
        check_in(&mut bridge, owner, m, expected);
    }
    assert_eq!(bridge.state("r1"), State::Submitted);
    assert_eq!(bridge.state("r2"), State::Completed);
}

#[test]
fn only_accepted_lines_claim_ids() {
    let mut bridge = asked();
    check(
        &mut bridge,
        &response("p1", "web", "design", "r1", "canceled"),
        BT,
    );
    // The refused line's id is still free, for any content.
    check(
        &mut bridge,
        &response("p1", "web", "design", "r1", "working"),
        OK,
    );
    check_in(
        &mut bridge,
        "ci",
        &note("n1", "web", "design"),
        "misaddressed",
    );
    check(&mut bridge, &note("n1", "web", "ci").text("other text"), OK);
}

/// The history behind an archive: the lines a ledger handed over, asked by key.
#[derive(Debug)]
struct Shelf(std::sync::Mutex<Ledger>);

impl doorbell_core::Archive for Shelf {
    fn claim(&self, id: &str) -> Option<u64> {
        self.0.lock().unwrap().fingerprint_of(id)
    }
    fn request(&self, id: &str) -> Option<doorbell_core::Request> {
        Some(self.0.lock().unwrap().request(id)?.into_owned())
    }
}

/// A ledger whose history is in its archive starts with nothing in memory, judges exactly as
/// the ledger that holds everything, and lets go of what the archive has once it is saved.
#[test]
fn a_ledger_over_its_archive_judges_as_the_whole_one() {
    let mut bridge = asked();
    bridge.ok(&request("r2", "web", "design"));
    bridge.ok(&note("n1", "design", "web"));
    bridge.ok(&response("a1", "web", "design", "r1", "working"));
    bridge.ok(&response("a2", "design", "web", "r2", "completed"));
    let whole = std::mem::take(&mut bridge.ledger);
    bridge.ledger = Ledger::with_archive(Box::new(Shelf(std::sync::Mutex::new(whole))));
    assert_eq!(bridge.ledger.len(), 0, "memory starts empty");
    assert_eq!(bridge.ledger.requests().count(), 0);
    for id in ["r1", "r2", "n1", "a1", "a2"] {
        assert!(bridge.ledger.is_claimed(id), "{id}");
    }
    assert!(!bridge.ledger.is_claimed("r3"));
    check(&mut bridge, &request("r1", "design", "web"), "duplicate");
    check(
        &mut bridge,
        &request("r1", "design", "web").text("another"),
        "id-reused",
    );
    check(
        &mut bridge,
        &response("a3", "web", "design", "r2", "working"),
        "request-closed",
    );
    // An open request from the archive comes into memory when it changes.
    check(
        &mut bridge,
        &response("a4", "web", "design", "r1", "completed"),
        OK,
    );
    assert_eq!(bridge.state("r1").as_str(), "completed");
    let changes = bridge.ledger.take_changes();
    let ids: Vec<&str> = changes.requests.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["r1"]);
    assert_eq!(bridge.ledger.len(), 1, "a4's claim waits for the save");
    bridge.ledger.saved(changes.seq);
    assert_eq!(bridge.ledger.len(), 0, "saved claims leave memory");
    assert_eq!(
        bridge.ledger.requests().count(),
        0,
        "a closed request leaves memory once saved"
    );
    assert!(bridge.ledger.take_changes().requests.is_empty());
}

/// A change set is what the requests were when it was taken: it is saved on another thread
/// while judging goes on, and a response judged meanwhile changes the next set, not it.
#[test]
fn a_change_set_keeps_what_it_was_given_while_the_ledger_moves_on() {
    let mut bridge = asked();
    let changes = bridge.ledger.take_changes();
    let taken: Vec<(&str, &str)> = changes
        .requests
        .iter()
        .map(|r| (r.id.as_str(), r.state.as_str()))
        .collect();
    assert_eq!(taken, [("r1", "submitted")]);
    bridge.ok(&response("a1", "web", "design", "r1", "completed"));
    assert_eq!(changes.requests[0].state.as_str(), "submitted");
    assert_eq!(changes.requests[0].responses, 0);
    let next = bridge.ledger.take_changes();
    assert_eq!(next.requests[0].state.as_str(), "completed");
}
