//! What the seeds ask of the commands people read: a thread as a trace (seed 003), output
//! that a closed pipe ends quietly, a `show` that escapes what a hostile line holds, and
//! tables as wide as what they hold.

use std::process::Stdio;

use crate::util::{line, Bridge};

/// Run `doorbell ARGS` with its stdout a pipe whose reader is already gone.
fn into_closed_pipe(bridge: &Bridge, args: &[&str]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut command = bridge.command(args);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped());
    let output = command.output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn every_command_that_prints_exits_quietly_on_a_closed_pipe() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "question",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge
        .doorbell(&["reply", &id, "--from", "web", "--state", "working", "on it"])
        .ok();
    let commands: Vec<Vec<&str>> = vec![
        vec!["show", &id],
        vec!["show", &id, "--json"],
        vec!["debts"],
        vec!["debts", "--json"],
        vec!["thread", &id],
        vec!["thread", &id, "--json"],
        vec!["status"],
        vec!["status", "--json"],
        vec!["read", "web", "--peek", "--all"],
        vec!["read", "web", "--peek", "--all", "--json"],
        vec!["report"],
        vec!["agent", "list"],
        vec!["send", "--to", "web", "--from", "design", "a note"],
    ];
    for args in &commands {
        let (code, stderr) = into_closed_pipe(&bridge, args);
        assert_eq!(code, Some(0), "doorbell {args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "doorbell {args:?}: {stderr}"
        );
    }
}

#[test]
fn show_escapes_what_a_refused_line_holds() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    // A kind no rule knows, with an escape sequence in it: the refusal's detail quotes it.
    let hostile = line("01HOSTILE", "design", "web", "re\\u001b[31mquest", "");
    bridge.append_raw("web", format!("{hostile}\n").as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    let shown = bridge.doorbell(&["show", "01HOSTILE"]);
    let text = shown.ok();
    assert!(text.contains("refused (bad-field"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "an escape reached the terminal: {text:?}"
    );
    assert!(text.contains("\\u{1b}"), "{text}");
}

#[test]
fn the_debts_table_is_as_wide_as_its_longest_id() {
    let bridge = Bridge::with_agents(&["web", "design", "human", "a-rather-long-station-name"]);
    bridge
        .doorbell(&[
            "send",
            "--to",
            "all",
            "--from",
            "design",
            "--kind",
            "request",
            "--id",
            "01JBROADCASTWITHALONGID0000",
            "who owns the footer?",
        ])
        .ok();
    let table = bridge.doorbell(&["debts"]);
    let lines: Vec<&str> = table.ok().lines().collect();
    assert!(lines.len() >= 4, "{lines:?}");
    // Every row's columns start where the header's do.
    let column = |line: &str, n: usize| -> usize {
        let mut starts = Vec::new();
        let bytes = line.as_bytes();
        for i in 0..bytes.len() {
            if bytes[i] != b' ' && (i == 0 || bytes[i - 1] == b' ') {
                starts.push(i);
            }
        }
        starts[n]
    };
    for row in &lines[1..] {
        for n in 1..4 {
            assert_eq!(column(row, n), column(lines[0], n), "{lines:#?}");
        }
    }
}

/// `show --json`'s delivery time of `id`, in milliseconds.
fn delivered(bridge: &Bridge, id: &str) -> i64 {
    let shown: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["show", id, "--json"]).ok()).unwrap();
    let at = shown["deliveredAt"].as_str().unwrap();
    chrono::DateTime::parse_from_rfc3339(at)
        .unwrap()
        .timestamp_millis()
}

#[test]
fn a_thread_ends_with_its_trace_checked_against_the_messages_times() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "question",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge.doorbell(&["daemon", "--once"]).ok();
    // Time passes between the judge's verdicts: that is what the trace measures.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let working = bridge
        .doorbell(&["reply", &id, "--from", "web", "--state", "working", "on it"])
        .ok()
        .trim()
        .to_owned();
    bridge.doorbell(&["daemon", "--once"]).ok();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let done = bridge
        .doorbell(&[
            "reply",
            &id,
            "--from",
            "web",
            "--state",
            "completed",
            "done",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge.doorbell(&["daemon", "--once"]).ok();

    let times: Vec<i64> = [&id, &working, &done]
        .iter()
        .map(|m| delivered(&bridge, m))
        .collect();
    let json = bridge.doorbell(&["thread", &id, "--json"]);
    let last: serde_json::Value = serde_json::from_str(json.ok().lines().last().unwrap()).unwrap();
    let trace = &last["trace"];
    assert_eq!(trace["messages"], 3);
    assert_eq!(
        trace["totalSecs"].as_i64().unwrap(),
        (times[2] - times[0]) / 1000,
        "{trace}"
    );
    let since: Vec<i64> = trace["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sinceLastSecs"].as_i64().unwrap())
        .collect();
    assert_eq!(
        since,
        [
            0,
            (times[1] - times[0]) / 1000,
            (times[2] - times[1]) / 1000
        ]
    );
    assert!(since[1] >= 2 && since[2] >= 1, "{since:?}");
    // design's request sat with web, then web's `working` sat with design.
    assert_eq!(trace["steps"][1]["heldBy"], "web");
    assert_eq!(trace["steps"][2]["heldBy"], "design");
    assert_eq!(trace["held"][0]["agent"], "web", "{trace}");
    let text = bridge.doorbell(&["thread", &id]);
    let text = text.ok();
    assert!(text.contains("trace: 3 messages"), "{text}");
    assert!(text.contains("held longest: web"), "{text}");
}

#[test]
fn a_name_another_sender_has_is_never_a_new_station() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    for name in ["bridge", "debt-loop", "report-loop", "all"] {
        let added = bridge.doorbell(&["agent", "add", name]);
        assert_eq!(added.code, 2, "agent add {name}: {added:?}");
        assert!(added.stderr.contains("is taken"), "{}", added.stderr);
        assert!(!bridge.inbox(name).exists(), "{name} got an inbox");
    }
    // A loop named like a station: refused where it would bite, naming both.
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("doorbell.toml"), "[[loop]]\nname = \"web\"\n").unwrap();
    let sent = bridge.doorbell(&["send", "--to", "design", "--from", "web", "hi"]);
    assert_eq!(sent.code, 2, "{sent:?}");
    assert!(
        sent.stderr.contains("'web'") && sent.stderr.contains("web-inbox.jsonl"),
        "{}",
        sent.stderr
    );
    std::fs::write(config.join("doorbell.toml"), "[[loop]]\nname = \"ci\"\n").unwrap();
    let added = bridge.doorbell(&["agent", "add", "ci"]);
    assert_eq!(added.code, 2, "{added:?}");
    assert!(added.stderr.contains("[[loop]]"), "{}", added.stderr);
    std::fs::write(config.join("doorbell.toml"), "[[loop]]\nname = \"all\"\n").unwrap();
    let status = bridge.doorbell(&["status"]);
    assert_eq!(status.code, 2, "{status:?}");
    assert!(
        status.stderr.contains("'all' is reserved"),
        "{}",
        status.stderr
    );
}
