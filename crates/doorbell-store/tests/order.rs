//! A catch-up judges lines as they were written: a line held for a request that another inbox
//! holds does not let a later line of its inbox claim its id first (a model torture case).

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::{Bridge, BridgeLock, Config, Judge, View};

fn line(id: &str, from: &str, to: &str, kind: &str, extra: &str, text: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"{kind}"{extra},"createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{text}"}}]}}}}"#
    )
}

#[test]
fn a_held_response_claims_its_id_before_a_later_line_that_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design", "human"] {
        bridge.add_agent(agent).unwrap();
    }
    let append = |inbox: &str, text: &str| {
        append_line(&bridge.inbox_path(inbox).unwrap(), text.as_bytes()).unwrap();
    };
    // design's inbox is read first: web's answer (whose request is in web's inbox), then a
    // line written after it that reuses the answer's id.
    append(
        "design",
        &line(
            "01ANSWER",
            "web",
            "design",
            "response",
            r#","correlatesTo":"01ASK","state":"working""#,
            "on it",
        ),
    );
    append(
        "design",
        &line("01ANSWER", "web", "design", "note", "", "another"),
    );
    append(
        "web",
        &line("01ASK", "design", "web", "request", "", "question"),
    );

    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    let stats = judge.catch_up(Utc::now()).unwrap();
    // The ask, the answer and the notice that tells web of its refused reuse.
    assert_eq!((stats.accepted, stats.refused), (3, 1));
    judge.checkpoint().unwrap();
    drop(judge);
    let view = View::unjudged(&bridge).unwrap();
    let answer = view.message("01ANSWER").unwrap().expect("found");
    assert_eq!(answer.offset, 0, "the answer written first claims the id");
    let ask = view.request("01ASK").unwrap().into_owned();
    assert_eq!(ask.state.as_str(), "working");
    let reuse = view.inbox("design", 0).unwrap().unwrap();
    let second = std::fs::read_to_string(bridge.inbox_path("design").unwrap())
        .unwrap()
        .find('\n')
        .unwrap() as u64
        + 1;
    assert!(
        !reuse.is_accepted(second),
        "the reuse is refused as id-reused"
    );
}

/// Catch the bridge up with a judge of its own, and save what it judged.
fn catch_up(bridge: &Bridge) {
    let lock = BridgeLock::acquire(bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    judge.catch_up(Utc::now()).unwrap();
    judge.checkpoint().unwrap();
}

/// The offsets of `inbox`'s verdicts, in the journal's order.
fn verdict_order(bridge: &Bridge, inbox: &str) -> Vec<u64> {
    std::fs::read_to_string(bridge.dir().join(".doorbell/journal.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["in"] == inbox && matches!(r["v"].as_str(), Some("a" | "d" | "r")))
        .map(|r| r["o"].as_u64().unwrap())
        .collect()
}

/// A line that names nobody but reads as a response to a request takes a turn in its
/// conversation, and its verdict gives the turn on: judged inside a run of refusals it never
/// did, and the real response behind it waited to the end of the sweep, with every line its
/// inbox had after it (judged out of order, told to no watcher meanwhile).
#[test]
fn a_line_that_names_nobody_but_takes_a_turn_gives_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design"] {
        bridge.add_agent(agent).unwrap();
    }
    let append = |inbox: &str, text: &[u8]| {
        append_line(&bridge.inbox_path(inbox).unwrap(), text).unwrap();
    };
    append(
        "design",
        line("01ASK", "web", "design", "request", "", "q").as_bytes(),
    );
    catch_up(&bridge);
    append("design", br#"{"kind":"response","correlatesTo":"01ASK"}"#);
    let working = line(
        "01WORK",
        "design",
        "web",
        "response",
        r#","correlatesTo":"01ASK","state":"working""#,
        "on it",
    );
    append("web", working.as_bytes());
    append(
        "web",
        line("01NOTE", "design", "web", "note", "", "n").as_bytes(),
    );
    catch_up(&bridge);
    assert_eq!(
        verdict_order(&bridge, "web"),
        [0, working.len() as u64 + 1],
        "web's lines judged in their order"
    );
}
