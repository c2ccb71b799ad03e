//! A telling sweep hands a long run of lines to the watchers in steps while it judges the
//! rest, and never tells a line's verdict ahead of a line written before it that is held.

use chrono::Utc;
use doorbell_store::append::append_line;
use doorbell_store::journal::Appended;
use doorbell_store::{Bridge, BridgeLock, Config, Judge};

fn line(id: &str, from: &str, to: &str, kind: &str, extra: &str) -> String {
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"{kind}"{extra},"createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{}"}}]}}}}"#,
        "a few words of padding ".repeat(8)
    )
}

/// A bridge of web and design whose judge keeps a copy of what it journals.
fn bridge() -> (tempfile::TempDir, Bridge, Judge) {
    let dir = tempfile::tempdir().unwrap();
    let bridge = Bridge::create(dir.path(), Config::default()).unwrap();
    for agent in ["web", "design"] {
        bridge.add_agent(agent).unwrap();
    }
    let lock = BridgeLock::acquire(&bridge, "test").unwrap();
    let mut judge = Judge::open(bridge.clone(), lock).unwrap();
    judge.keep_journal_copy();
    (dir, bridge, judge)
}

fn append(bridge: &Bridge, inbox: &str, text: &str) {
    append_line(&bridge.inbox_path(inbox).unwrap(), text.as_bytes()).unwrap();
}

/// 2,000 notes for web: `(ids, told, rest)` of a telling sweep of web's inbox, where `told`
/// is what it told as it went and `rest` what was left to take after it (let go, and read
/// from the file, if it grew past what a copy holds).
fn sweep_telling(
    bridge: &Bridge,
    judge: &mut Judge,
) -> (Vec<String>, Vec<Appended>, Option<Appended>) {
    let ids: Vec<String> = (0..2000).map(|i| format!("01NOTE{i:05}")).collect();
    for id in &ids {
        append(bridge, "web", &line(id, "design", "web", "note", ""));
    }
    let mut told = Vec::new();
    let stats = judge
        .sweep_telling(&["web".to_owned()], Utc::now(), &mut |appended| {
            told.push(appended);
        })
        .unwrap();
    assert!(stats.accepted >= 2000);
    let rest = judge.take_appended().unwrap();
    (ids, told, rest)
}

fn accepted_ids(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|record| {
            let record: serde_json::Value = serde_json::from_str(record).unwrap();
            (record["v"] == "a").then(|| record["a"]["id"].as_str().unwrap().to_owned())
        })
        .filter(|id| id.starts_with("01NOTE"))
        .collect()
}

#[test]
fn a_long_run_is_told_in_steps_each_record_once_in_order() {
    let (_dir, bridge, mut judge) = bridge();
    let (ids, told, rest) = sweep_telling(&bridge, &mut judge);

    assert!(
        told.len() >= 4,
        "about 900 KB of lines are told in steps, not at the end: {} steps",
        told.len()
    );
    // Each step is small enough for the copy the watchers are given (none is let go for a
    // watcher to read the file): the steps follow each other in the journal, and together
    // with the rest hold every verdict once, in the order the lines were written.
    let mut all: Vec<Appended> = told;
    all.extend(rest);
    for pair in all.windows(2) {
        assert_eq!(
            pair[0].to(),
            pair[1].from,
            "no gap and no overlap between steps"
        );
    }
    let bytes: Vec<u8> = all.iter().flat_map(|a| a.bytes.iter().copied()).collect();
    assert_eq!(accepted_ids(&bytes), ids);
    let journal = std::fs::read(bridge.dir().join(".doorbell/journal.jsonl")).unwrap();
    let from = usize::try_from(all[0].from).unwrap();
    assert_eq!(
        &journal[from..],
        &bytes[..],
        "what was told is what the file holds"
    );
}

#[test]
fn nothing_is_told_while_a_line_is_held() {
    let (_dir, bridge, mut judge) = bridge();
    // web's inbox opens with design's answer to a request of web's that sits in design's
    // inbox, not read yet: the answer is held until the sweep has read design's inbox too.
    append(
        &bridge,
        "web",
        &line(
            "01ANSWER",
            "design",
            "web",
            "response",
            r#","correlatesTo":"01ASK","state":"completed""#,
        ),
    );
    append(
        &bridge,
        "design",
        &line("01ASK", "web", "design", "request", ""),
    );
    let (ids, told, _) = sweep_telling(&bridge, &mut judge);

    assert!(
        told.is_empty(),
        "told {} steps while the answer was held",
        told.len()
    );
    let journal = std::fs::read(bridge.dir().join(".doorbell/journal.jsonl")).unwrap();
    assert_eq!(accepted_ids(&journal), ids);
    assert!(
        String::from_utf8_lossy(&journal).contains(r#""a":{"id":"01ANSWER""#),
        "the held answer is judged in the same sweep"
    );
}
