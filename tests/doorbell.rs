//! Debts and the doorbell end to end: the real daemon rings unanswered requests on a
//! second-scale schedule, escalates once, survives SIGKILL without repeating or skipping a
//! ring, announces the daily report once, and the commands that answer and inspect debts.
//! Every wait is on a condition with a deadline; "nothing more happened" is proved by waiting
//! for a later event of the same schedule, never by sleeping.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use crate::util::{Bridge, Daemon};

const PATIENCE: Duration = Duration::from_secs(20);

/// Scheduling slack: a ring may be this late (the daemon wakes, judges, writes)...
const LATE_MS: i64 = 1000;
/// ...but never early beyond clock rounding.
const EARLY_MS: i64 = 100;

// ---------------------------------------------------------------------------------------------
// Helpers. They read complete lines and records only: the judge may be mid-append.

/// A bridge with these agents' inboxes, in memory. These tests measure a second-scale
/// schedule; the daemon's periodic checkpoint fsyncs on the judging thread, and on a disk busy
/// with other tests' fsyncs (the crash torture) one checkpoint was measured at 19 s, delaying a
/// due ring by as much.
fn bridge(names: &[&str]) -> Bridge {
    let bridge = Bridge::in_memory();
    for name in names {
        bridge.doorbell(&["agent", "add", name]).ok();
    }
    bridge
}

/// A config with this `[debts]` schedule, written beside the bridge; its path.
fn config(bridge: &Bridge, ring_after: &str, backoff: f64, max_rings: u32) -> String {
    let path = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(
        &path,
        format!(
            "[debts]\nring_after = \"{ring_after}\"\nbackoff = {backoff:?}\nmax_rings = {max_rings}\nstalled_after = \"1s\"\n"
        ),
    )
    .unwrap();
    path.to_str().unwrap().to_owned()
}

/// The complete lines of `bytes`, parsed.
fn parse_complete(bytes: &[u8]) -> Vec<Value> {
    let end = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |e| e + 1);
    bytes[..end]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

/// Every complete message in `name`'s inbox, in file order.
fn messages(bridge: &Bridge, name: &str) -> Vec<Value> {
    parse_complete(&std::fs::read(bridge.inbox(name)).unwrap())
}

