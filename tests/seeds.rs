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

/// design asks web a question; the request's id.
fn design_asks_web(bridge: &Bridge) -> String {
    bridge
        .doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "question",
        ])
        .ok()
        .trim()
        .to_owned()
}

#[test]
fn every_command_that_prints_exits_quietly_on_a_closed_pipe() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let id = design_asks_web(&bridge);
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
    let id = design_asks_web(&bridge);
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
    assert!(
        text.contains(" in 1 wait\n"),
        "one wait, not \"1 waits\": {text}"
    );
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
    // A station's name given to a loop: the name is the loop's, and its inbox is said to be
    // read by nothing, naming both.
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("doorbell.toml"), "[[loop]]\nname = \"web\"\n").unwrap();
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("web-inbox.jsonl is no inbox and nothing reads it: 'web' is a [[loop]]"),
        "{}",
        status.stderr
    );
    let sent = bridge.doorbell(&["send", "--to", "web", "--from", "design", "hi"]);
    assert_eq!(sent.code, 2, "{sent:?}");
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

/// The config of the factory's review loop, owned by `chief`, with a second-scale doorbell.
fn review_loop(bridge: &Bridge, ring_after: &str) {
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("doorbell.toml"),
        format!(
            "[[loop]]\nname = \"review-loop\"\nowner = \"chief\"\n\n[[loop]]\nname = \"cron\"\n\n\
             [debts]\nring_after = \"{ring_after}\"\nbackoff = 1.0\nmax_rings = 1\n"
        ),
    )
    .unwrap();
}

/// The review loop asks marketing `text`; the request's id.
fn loop_asks(bridge: &Bridge, text: &str) -> String {
    bridge
        .doorbell(&[
            "send",
            "--from",
            "review-loop",
            "--to",
            "marketing",
            "--kind",
            "request",
            text,
        ])
        .ok()
        .trim()
        .to_owned()
}

fn ids_in(bridge: &Bridge, agent: &str) -> Vec<serde_json::Value> {
    bridge
        .lines(agent)
        .iter()
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect()
}

#[test]
fn the_review_loop_asks_marketing_and_marketing_answers_to_chief() {
    let bridge = Bridge::with_agents(&["chief", "marketing", "human"]);
    review_loop(&bridge, "1h");
    let id = loop_asks(
        &bridge,
        "1 PULL REQUEST OF YOURS IS SITTING STILL: say who should review it",
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    // marketing owes the loop an answer.
    let debts: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["debts", "--json"]).ok()).unwrap();
    assert_eq!(debts["debts"][0]["request"], id.as_str(), "{debts}");
    assert_eq!(debts["debts"][0]["debtor"], "marketing");
    assert_eq!(debts["debts"][0]["creditor"], "review-loop");
    // reply fills in the owner: the answer goes to chief's inbox, to chief.
    let answer = bridge
        .doorbell(&[
            "reply",
            &id,
            "--from",
            "marketing",
            "--state",
            "completed",
            "design should",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge.doorbell(&["daemon", "--once"]).ok();
    let chief = ids_in(&bridge, "chief");
    let response = chief
        .iter()
        .find(|e| e["id"] == answer.as_str())
        .expect("in chief's inbox");
    assert_eq!(response["to"], "chief");
    assert_eq!(response["correlatesTo"], id.as_str());
    let shown: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["show", &answer, "--json"]).ok()).unwrap();
    assert_eq!(shown["verdict"], "accepted", "{shown}");
    let request: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["show", &id, "--json"]).ok()).unwrap();
    assert_eq!(request["state"], "completed", "{request}");
    let debts: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["debts", "--json"]).ok()).unwrap();
    assert_eq!(
        debts["debts"].as_array().unwrap().len(),
        0,
        "the debt closed: {debts}"
    );
}

