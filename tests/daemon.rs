//! The daemon end to end: the real binary, real inotify, conditions awaited with deadlines.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use crate::util::{line, Bridge, Daemon};

const PATIENCE: Duration = Duration::from_secs(20);

#[test]
fn watch_prints_a_request_and_a_bad_response_is_refused_and_told_once() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let _daemon = Daemon::start(&bridge, &[]);
    let mut watch = bridge.command(&["watch", "web", "--json"]);
    watch
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null());
    let mut watch = watch.spawn().unwrap();
    let mut printed = BufReader::new(watch.stdout.take().unwrap()).lines();
    let id = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "the header colour?",
        ])
        .ok()
        .trim()
        .to_owned();
    let first: serde_json::Value = serde_json::from_str(&printed.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["envelope"]["id"], id.as_str());
    watch.kill().unwrap();
    watch.wait().unwrap();

    // A response without correlatesTo, written by hand into design's inbox.
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line(
                "01NOCORR",
                "web",
                "design",
                "response",
                r#","state":"completed""#
            )
        )
        .as_bytes(),
    );
    bridge.wait_for(PATIENCE, "the notice to web", |b| {
        b.lines("web")
            .iter()
            .any(|l| l.starts_with(br#"{"id":"bridge:refused:"#))
    });
    let refused = std::fs::read_to_string(bridge.dir().join(".doorbell/refused.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = refused
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{refused}");
    assert_eq!(records[0]["reason"], "response-without-correlation");
    assert_eq!(records[0]["id"], "01NOCORR");
    let notices: Vec<serde_json::Value> = bridge
        .lines("web")
        .iter()
        .map(|l| serde_json::from_slice::<serde_json::Value>(l).unwrap())
        .filter(|e| e["from"] == "bridge")
        .collect();
    assert_eq!(notices.len(), 1);
    let text = notices[0]["message"]["parts"][0]["text"].as_str().unwrap();
    assert!(
        text.contains("'01NOCORR' in design-inbox.jsonl: response-without-correlation"),
        "{text}"
    );
}