/// The ids of the lines the doorbell loop wrote to `name` about `request`, in file order.
fn loop_notes(bridge: &Bridge, name: &str, request: &str) -> Vec<String> {
    messages(bridge, name)
        .into_iter()
        .filter(|m| m["from"] == "debt-loop" && m["correlatesTo"] == request)
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

/// The message with `id` in `name`'s inbox.
#[track_caller]
fn message(bridge: &Bridge, name: &str, id: &str) -> Value {
    messages(bridge, name)
        .into_iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {name}'s inbox"))
}

/// The journal's complete records.
fn records(bridge: &Bridge) -> Vec<Value> {
    parse_complete(&std::fs::read(bridge.dir().join(".doorbell/journal.jsonl")).unwrap_or_default())
}

/// The judge's `seenAt` (ms) of the accepted line `id`.
fn accepted_at(bridge: &Bridge, id: &str) -> Option<i64> {
    records(bridge)
        .into_iter()
        .find(|r| r["v"] == "a" && r["a"]["id"] == id)
        .map(|r| r["t"].as_i64().unwrap())
}

/// The time (ms) the judge journaled its intent to write `id`.
fn intended_at(bridge: &Bridge, id: &str) -> Option<i64> {
    records(bridge)
        .into_iter()
        .find(|r| r["v"] == "i" && r["id"] == id)
        .map(|r| r["t"].as_i64().unwrap())
}

/// When the schedule counts ring `id` as rung (ms): its intent, or when the judge read it
/// back from the debtor's inbox if that was later. The next step counts from then
/// (`Ledger::ring_arrived`): a ring read back late (held back by a locked inbox, or read back
/// only by the judge restarted after a kill) moves the next step as late.
fn rung_at(bridge: &Bridge, id: &str) -> i64 {
    let intended = intended_at(bridge, id).unwrap_or_else(|| panic!("no intent of {id}"));
    let accepted = accepted_at(bridge, id).unwrap_or_else(|| panic!("{id} not judged"));
    intended.max(accepted)
}

/// Whether the judge has journaled any intent to ring or escalate `request`.
fn intends_for(bridge: &Bridge, request: &str) -> usize {
    records(bridge)
        .into_iter()
        .filter(|r| r["v"] == "i" && r["rg"]["rq"] == request)
        .count()
}

/// How often each id occurs in `name`'s inbox.
fn id_counts(bridge: &Bridge, name: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for m in messages(bridge, name) {
        *counts
            .entry(m["id"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    counts
}

/// `from` asks `to`; the new request's id.
fn request(bridge: &Bridge, from: &str, to: &str, text: &str) -> String {
    bridge
        .doorbell(&[
            "send", "--to", to, "--from", from, "--kind", "request", text,
        ])
        .ok()
        .trim()
        .to_owned()
}

/// The hash part of a request's ring ids, taken from a ring id `ring:<hash>:<epoch>:<n>`.
#[track_caller]
fn hash_of(ring_id: &str) -> String {
    let parts: Vec<&str> = ring_id.split(':').collect();
    assert_eq!(parts.len(), 4, "ring id {ring_id}");
    assert_eq!(parts[0], "ring", "ring id {ring_id}");
    assert_eq!(parts[1].len(), 16, "ring id {ring_id}");
    assert!(
        parts[1].bytes().all(|b| b.is_ascii_hexdigit()),
        "ring id {ring_id}"
    );
    parts[1].to_owned()
}

/// Wait until the doorbell wrote `count` notes about `request` to `name`; their ids.
#[track_caller]
fn wait_notes(bridge: &Bridge, name: &str, request: &str, count: usize) -> Vec<String> {
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        bridge.wait_for(
            PATIENCE,
            &format!("{count} doorbell notes about {request} in {name}'s inbox"),
            |b| loop_notes(b, name, request).len() >= count,
        );
    }));
    if let Err(panic) = waited {
        eprintln!("{}", dump(bridge));
        std::panic::resume_unwind(panic);
    }
    loop_notes(bridge, name, request)
}

/// What the bridge holds, for a failure message.
fn dump(bridge: &Bridge) -> String {
    let mut out = String::new();
    for entry in std::fs::read_dir(bridge.dir()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(agent) = name.strip_suffix("-inbox.jsonl") {
            let _ = writeln!(out, "{name}:");
            for m in messages(bridge, agent) {
                let _ = writeln!(out, "  {} {} {}", m["id"], m["from"], m["kind"]);
            }
        }
    }
    let status = bridge.doorbell(&["status", "--json"]);
    let _ = writeln!(out, "status: {} {}", status.stdout, status.stderr);
    out.push_str("journal:\n");
    let journal =
        std::fs::read_to_string(bridge.dir().join(".doorbell/journal.jsonl")).unwrap_or_default();
    for line in journal.lines() {
        let _ = writeln!(out, "  {}", line.chars().take(200).collect::<String>());
    }
    out
}

/// Wait until the judge has accepted the line `id`.
#[track_caller]
fn wait_accepted(bridge: &Bridge, id: &str) -> i64 {
    bridge.wait_for(PATIENCE, &format!("{id} accepted"), |b| {
        accepted_at(b, id).is_some()
    });
    accepted_at(bridge, id).unwrap()
}

/// Assert that `later - earlier` is `expected` ms, late by at most the slack.
#[track_caller]
fn assert_spacing(what: &str, earlier: i64, later: i64, expected: i64) {
    let gap = later - earlier;
    assert!(
        gap >= expected - EARLY_MS && gap <= expected + LATE_MS,
        "{what}: {gap} ms apart, expected {expected} ms (-{EARLY_MS}/+{LATE_MS})"
    );
}

/// Check a ring line: a note from the doorbell loop to `to` about `request`.
#[track_caller]
fn assert_ring(ring: &Value, to: &str, request: &str, n: u32, of: u32, answer_state: &str) {
    assert_eq!(ring["from"], "debt-loop", "{ring}");
    assert_eq!(ring["to"], to, "{ring}");
    assert_eq!(ring["kind"], "note", "{ring}");
    assert_eq!(ring["correlatesTo"], request, "{ring}");
    assert!(ring.get("state").is_none(), "a note has no state: {ring}");
    let text = ring["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(text.contains(&format!("Ring {n} of {of}.")), "{text}");
    assert!(
        text.contains(&format!(
            "Answer with: doorbell reply {request} --state {answer_state}"
        )),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 1. The ring sequence.

#[test]
fn an_unanswered_request_rings_twice_then_escalates_once_then_stays_quiet() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "2s", 1.5, 2);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let id = request(&bridge, "design", "web", "the header colour?");

    // Ring 1, alone: ring 2 is three seconds away.
    let rings = wait_notes(&bridge, "web", &id, 1);
    assert_eq!(rings.len(), 1, "{rings:?}");
    let hash = hash_of(&rings[0]);
    assert_eq!(rings[0], format!("ring:{hash}:0:1"));
    assert_ring(
        &message(&bridge, "web", &rings[0]),
        "web",
        &id,
        1,
        2,
        "completed",
    );
    assert!(loop_notes(&bridge, "human", &id).is_empty());

    // Ring 2, after ring 1 in the same inbox; still no escalation.
    let rings = wait_notes(&bridge, "web", &id, 2);
    assert_eq!(
        rings,
        [format!("ring:{hash}:0:1"), format!("ring:{hash}:0:2")],
        "rings in order"
    );
    assert_ring(
        &message(&bridge, "web", &rings[1]),
        "web",
        &id,
        2,
        2,
        "completed",
    );
    assert!(loop_notes(&bridge, "human", &id).is_empty());
    assert!(loop_notes(&bridge, "design", &id).is_empty());

    // One interval later: the escalation to the human station.
    let escalations = wait_notes(&bridge, "human", &id, 1);
    assert_eq!(escalations, [format!("escalation:{hash}:0")]);
    let escalation = message(&bridge, "human", &escalations[0]);
    assert_eq!(escalation["from"], "debt-loop");
    assert_eq!(escalation["to"], "human");
    assert_eq!(escalation["kind"], "note");
    assert_eq!(escalation["contextId"], id.as_str());
    let text = escalation["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(text.contains("rang twice"), "{text}");
    assert!(
        text.contains(&format!("web has owed design an answer on {id}")),
        "{text}"
    );

    // The rings were read back and accepted, each once, soon after they were intended.
    for ring in rings.iter().chain(&escalations) {
        let written = intended_at(&bridge, ring).unwrap();
        let seen = wait_accepted(&bridge, ring);
        assert!(seen >= written && seen - written <= LATE_MS, "{ring}");
    }
    // The spacing, on the judge's clock: R, R·b, R·b², each step from when the one before
    // was rung.
    let t0 = accepted_at(&bridge, &id).unwrap();
    assert_spacing(
        "request to ring 1",
        t0,
        intended_at(&bridge, &rings[0]).unwrap(),
        2000,
    );
    assert_spacing(
        "ring 1 to ring 2",
        rung_at(&bridge, &rings[0]),
        intended_at(&bridge, &rings[1]).unwrap(),
        3000,
    );
    assert_spacing(
        "ring 2 to the escalation",
        rung_at(&bridge, &rings[1]),
        intended_at(&bridge, &escalations[0]).unwrap(),
        4500,
    );

    // Nothing more: another request's ring 1 and ring 2 take longer than the interval the
    // first request's schedule would use next (R·b² = 4.5 s after the escalation).
    let other = request(&bridge, "design", "web", "and the footer?");
    wait_notes(&bridge, "web", &other, 2);
    assert_eq!(loop_notes(&bridge, "web", &id), rings);
    assert_eq!(loop_notes(&bridge, "human", &id), escalations);
    assert!(loop_notes(&bridge, "design", &id).is_empty());
    assert_eq!(intends_for(&bridge, &id), 3, "one intent per line written");
    for name in ["web", "human", "design"] {
        let twice: Vec<_> = id_counts(&bridge, name)
            .into_iter()
            .filter(|(_, n)| *n != 1)
            .collect();
        assert!(twice.is_empty(), "ids repeated in {name}: {twice:?}");
    }
}

/// A daemon on a schedule of `ring_after` and `max_rings` (backoff 1), design's request to
/// web accepted, then web's inbox locked as a hung process would hold it, until the file
/// returned is dropped; the daemon has said that it waits.
fn asked_and_locked(
    bridge: &Bridge,
    ring_after: &str,
    max_rings: u32,
) -> (Daemon, String, std::fs::File) {
    let config = config(bridge, ring_after, 1.0, max_rings);
    let mut daemon = Daemon::start(bridge, &["--config", &config]);
    let id = request(bridge, "design", "web", "the header colour?");
    wait_accepted(bridge, &id);
    let held = std::fs::OpenOptions::new()
        .read(true)
        .open(bridge.inbox("web"))
        .unwrap();
    held.lock().unwrap();
    daemon.expect_stderr("another process holds this inbox's lock", PATIENCE);
    (daemon, id, held)
}

/// The rings beside a debt are its debtor's, since the debt last changed hands: web asks
/// design a question (input-required), design is rung for it, then gives its input
/// (`working`): web owes again, rung not once yet. `debts`, `show` and the report said the
/// request's rings of its whole life, design's among them.
#[test]
fn the_rings_beside_a_debt_are_its_debtors_since_it_last_changed() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "2s", 1.0, 3);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let id = request(&bridge, "design", "web", "the header colour?");
    wait_accepted(&bridge, &id);
    bridge.reply(&id, "web", "input-required", &[], "which page?");
    wait_notes(&bridge, "design", &id, 1);
    bridge.reply(&id, "design", "working", &[], "the landing page");
    let debts: Value = serde_json::from_str(
        bridge
            .doorbell(&["debts", "--json", "--config", &config])
            .ok(),
    )
    .unwrap();
    let shown = bridge.doorbell(&["show", &id, "--config", &config]);
    // Read after: a ring written to web meanwhile is counted, and none is claimed that
    // was not written.
    let web_rung = loop_notes(&bridge, "web", &id).len();
    assert_eq!(debts["debts"][0]["debtor"], "web", "{debts}");
    let rings = debts["debts"][0]["rings"].as_u64().unwrap();
    assert!(
        rings as usize <= web_rung,
        "{debts}: web rung {web_rung} times"
    );
    assert!(
        shown.ok().contains("web owes design since")
            && shown.ok().contains(&format!("({rings} ring")),
        "{shown:?}"
    );
    assert!(
        shown.ok().contains("in all)"),
        "the request's rings of its whole life are said too: {shown:?}"
    );
    // Once web is rung, the report (the debt stalled by then) counts that ring, not design's.
    wait_notes(&bridge, "web", &id, 1);
    let report: Value = serde_json::from_str(
        bridge
            .doorbell(&["report", "--format", "json", "--config", &config])
            .ok(),
    )
    .unwrap();
    let web_rung = loop_notes(&bridge, "web", &id).len();
    let stalled = report["stalled"][0][1][0]["rings"].as_u64().unwrap();
    assert!(
        stalled >= 1 && stalled as usize <= web_rung,
        "{report}: web rung {web_rung} times"
    );
}

/// The debtor's inbox is locked by a hung process, so ring 1 cannot be written. No ring 2
/// piles up behind it; when ring 2 was due, the human is told instead, with the truth: no
/// ring written yet. Once the lock goes, ring 1 is written, ring 2 one interval after it,
/// and nothing is escalated twice.
#[test]
fn rings_wait_for_the_ring_a_locked_inbox_has_not_got_and_do_not_pile_up() {
    let bridge = bridge(&["web", "design", "ops", "human"]);
    let (_daemon, id, held) = asked_and_locked(&bridge, "1s", 2);
    let escalations = wait_notes(&bridge, "human", &id, 1);
    let text = message(&bridge, "human", &escalations[0])["message"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("has not been rung: ring 1 could not be written to its inbox yet"),
        "{text}"
    );
    // A later request to ops, on the same schedule: by its escalation, the first request's
    // ring 2 was due long ago, had ring 1 been counted as written.
    let other = request(&bridge, "design", "ops", "the footer?");
    wait_notes(&bridge, "human", &other, 1);
    assert!(loop_notes(&bridge, "web", &id).is_empty());
    assert_eq!(
        intends_for(&bridge, &id),
        2,
        "ring 1 and the escalation: {}",
        dump(&bridge)
    );
    drop(held);
    let rings = wait_notes(&bridge, "web", &id, 2);
    let hash = hash_of(&rings[0]);
    assert_eq!(
        rings,
        [format!("ring:{hash}:0:1"), format!("ring:{hash}:0:2")],
        "{}",
        dump(&bridge)
    );
    let first = wait_accepted(&bridge, &rings[0]);
    let second = wait_accepted(&bridge, &rings[1]);
    assert!(
        second - first >= 1000 - EARLY_MS,
        "ring 2 {} ms after ring 1 was written",
        second - first
    );
    // Nothing more for it: ops' next request rings twice and escalates meanwhile.
    let third = request(&bridge, "design", "ops", "and the logo?");
    wait_notes(&bridge, "human", &third, 1);
    assert_eq!(loop_notes(&bridge, "human", &id), escalations);
    assert_eq!(intends_for(&bridge, &id), 3, "{}", dump(&bridge));
    assert_eq!(loop_notes(&bridge, "web", &id), rings);
}

// ---------------------------------------------------------------------------------------------
// 2. Answers move the doorbell.

#[test]
#[allow(clippy::too_many_lines)] // one story, step by step
fn answers_start_new_epochs_ring_the_right_side_and_completion_stops_the_rings() {
    let bridge = bridge(&["web", "design", "human"]);
    // One ring per epoch, then the escalation 3 s later.
    let config = config(&bridge, "2s", 1.5, 1);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let asked = request(&bridge, "design", "web", "the header colour?");
    let to_human = request(&bridge, "design", "human", "may we ship?");
    // The control: the same schedule, owed by web, sent after the human's.
    let control = request(&bridge, "design", "web", "the logo?");

    let first = wait_notes(&bridge, "web", &asked, 1);
    let hash = hash_of(&first[0]);
    assert_eq!(first, [format!("ring:{hash}:0:1")]);

    // `working` starts epoch 1: its ring 1 carries the new epoch.
    let working = bridge
        .doorbell(&[
            "reply", &asked, "--state", "working", "--from", "web", "on it",
        ])
        .ok()
        .trim()
        .to_owned();
    let working_at = wait_accepted(&bridge, &working);
    let rings = wait_notes(&bridge, "web", &asked, 2);
    assert_eq!(
        rings,
        [format!("ring:{hash}:0:1"), format!("ring:{hash}:1:1")]
    );
    assert_ring(
        &message(&bridge, "web", &rings[1]),
        "web",
        &asked,
        1,
        1,
        "completed",
    );
    // The new epoch's clock starts at the answer, not at the old ring.
    assert_spacing(
        "working to its ring 1",
        working_at,
        intended_at(&bridge, &rings[1]).unwrap(),
        2000,
    );

    // `input-required`: now the requester owes, and the doorbell rings design, not web.
    let question = bridge
        .doorbell(&[
            "reply",
            &asked,
            "--state",
            "input-required",
            "--from",
            "web",
            "which shade of blue?",
        ])
        .ok()
        .trim()
        .to_owned();
    wait_accepted(&bridge, &question);
    let to_design = wait_notes(&bridge, "design", &asked, 1);
    assert_eq!(to_design, [format!("ring:{hash}:2:1")]);
    let ring = message(&bridge, "design", &to_design[0]);
    assert_ring(&ring, "design", &asked, 1, 1, "working");
    let text = ring["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(&format!(
            "web is waiting for you on {asked} (input-required)"
        )),
        "{text}"
    );
    assert_eq!(
        loop_notes(&bridge, "web", &asked),
        rings,
        "web is not rung in epoch 2"
    );

    // The human is rung like anyone, but never escalated: the control, with the same
    // schedule and sent just after, is escalated once its escalation is judged (in the same
    // pass the human's request would have been, its time being no later).
    let human_rings = wait_notes(&bridge, "human", &to_human, 1);
    let human_hash = hash_of(&human_rings[0]);
    assert_eq!(human_rings, [format!("ring:{human_hash}:0:1")]);
    assert_ring(
        &message(&bridge, "human", &human_rings[0]),
        "human",
        &to_human,
        1,
        1,
        "completed",
    );
    let control_ring = wait_notes(&bridge, "web", &control, 1);
    let control_escalation = format!("escalation:{}:0", hash_of(&control_ring[0]));
    wait_accepted(&bridge, &control_escalation);
    assert_eq!(loop_notes(&bridge, "human", &control), [control_escalation]);
    assert_eq!(
        loop_notes(&bridge, "human", &to_human),
        human_rings,
        "a debt the human owes is rung, never escalated"
    );

    // `completed` ends it: no ring, no escalation for it afterwards. Proof that time passed:
    // a fresh request gets its ring and its escalation (2 s + 3 s), longer than any interval
    // the answered request's schedule had.
    let done = bridge
        .doorbell(&[
            "reply",
            &asked,
            "--state",
            "completed",
            "--from",
            "web",
            "navy",
        ])
        .ok()
        .trim()
        .to_owned();
    wait_accepted(&bridge, &done);
    let later = request(&bridge, "design", "web", "the favicon?");
    let later_ring = wait_notes(&bridge, "web", &later, 1);
    wait_accepted(
        &bridge,
        &format!("escalation:{}:0", hash_of(&later_ring[0])),
    );
    assert_eq!(loop_notes(&bridge, "web", &asked), rings);
    assert_eq!(loop_notes(&bridge, "design", &asked), to_design);
    assert!(
        loop_notes(&bridge, "human", &asked).is_empty(),
        "answered in time in every epoch: never escalated"
    );
    assert_eq!(loop_notes(&bridge, "human", &to_human), human_rings);
    assert_eq!(intends_for(&bridge, &asked), 3);
}