#[test]
fn a_loop_without_an_owner_or_answering_is_refused_before_anything_is_written() {
    let bridge = Bridge::with_agents(&["chief", "marketing", "human"]);
    review_loop(&bridge, "1h");
    let before = bridge.lines("marketing").len();
    let ask = bridge.doorbell(&[
        "send",
        "--from",
        "cron",
        "--to",
        "marketing",
        "--kind",
        "request",
        "who?",
    ]);
    assert_eq!(ask.code, 2, "{ask:?}");
    assert!(ask.stderr.contains("without an owner"), "{}", ask.stderr);
    let asked = loop_asks(&bridge, "who?");
    let respond = bridge.doorbell(&[
        "send",
        "--from",
        "review-loop",
        "--to",
        "marketing",
        "--correlates-to",
        &asked,
        "--state",
        "canceled",
        "never mind",
    ]);
    assert_eq!(respond.code, 2, "{respond:?}");
    assert!(
        respond.stderr.contains("never send responses"),
        "{}",
        respond.stderr
    );
    // Written as a line anyway, by a writer that checks nothing: the judge refuses it
    // for the same reason.
    bridge.append_raw(
        "marketing",
        format!(
            "{}\n",
            crate::util::line("01CRONASKS", "cron", "marketing", "request", "")
        )
        .as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    let shown = bridge.doorbell(&["show", "01CRONASKS"]);
    assert!(shown.ok().contains("without an owner"), "{}", shown.stdout);
    assert_eq!(
        bridge.lines("marketing").len(),
        before + 2,
        "only the loop's request and the raw line"
    );
}

#[test]
fn a_silent_answer_to_the_loop_rings_marketing_and_escalates() {
    let bridge = Bridge::with_agents(&["chief", "marketing", "human"]);
    review_loop(&bridge, "1s");
    let id = loop_asks(&bridge, "who?");
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    bridge.wait_for(
        std::time::Duration::from_secs(30),
        "a ring in marketing's inbox and an escalation to human",
        |b| {
            let rang = ids_in(b, "marketing")
                .iter()
                .any(|e| e["from"] == "debt-loop" && e["correlatesTo"] == id.as_str());
            let escalated = ids_in(b, "human")
                .iter()
                .any(|e| e["from"] == "debt-loop" && e["correlatesTo"] == id.as_str());
            rang && escalated
        },
    );
    drop(daemon);
    let ring = ids_in(&bridge, "marketing")
        .into_iter()
        .find(|e| e["from"] == "debt-loop")
        .unwrap();
    let text = ring["message"]["parts"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        text.contains("review-loop (its owner chief gets the answer)"),
        "{text}"
    );
}

#[test]
fn the_board_follows_the_bridge_and_rests_when_it_does() {
    use std::os::unix::fs::MetadataExt;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("doorbell.toml"), "board = true\n").unwrap();
    let board = bridge.dir().join("STATUS.md");
    let read = |path: &std::path::Path| std::fs::read_to_string(path).unwrap_or_default();
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let patience = std::time::Duration::from_secs(30);
    bridge.wait_for(patience, "the board", |_| {
        read(&board).contains("| web | 0 | 0 | 0 |")
    });
    bridge.send("design", "web", "hello");
    let id = bridge
        .doorbell(&[
            "send",
            "--to",
            "human",
            "--from",
            "web",
            "--kind",
            "request",
            "sign off?",
        ])
        .ok()
        .trim()
        .to_owned();
    bridge.wait_for(patience, "the board to show what arrived", |_| {
        let text = read(&board);
        text.contains("| web | 1 | 0 | 1 |") && text.contains(&format!("- {id} from web"))
    });
    // Idle: nothing is written. (An observation window: nothing to wait for.)
    let before = std::fs::metadata(&board).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let after = std::fs::metadata(&board).unwrap();
    assert_eq!(
        (before.ino(), before.mtime_nsec()),
        (after.ino(), after.mtime_nsec()),
        "the board was written on an idle bridge"
    );
    // A read changes the unread counts, though nothing is judged: the board follows.
    bridge.read_json("web", &[]);
    bridge.wait_for(patience, "the board to show what was read", |_| {
        read(&board).contains("| web | 0 | 0 | 1 |")
    });
    // Stopped, the daemon leaves a board that names no judge.
    let mut daemon = daemon;
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(patience), Some(0));
    assert!(
        read(&board).contains("· judge: none running (the daemon stopped"),
        "{}",
        read(&board)
    );
    // `status --format markdown` is the same board.
    let markdown = bridge.doorbell(&["status", "--format", "markdown"]);
    assert!(
        markdown.ok().contains("| web | 0 | 0 | 1 |"),
        "{}",
        markdown.stdout
    );
    assert!(
        markdown.stdout.contains("## Waiting on human"),
        "{}",
        markdown.stdout
    );
}

/// `daemon --once` (a bridge judged by a timer or a cron job) writes the board too, naming no
/// judge running (before: it never did, and the board kept what the last daemon wrote).
#[test]
fn daemon_once_writes_the_board() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("home/.config/doorbell");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(config.join("doorbell.toml"), "board = true\n").unwrap();
    let board = bridge.dir().join("STATUS.md");
    std::fs::write(&board, "an old board\n").unwrap();
    bridge.append_raw(
        "web",
        format!(
            "{}\n",
            crate::util::line("01ONCEBOARD", "design", "web", "note", "")
        )
        .as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    let text = std::fs::read_to_string(&board).unwrap();
    assert!(text.contains("| web | 1 | 0 | 0 |"), "{text}");
    assert!(
        text.contains("· judge: none running (`daemon --once` judged"),
        "{text}"
    );
}