// ---------------------------------------------------------------------------------------------
// 3. Crash safety.

/// Every doorbell id in the bridge, with how often it occurs across all inboxes.
fn loop_id_counts(bridge: &Bridge, names: &[&str]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for name in names {
        for (id, n) in id_counts(bridge, name) {
            if id.starts_with("ring:") || id.starts_with("escalation:") {
                *counts.entry(id).or_insert(0) += n;
            }
        }
    }
    counts
}

#[test]
fn a_killed_daemon_neither_repeats_nor_skips_a_ring() {
    let names = ["web", "design", "human"];
    let bridge = bridge(&names);
    let config = config(&bridge, "2s", 1.5, 2);
    let daemon = Daemon::start(&bridge, &["--config", &config]);
    let id = request(&bridge, "design", "web", "the header colour?");

    // Kill between two rings: ring 1 written and judged, ring 2 due 3 s later.
    let rings = wait_notes(&bridge, "web", &id, 1);
    let hash = hash_of(&rings[0]);
    let first_ring = format!("ring:{hash}:0:1");
    let second_ring = format!("ring:{hash}:0:2");
    let escalation = format!("escalation:{hash}:0");
    assert_eq!(rings, std::slice::from_ref(&first_ring));
    wait_accepted(&bridge, &first_ring);
    daemon.kill();
    assert_eq!(
        loop_notes(&bridge, "web", &id),
        std::slice::from_ref(&first_ring),
        "ring 2 was not due yet"
    );

    // Restart: ring 1 is not repeated; ring 2 comes on time. Kill the moment it appears.
    let mut daemon = Daemon::start(&bridge, &["--config", &config]);
    let mut judged_at_kill = None;
    bridge.wait_for(PATIENCE, "ring 2 in web's inbox", |b| {
        let seen = loop_notes(b, "web", &id).len() >= 2;
        if seen {
            let _ = daemon.child.kill();
            judged_at_kill = Some(accepted_at(b, &second_ring).is_some());
        }
        seen
    });
    daemon.kill();
    assert_eq!(
        loop_notes(&bridge, "web", &id),
        [first_ring.clone(), second_ring.clone()]
    );
    assert_spacing(
        "ring 1 to ring 2 across a restart",
        rung_at(&bridge, &first_ring),
        intended_at(&bridge, &second_ring).unwrap(),
        3000,
    );

    // Restart: ring 2 is not repeated and the escalation after it is not skipped.
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let escalations = wait_notes(&bridge, "human", &id, 1);
    assert_eq!(escalations, std::slice::from_ref(&escalation));
    wait_accepted(&bridge, &escalation);
    wait_accepted(&bridge, &second_ring);
    // Ring 2 is read back by the restarted judge when the killed one had not judged it: the
    // escalation counts from then, however long the kill and the restart took.
    assert_spacing(
        "ring 2 to the escalation across a restart",
        rung_at(&bridge, &second_ring),
        intended_at(&bridge, &escalation).unwrap(),
        4500,
    );
    let counts = loop_id_counts(&bridge, &names);
    let expected: BTreeMap<String, usize> = [(first_ring, 1), (second_ring, 1), (escalation, 1)]
        .into_iter()
        .collect();
    assert_eq!(
        counts, expected,
        "each ring exactly once (ring 2 was judged before the kill: {judged_at_kill:?})"
    );
    let text = message(&bridge, "human", &escalations[0])["message"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(text.contains("rang twice"), "{text}");
}

#[test]
fn a_daemon_killed_as_it_journals_a_ring_writes_that_ring_once() {
    let names = ["web", "design", "human"];
    let bridge = bridge(&names);
    let config = config(&bridge, "1s", 1.5, 2);
    let id = request(&bridge, "design", "web", "the header colour?");
    let mut daemon = Daemon::start(&bridge, &["--config", &config]);

    // Kill the moment each intent is in the journal: its line may or may not be written yet.
    let mut written_at_kill = Vec::new();
    for n in 1..=2 {
        bridge.wait_for(PATIENCE, &format!("the intent of ring {n}"), |b| {
            let seen = intends_for(b, &id) >= n;
            if seen {
                let _ = daemon.child.kill();
                written_at_kill.push(loop_notes(b, "web", &id).len());
            }
            seen
        });
        daemon.kill();
        daemon = Daemon::start(&bridge, &["--config", &config]);
    }
    let escalations = wait_notes(&bridge, "human", &id, 1);
    let hash = escalations[0].split(':').nth(1).unwrap().to_owned();
    assert_eq!(escalations, [format!("escalation:{hash}:0")]);
    wait_accepted(&bridge, &escalations[0]);
    let rings = loop_notes(&bridge, "web", &id);
    assert_eq!(
        rings,
        [format!("ring:{hash}:0:1"), format!("ring:{hash}:0:2")],
        "lines seen at each kill: {written_at_kill:?}"
    );
    let counts = loop_id_counts(&bridge, &names);
    assert!(
        counts.values().all(|&n| n == 1) && counts.len() == 3,
        "each ring exactly once: {counts:?}"
    );
    for ring in &rings {
        wait_accepted(&bridge, ring);
    }
    daemon.kill();
}

// ---------------------------------------------------------------------------------------------
// 4. The daily report.

/// Run `report --daily`; the report's path and date.
fn daily(bridge: &Bridge) -> (std::path::PathBuf, String) {
    let path = std::path::PathBuf::from(bridge.doorbell(&["report", "--daily"]).ok().trim());
    assert_eq!(
        path.parent().unwrap(),
        bridge.dir().join("reports"),
        "{}",
        path.display()
    );
    let date = path.file_stem().unwrap().to_str().unwrap().to_owned();
    assert!(
        chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d").is_ok(),
        "{date}"
    );
    (path, date)
}

/// The report's summary: its first line after the title, which must be bold.
#[track_caller]
fn summary(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    assert!(lines.next().unwrap().starts_with("# "), "{text}");
    let first = lines.next().unwrap();
    let bold = first
        .strip_prefix("**")
        .and_then(|l| l.strip_suffix("**"))
        .unwrap_or_else(|| panic!("the first line is not bold: {first:?}\n{text}"));
    assert!(!bold.trim().is_empty(), "{text}");
    bold.to_owned()
}

/// The report notes in the human's inbox, and checks of the one for `date`.
#[track_caller]
fn report_notes(bridge: &Bridge, date: &str, summary: &str) -> usize {
    let id = format!("report:{date}");
    let notes: Vec<Value> = messages(bridge, "human")
        .into_iter()
        .filter(|m| m["id"] == id.as_str())
        .collect();
    for note in &notes {
        assert_eq!(note["from"], "report-loop", "{note}");
        assert_eq!(note["to"], "human", "{note}");
        assert_eq!(note["kind"], "note", "{note}");
        let text = note["message"]["parts"][0]["text"].as_str().unwrap();
        assert!(text.contains(summary), "{text}");
    }
    notes.len()
}

#[test]
fn the_daily_report_is_announced_once_by_the_running_daemon() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "1s", 1.5, 1);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let asked = request(&bridge, "design", "web", "the header colour?");
    wait_accepted(&bridge, &asked);

    let (path, date) = daily(&bridge);
    let id = format!("report:{date}");
    wait_accepted(&bridge, &id);
    let summary = summary(&path);
    let (again, again_date) = daily(&bridge);
    assert_eq!((&again, &again_date), (&path, &date));
    // The daemon saw the file replaced; prove it had time to act on it: a fresh request's
    // ring comes a second later.
    let later = request(&bridge, "design", "web", "the footer?");
    wait_notes(&bridge, "web", &later, 1);
    assert_eq!(report_notes(&bridge, &date, &summary), 1);
    assert_eq!(
        records(&bridge)
            .iter()
            .filter(|r| r["v"] == "a" && r["a"]["id"] == id.as_str())
            .count(),
        1
    );
}

#[test]
fn the_daily_report_is_announced_once_with_no_daemon() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "1s", 1.5, 1);
    // A daemon ran once and stopped cleanly: the report runs alone.
    let mut daemon = Daemon::start(&bridge, &["--config", &config]);
    let asked = request(&bridge, "design", "human", "may we ship?");
    wait_accepted(&bridge, &asked);
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(5)), Some(0));

    let (path, date) = daily(&bridge);
    let summary = summary(&path);
    assert_eq!(
        report_notes(&bridge, &date, &summary),
        1,
        "posted by the command"
    );
    let (again, _) = daily(&bridge);
    assert_eq!(again, path);
    assert_eq!(report_notes(&bridge, &date, &summary), 1, "posted once");
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(report_notes(&bridge, &date, &summary), 1);
    assert!(accepted_at(&bridge, &format!("report:{date}")).is_some());
}

// ---------------------------------------------------------------------------------------------
// 5. reply, cancel, show, debts, thread, wait.

/// Run a command that prints one JSON document.
#[track_caller]
fn json(bridge: &Bridge, args: &[&str]) -> Value {
    serde_json::from_str(bridge.doorbell(args).ok()).unwrap()
}

#[test]
#[allow(clippy::too_many_lines)] // one story, step by step
fn reply_cancel_show_debts_and_thread() {
    let bridge = bridge(&["web", "design", "human", "ops"]);
    // One ring per epoch, escalated 3 s after it.
    let config = config(&bridge, "1s", 3.0, 1);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let asked = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "--context-id",
            "header-thread",
            "the header colour?",
        ])
        .ok()
        .trim()
        .to_owned();
    let owed_by_design = request(&bridge, "web", "design", "the brand font?");
    let dropped = request(&bridge, "design", "web", "the old banner?");
    for id in [&asked, &owed_by_design, &dropped] {
        wait_accepted(&bridge, id);
    }
    let first = wait_notes(&bridge, "web", &asked, 1);
    let hash = hash_of(&first[0]);

    // reply fills the other party, the request and the thread.
    let working = bridge
        .doorbell(&[
            "reply", &asked, "--state", "working", "--from", "web", "on it",
        ])
        .ok()
        .trim()
        .to_owned();
    let line = message(&bridge, "design", &working);
    assert_eq!(line["from"], "web");
    assert_eq!(line["to"], "design");
    assert_eq!(line["kind"], "response");
    assert_eq!(line["state"], "working");
    assert_eq!(line["correlatesTo"], asked.as_str());
    assert_eq!(line["contextId"], "header-thread");
    assert_eq!(line["message"]["parts"][0]["text"], "on it");

    // Someone who is neither side may not answer.
    let stranger = bridge.doorbell(&[
        "reply",
        &asked,
        "--state",
        "completed",
        "--from",
        "ops",
        "not mine",
    ]);
    assert_eq!(stranger.code, 2, "{stranger:?}");
    assert!(
        stranger.stderr.contains("not a party"),
        "{}",
        stranger.stderr
    );
    for name in ["web", "design", "human", "ops"] {
        assert!(
            messages(&bridge, name).iter().all(|m| m["from"] != "ops"),
            "nothing from ops in {name}'s inbox"
        );
    }

    // The requester cancels: the debt is closed.
    let cancel = bridge
        .doorbell(&["cancel", &dropped, "--from", "design", "never mind"])
        .ok()
        .trim()
        .to_owned();
    let line = message(&bridge, "web", &cancel);
    assert_eq!(line["from"], "design");
    assert_eq!(line["to"], "web");
    assert_eq!(line["kind"], "response");
    assert_eq!(line["state"], "canceled");
    assert_eq!(line["correlatesTo"], dropped.as_str());
    assert_eq!(line["contextId"], dropped.as_str());
    wait_accepted(&bridge, &cancel);
    let shown = json(&bridge, &["show", &dropped, "--json"]);
    assert_eq!(shown["state"], "canceled", "{shown}");
    assert_eq!(shown["verdict"], "accepted", "{shown}");
    let waited = bridge.doorbell(&["wait", &dropped, "--timeout", "10s"]);
    assert_eq!(waited.code, 4, "{waited:?}");
    assert!(waited.stdout.contains("canceled"), "{}", waited.stdout);
    let cancel_again = bridge.doorbell(&["cancel", &dropped, "--from", "design"]);
    assert_eq!(cancel_again.code, 2, "a closed request: {cancel_again:?}");

    // Let the asked request's schedule run out: ring 1 of epoch 1, then its escalation.
    let ring = format!("ring:{hash}:1:1");
    let escalation = format!("escalation:{hash}:1");
    wait_accepted(&bridge, &ring);
    wait_accepted(&bridge, &escalation);

    let all = json(&bridge, &["debts", "--json"]);
    let listed: Vec<&str> = all["debts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["request"].as_str().unwrap())
        .collect();
    assert!(!listed.contains(&dropped.as_str()), "canceled: {all}");
    assert_eq!(listed.len(), 2, "{all}");
    let design_debt = all["debts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["request"] == owed_by_design.as_str())
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(design_debt["debtor"], "design");
    assert_eq!(design_debt["creditor"], "web");
    assert_eq!(design_debt["state"], "submitted");
    assert_eq!(design_debt["rings"], 1, "{design_debt}");

    let web = json(&bridge, &["debts", "--owed-by", "web", "--json"]);
    let debts = web["debts"].as_array().unwrap();
    assert_eq!(debts.len(), 1, "only web's debts: {web}");
    assert_eq!(debts[0]["request"], asked.as_str());
    assert_eq!(debts[0]["debtor"], "web");
    assert_eq!(debts[0]["creditor"], "design");
    assert_eq!(debts[0]["state"], "working");
    // One ring in each epoch: the heartbeat started the count again.
    assert_eq!(debts[0]["rings"], 1, "rings since the heartbeat: {web}");
    assert_eq!(debts[0]["ringsInAll"], 2, "one ring in each epoch: {web}");
    let none = json(&bridge, &["debts", "--owed-by", "ops", "--json"]);
    assert_eq!(none["debts"].as_array().unwrap().len(), 0, "{none}");

    // The thread: request, ring, response, ring, escalation, in the order they were judged.
    let thread: Vec<Value> = bridge
        .doorbell(&["thread", "header-thread", "--json"])
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        // The last line is the thread's trace.
        .filter(|m| m.get("trace").is_none())
        .collect();
    let order: Vec<(&str, &str)> = thread
        .iter()
        .map(|m| {
            (
                m["inbox"].as_str().unwrap(),
                m["envelope"]["id"].as_str().unwrap(),
            )
        })
        .collect();
    let ring0 = format!("ring:{hash}:0:1");
    assert_eq!(
        order,
        [
            ("web", asked.as_str()),
            ("web", ring0.as_str()),
            ("design", working.as_str()),
            ("web", ring.as_str()),
            ("human", escalation.as_str()),
        ]
    );

    // show: the request, its verdict, its thread; then answered.
    let shown = json(&bridge, &["show", &asked, "--json"]);
    assert_eq!(shown["state"], "working", "{shown}");
    assert_eq!(shown["thread"], "header-thread", "{shown}");
    assert_eq!(shown["inbox"], "web", "{shown}");
    assert_eq!(shown["envelope"]["id"], asked.as_str(), "{shown}");
    assert!(shown["deliveredAt"].is_string(), "{shown}");
    // A `working` is a first response, not the answer: the request is still owed.
    assert!(shown["firstResponseAt"].is_string(), "{shown}");
    assert!(shown["answeredAt"].is_null(), "{shown}");
    let done = bridge
        .doorbell(&[
            "reply",
            &asked,
            "--state",
            "completed",
            "--from",
            "web",
            "navy",
        ])
        .ok()
        .trim()
        .to_owned();
    assert_eq!(
        message(&bridge, "design", &done)["contextId"],
        "header-thread"
    );
    wait_accepted(&bridge, &done);
    let shown = json(&bridge, &["show", &asked, "--json"]);
    assert_eq!(shown["state"], "completed", "{shown}");
    assert!(shown["answeredAt"].is_string(), "{shown}");
    let web = json(&bridge, &["debts", "--owed-by", "web", "--json"]);
    assert_eq!(web["debts"].as_array().unwrap().len(), 0, "{web}");
    let waited = bridge.doorbell(&["wait", &asked, "--timeout", "10s"]);
    assert_eq!(waited.code, 0, "{waited:?}");
}

/// A loop's request answered with a question goes to the loop's owner: when the owner is the
/// human, `debts`, the report and the board all say the human owes it, and the board's
/// command is the one that pays it (`working`, the requester's side).
/// The report lists a request by the first line of its text that says something: one that
/// begins with a blank line is not listed with an empty text.
#[test]
fn the_report_lists_a_request_by_its_first_line_that_says_something() {
    let bridge = Bridge::with_agents(&["design", "human"]);
    let asked = bridge.request(
        "design",
        "human",
        "\n  \nPlease approve the August invoice\nit is attached",
    );
    let report: Value =
        serde_json::from_str(bridge.doorbell(&["report", "--format", "json"]).ok()).unwrap();
    assert_eq!(
        report["waitingOnHuman"][0]["id"],
        asked.as_str(),
        "{report}"
    );
    assert_eq!(
        report["waitingOnHuman"][0]["text"], "Please approve the August invoice",
        "{report}"
    );
    let text = bridge.doorbell(&["report"]);
    assert!(
        text.ok().contains("Please approve the August invoice"),
        "{text:?}"
    );
}

#[test]
fn a_question_on_a_loops_request_is_owed_by_its_owner_everywhere() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    bridge.config("[[loop]]\nname = \"nightly\"\nowner = \"human\"\n");
    let asked = bridge.request("nightly", "web", "approve the deploy?");
    bridge.reply(&asked, "web", "input-required", &[], "which environment?");
    let debts: Value = serde_json::from_str(
        bridge
            .doorbell(&["debts", "--owed-by", "human", "--json"])
            .ok(),
    )
    .unwrap();
    assert_eq!(debts["debts"][0]["request"], asked.as_str(), "{debts}");
    assert_eq!(debts["debts"][0]["debtor"], "human", "{debts}");
    let report: Value =
        serde_json::from_str(bridge.doorbell(&["report", "--format", "json"]).ok()).unwrap();
    assert_eq!(
        report["waitingOnHuman"][0]["id"],
        asked.as_str(),
        "{report}"
    );
    assert_eq!(report["stalled"], serde_json::json!([]), "{report}");
    let board = bridge.doorbell(&["status", "--format", "markdown"]);
    let line = board
        .ok()
        .lines()
        .find(|line| line.starts_with(&format!("- {asked}")))
        .unwrap_or_else(|| panic!("{asked} is not waiting on human: {}", board.stdout))
        .to_owned();
    assert!(line.contains("--state working"), "{line}");
    // A station heard from within the minute is "just now", as `status` says, not "0 s ago".
    let web = board
        .stdout
        .lines()
        .find(|l| l.starts_with("| web "))
        .unwrap();
    assert!(web.ends_with("| just now |"), "{web}");
}

/// A ring held back by a locked inbox is void once its debt is paid meanwhile: when the lock
/// goes, the debtor is not rung for an answer it already gave.
#[test]
fn a_ring_held_back_is_not_written_once_its_debt_is_paid() {
    let bridge = bridge(&["web", "design", "human"]);
    // Long enough for the lock to be taken before ring 1 falls due on a loaded machine.
    let (mut daemon, id, held) = asked_and_locked(&bridge, "5s", 3);
    bridge.reply(&id, "web", "completed", &[], "navy");
    let waited = bridge.doorbell(&["wait", &id, "--timeout", "60s"]);
    assert!(waited.ok().contains("completed"), "{}", waited.stdout);
    drop(held);
    daemon.expect_stderr("a ring that waited for its inbox is void", PATIENCE);
    assert!(
        loop_notes(&bridge, "web", &id).is_empty(),
        "rung after the answer: {}",
        dump(&bridge)
    );
}

/// A request's text in the report is data: terminal controls come out escaped, in the text
/// and markdown forms alike, and a long first line is cut.
#[test]
fn the_report_escapes_terminal_controls_and_cuts_long_lines() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    bridge.config("[debts]\nstalled_after = \"1s\"\n");
    let hostile = format!("\u{1b}[2J\u{1b}[31mpwned\u{7} {}", "x".repeat(3000));
    let id = bridge.request("human", "web", &hostile);
    bridge.reply(&id, "web", "input-required", &[], "which?");
    for format in ["text", "markdown"] {
        let report = bridge.doorbell(&["report", "--format", format]);
        let out = report.ok();
        assert!(out.contains(&id), "{format}: {out}");
        assert!(!out.contains(['\u{1b}', '\u{7}']), "{format}: {out:?}");
        assert!(out.contains("\\u{1b}[2J"), "{format}: {out}");
        assert!(!out.contains(&"x".repeat(200)), "{format}: {out}");
    }
}

/// `report --daily` run again the same day covers the same window as the first run (not the
/// seconds since it), and a `--since` too far back is a clear error, not a panic.
#[test]
fn a_second_daily_report_the_same_day_keeps_the_days_window() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = bridge.request("design", "web", "colour?");
    bridge.reply(&id, "web", "completed", &[], "navy");
    let answered = |path: &std::path::Path| {
        let text = std::fs::read_to_string(path).unwrap();
        assert!(text.contains("1 answered in the window"), "{text}");
    };
    let (first, _) = daily(&bridge);
    answered(&first);
    let (second, _) = daily(&bridge);
    assert_eq!(first, second);
    answered(&second);
    for command in ["report", "export"] {
        let far = bridge.doorbell(&[command, "--since", "100000000d"]);
        assert_eq!(far.code, 2, "{command}: {far:?}");
        assert!(far.stderr.contains("--since"), "{command}: {far:?}");
    }
}

/// The next report's window starts where the last daily report's ended, to the millisecond:
/// not at its file's time, which is later (it was built and written after) and moves when
/// someone edits the file. An answer in between is in one report or the other.
#[test]
fn the_next_window_starts_where_the_daily_reports_ended() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = bridge.request("design", "web", "the August numbers?");
    let (path, _) = daily(&bridge);
    bridge.reply(&id, "web", "completed", &[], "attached");
    let shown: Value =
        serde_json::from_str(bridge.doorbell(&["show", &id, "--json"]).ok()).unwrap();
    let answered =
        chrono::DateTime::parse_from_rfc3339(shown["answeredAt"].as_str().unwrap()).unwrap();
    // The file's time just after the answer, as an edit (or a slow write) leaves it.
    let after = std::time::SystemTime::from(answered) + std::time::Duration::from_millis(1);
    std::fs::File::options()
        .append(true)
        .open(&path)
        .unwrap()
        .set_modified(after)
        .unwrap();
    let report: Value =
        serde_json::from_str(bridge.doorbell(&["report", "--format", "json"]).ok()).unwrap();
    assert_eq!(report["answered"], 1, "{report}");
}

/// Questions asked wrong get a plain answer, not an empty one: debts owed by a name that is
/// no station, a report window that starts in the future, an answer to a note.
#[test]
fn wrong_questions_get_plain_answers() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let refused = |args: &[&str], says: &str| {
        let run = bridge.doorbell(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
    };
    refused(&["debts", "--owed-by", "nobody"], "no station 'nobody'");
    refused(
        &["report", "--since", "2999-01-01T00:00:00Z"],
        "is in the future",
    );
    let note = bridge.send("design", "web", "fyi: the logo is 32px");
    refused(
        &[
            "reply",
            &note,
            "--from",
            "web",
            "--state",
            "completed",
            "ok",
        ],
        "not a request",
    );
}

/// `thread --json` is JSON on every line, a message whose line left its inbox (rotated away)
/// included: what the ledger knows of it, and why its envelope is missing.
#[test]
fn thread_json_stays_json_when_a_line_left_its_inbox() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = bridge.request("design", "web", "q1");
    bridge.reply(&asked, "web", "completed", &[], "done");
    bridge.doorbell(&["status"]).ok();
    let inbox = bridge.inbox("design");
    std::fs::rename(&inbox, bridge.dir().join("design-inbox.old")).unwrap();
    std::fs::write(&inbox, "").unwrap();
    let lines: Vec<Value> = bridge
        .doorbell(&["thread", &asked, "--json"])
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .filter(|m| m.get("trace").is_none())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["envelope"]["id"], asked.as_str());
    assert_eq!(lines[1]["inbox"], "design");
    assert!(lines[1]["envelope"].is_null(), "{:?}", lines[1]);
    assert!(lines[1]["missing"].is_string(), "{:?}", lines[1]);
}

/// Flags that cannot both be honoured are refused (exit 2), never one of them ignored.
#[test]
fn flags_that_cannot_both_be_honoured_are_refused() {
    let bridge = Bridge::with_agents(&["web", "human"]);
    let out = bridge.tmp.path().join("report.json");
    let out = out.to_str().unwrap();
    for args in [
        &["report", "--daily", "--format", "json"][..],
        &["report", "--daily", "--out", out],
        &["status", "--json", "--format", "markdown"],
        &["status", "--json", "--format", "text"],
    ] {
        let run = bridge.doorbell(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(
            run.stderr.contains("cannot be used with"),
            "{args:?}: {run:?}"
        );
    }
    assert!(
        !bridge.dir().join("reports").exists()
            || std::fs::read_dir(bridge.dir().join("reports"))
                .unwrap()
                .next()
                .is_none()
    );
    assert!(!std::path::Path::new(out).exists());
}

#[test]
fn show_json_of_a_line_refused_for_a_lone_surrogate_is_json() {
    let bridge = bridge(&["web", "design", "human"]);
    let half = r#"{"id":"01LONE","from":"design","to":"web","kind":"note","createdAt":"2026-09-03T01:26:51Z","message":{"parts":[{"type":"text","text":"half a pair \ud800"}]}}"#;
    bridge.append_raw("web", format!("{half}\n").as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    let shown = bridge.doorbell(&["show", "01LONE", "--json"]);
    let document: Value = serde_json::from_str(shown.ok()).expect("one JSON document");
    assert_eq!(document["verdict"], "refused", "{document}");
    assert_eq!(document["envelope"], Value::Null, "{document}");
}

#[test]
fn an_argument_that_is_not_utf8_is_refused_not_a_crash() {
    use std::os::unix::ffi::OsStrExt;
    let bridge = bridge(&["web", "design", "human"]);
    let mut command = bridge.command(&["send", "--to", "web", "--from", "design"]);
    command.arg(std::ffi::OsStr::from_bytes(b"caf\xe9"));
    let sent = crate::util::run(command, None);
    assert_eq!(sent.code, 2, "{sent:?}");
    assert!(!sent.stderr.contains("panicked"), "{}", sent.stderr);
    assert_eq!(std::fs::read(bridge.inbox("web")).unwrap(), b"");
}

/// `thread` takes the id of any message in the thread, as well as its contextId: a request
/// that named its own `--context-id` is found by its id too.
#[test]
fn thread_of_a_message_id_is_its_thread() {
    let bridge = bridge(&["web", "design", "human"]);
    let id = bridge
        .doorbell(&[
            "send",
            "--from",
            "design",
            "--to",
            "web",
            "--kind",
            "request",
            "--context-id",
            "launch",
            "ETA?",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge.reply(&id, "web", "completed", &[], "Friday");
    let messages_in = |named: &str| {
        let thread = bridge.doorbell(&["thread", named, "--json"]);
        thread
            .ok()
            .lines()
            .filter(|line| line.contains(r#""envelope""#))
            .count()
    };
    for named in [id.as_str(), "launch"] {
        assert_eq!(messages_in(named), 2, "{named}");
    }
    // A follow-up names the request's id as its own thread: `thread ID` is that thread,
    // and says ID is also a message of thread `launch`.
    bridge
        .doorbell(&[
            "send",
            "--from",
            "web",
            "--to",
            "design",
            "--context-id",
            &id,
            "see also",
        ])
        .ok();
    let both = bridge.doorbell(&["thread", &id]);
    assert!(
        both.stderr.contains(&format!(
            "{id} is also the id of a message in thread launch"
        )),
        "{both:?}"
    );
    assert_eq!(messages_in(&id), 1);
}

/// `show` of a broadcast's id names the requests it stands for, as `wait`, `reply` and
/// `cancel` take that id.
#[test]
fn show_of_a_broadcast_id_names_its_requests() {
    let bridge = bridge(&["web", "design", "human"]);
    let sent = bridge.doorbell(&[
        "send", "--from", "design", "--to", "all", "--kind", "request", "who?",
    ]);
    let base = crate::util::broadcast_id(sent.ok());
    let shown = bridge.doorbell(&["show", &base]);
    assert_eq!(shown.code, 2, "{shown:?}");
    assert!(
        shown.stderr.contains(&format!("{base}.human, {base}.web")),
        "{}",
        shown.stderr
    );
}

/// A debt whose debtor is no station now (its inbox deleted) is still owed: `status` says so
/// rather than counting it in no row, and `debts --owed-by` takes the name `debts` prints.
#[test]
fn a_debt_of_a_station_whose_inbox_is_gone_is_said() {
    let bridge = bridge(&["web", "design", "human"]);
    let id = bridge.request("design", "web", "ETA?");
    bridge.doorbell(&["daemon", "--once"]).ok();
    std::fs::remove_file(bridge.inbox("web")).unwrap();
    let status = bridge.doorbell(&["status"]);
    assert!(
        status.stderr.contains(&format!(
            "web owes design an answer to {id}, but web is no station now"
        )) && status
            .stderr
            .contains(&format!("doorbell cancel {id} --from design")),
        "{}",
        status.stderr
    );
    let owed = bridge.doorbell(&["debts", "--owed-by", "web"]);
    assert!(owed.ok().contains(&id), "{owed:?}");
    // Nor is its line said to be where it was.
    let shown = bridge.doorbell(&["show", &id]);
    assert!(
        shown
            .ok()
            .contains("was in web-inbox.jsonl at byte 0; no longer there"),
        "{shown:?}"
    );
    let shown: Value =
        serde_json::from_str(bridge.doorbell(&["show", &id, "--json"]).ok()).unwrap();
    assert!(
        shown["missing"]
            .as_str()
            .is_some_and(|m| m.contains("no longer there")),
        "{shown}"
    );
    // The JSON says who owes whom, as the text does.
    assert_eq!(shown["owed"]["debtor"], "web", "{shown}");
    assert_eq!(shown["owed"]["creditor"], "design", "{shown}");
    assert_eq!(shown["owed"]["rings"], 0, "{shown}");
}

/// A debt whose debtor has no inbox (deleted, or renamed) cannot be rung: the human hears of
/// it once, when the first ring was due, saying why. Before, no ring and no escalation was
/// ever written. The inbox made again, the requester can cancel, as `status` says.
#[test]
fn a_debt_whose_debtor_has_no_inbox_is_escalated_once() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "1s", 1.0, 2);
    let id = request(&bridge, "design", "web", "ETA?");
    bridge
        .doorbell(&["--config", &config, "daemon", "--once"])
        .ok();
    std::fs::remove_file(bridge.inbox("web")).unwrap();
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let escalations = wait_notes(&bridge, "human", &id, 1);
    let escalation = message(&bridge, "human", &escalations[0]);
    let text = escalation["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        text.contains(&format!("web has owed design an answer on {id}"))
            && text.contains("has not been rung: it has no inbox"),
        "{text}"
    );
    // Once: another debt's two rings (1 s apart) pass, and no second escalation comes.
    let other = request(&bridge, "design", "human", "and the footer?");
    wait_notes(&bridge, "human", &other, 2);
    assert_eq!(loop_notes(&bridge, "human", &id), escalations);
    let status = bridge.doorbell(&["--config", &config, "status"]);
    assert!(
        status.stderr.contains(&format!(
            "(doorbell agent add web); then design can cancel it (doorbell cancel {id} --from design)"
        )),
        "{}",
        status.stderr
    );
    bridge.doorbell(&["agent", "add", "web"]).ok();
    bridge
        .doorbell(&["--config", &config, "cancel", &id, "--from", "design"])
        .ok();
}

/// The doorbell's own lines are no sign of life: an agent rung for a request it never
/// answered shows, in `status`, when the request came, not when the ring did.
#[test]
fn a_ring_does_not_make_a_silent_agent_look_active() {
    let bridge = bridge(&["web", "design", "human"]);
    let config = config(&bridge, "1s", 1.0, 1);
    let _daemon = Daemon::start(&bridge, &["--config", &config]);
    let id = request(&bridge, "design", "web", "ETA?");
    let asked = wait_accepted(&bridge, &id);
    let rings = wait_notes(&bridge, "web", &id, 1);
    let rung = wait_accepted(&bridge, &rings[0]);
    assert!(rung - asked >= 1000, "rung {} ms after", rung - asked);
    let status: Value = serde_json::from_str(
        bridge
            .doorbell(&["--config", &config, "status", "--json"])
            .ok(),
    )
    .unwrap();
    let web = status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "web")
        .unwrap();
    let at = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    assert_eq!(web["lastActivity"], at(asked).as_str(), "{status}");
}

/// Lines a stopped (or stuck) judge has not judged are counted nowhere: `status` says they
/// wait, once they have waited a while, rather than "0 unread".
#[test]
fn status_says_lines_a_stopped_judge_has_not_judged() {
    let bridge = bridge(&["web", "design", "human"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    daemon.signal("STOP");
    let note = crate::util::line("01NOTJUDGED", "design", "web", "note", "");
    bridge.append_raw("web", format!("{note}\n").as_bytes());
    // Written a minute ago, as far as the file says.
    bridge.age_inbox("web", 60);
    let status = bridge.doorbell(&["status"]);
    daemon.signal("CONT");
    assert!(
        status.stderr.contains("web's inbox has") && status.stderr.contains("has not judged"),
        "{}",
        status.stderr
    );
}

#[test]
fn status_says_lines_of_an_inbox_a_stopped_judge_never_looked_at() {
    let bridge = bridge(&["web", "design", "human"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    daemon.signal("STOP");
    // A station added while the judge is stopped: its inbox is new to the judge.
    bridge.doorbell(&["agent", "add", "ops"]).ok();
    let note = crate::util::line("01NEVERLOOKED", "design", "ops", "note", "");
    bridge.append_raw("ops", format!("{note}\n").as_bytes());
    bridge.age_inbox("ops", 60);
    let status = bridge.doorbell(&["status"]);
    daemon.signal("CONT");
    assert!(
        status.stderr.contains("ops's inbox has") && status.stderr.contains("has not judged"),
        "{}",
        status.stderr
    );
}
