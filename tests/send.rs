//! `doorbell send`: what it writes, what it refuses before writing, and safe retries.

use crate::util::Bridge;

#[test]
fn sending_to_an_unknown_agent_exits_2_names_the_known_ones_and_creates_nothing() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let run = bridge.doorbell(&["send", "--to", "wbe", "--from", "design", "hi"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains(
            "no such agent 'wbe' (known: design, web; add one with 'doorbell agent add')"
        ),
        "{}",
        run.stderr
    );
    assert!(!bridge.inbox("wbe").exists());
    let script = bridge.script(&["--to", "wbe", "--from", "design", "hi"], None);
    assert_eq!(script.code, 2);
    assert!(
        script
            .stderr
            .contains("no such agent 'wbe' (known: design, web"),
        "{}",
        script.stderr
    );
    assert!(!bridge.inbox("wbe").exists());
}

#[test]
fn send_writes_one_line_with_the_envelope_and_prints_the_id() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let id = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "--priority",
            "2",
            "--reply-by",
            "2h",
            "--task-id",
            "q-1",
            "please",
        ])
        .ok()
        .trim()
        .to_owned();
    assert_eq!(id.len(), 26, "a ULID: {id}");
    let lines = bridge.lines("web");
    assert_eq!(lines.len(), 1);
    let envelope: serde_json::Value = serde_json::from_slice(&lines[0]).unwrap();
    assert_eq!(envelope["id"], id.as_str());
    assert_eq!(envelope["kind"], "request");
    assert_eq!(envelope["state"], "submitted");
    assert_eq!(envelope["contextId"], id.as_str());
    assert_eq!(envelope["priority"], 2);
    assert_eq!(envelope["taskId"], "q-1");
    assert!(envelope["replyBy"].as_str().unwrap().ends_with('Z'));
    assert_eq!(envelope["message"]["parts"][0]["text"], "please");
}

#[test]
fn refused_input_exits_2_and_appends_nothing() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let cases: &[&[&str]] = &[
        &[
            "send", "--to", "web", "--from", "design", "--kind", "response", "x",
        ],
        &[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--correlates-to",
            "01X",
            "x",
        ],
        &[
            "send", "--to", "web", "--from", "design", "--kind", "question", "x",
        ],
        &[
            "send", "--to", "web", "--from", "design", "--state", "working", "x",
        ],
        &[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--priority",
            "7",
            "x",
        ],
        &[
            "send", "--to", "web", "--from", "design", "--id", "a:b", "x",
        ],
        &["send", "--to", "web", "--from", "bridge", "x"],
        &["send", "--to", "web", "--from", "nobody", "x"],
        &[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--reply-by",
            "soon",
            "x",
        ],
        &["send", "--to", "web", "x"],
        &[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--correlates-to",
            "01NOSUCH",
            "--state",
            "completed",
            "x",
        ],
    ];
    for args in cases {
        let run = bridge.doorbell(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.is_empty(), "{args:?} says why");
    }
    assert!(bridge.lines("web").is_empty());
}

#[test]
fn a_retry_with_the_same_id_is_a_duplicate_and_counted_once() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let send = |text: &str| {
        bridge.doorbell(&[
            "send", "--to", "web", "--from", "design", "--kind", "request", "--id", "01RETRY", text,
        ])
    };
    send("same").ok();
    // The shell sender cannot see the journal, so its retry is appended and judged a duplicate.
    bridge
        .script(
            &[
                "--to", "web", "--from", "design", "--kind", "request", "--id", "01RETRY", "same",
            ],
            None,
        )
        .ok();
    assert_eq!(bridge.lines("web").len(), 2);
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1, "a duplicate is shown once");
    let verdicts = bridge.verdicts();
    assert_eq!(
        verdicts.iter().filter(|v| v.2 == "duplicate").count(),
        1,
        "{verdicts:?}"
    );
    // Once judged, a retry is recognised before writing; another text under the id is refused.
    send("same").ok();
    assert_eq!(bridge.lines("web").len(), 2);
    let reused = send("different");
    assert_eq!(reused.code, 2);
    assert!(reused.stderr.contains("id-reused"), "{}", reused.stderr);
}

/// A retry under the same id with `--reply-by` given as a duration is the same message, from
/// either sender: it keeps the deadline its accepted copy was given (before: the duration
/// gave another time, `doorbell send` refused the retry as `id-reused`, and the shell sender
/// said "sent" for a line the judge then refused).
#[test]
fn a_retry_with_a_deadline_given_as_a_duration_is_the_same_message() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let first = "2030-01-01T00:00:00Z";
    let args = |reply_by: &'static str| {
        [
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "--reply-by",
            reply_by,
            "--id",
            "01LATER",
            "footer?",
        ]
    };
    let send = |reply_by| {
        let mut command = vec!["send"];
        command.extend(args(reply_by));
        bridge.doorbell(&command)
    };
    send(first).ok();
    bridge.doorbell(&["daemon", "--once"]).ok();
    bridge.script(&args("2h"), None).ok();
    assert_eq!(send("2h").ok().trim(), "01LATER");
    bridge.doorbell(&["daemon", "--once"]).ok();
    let lines = bridge.lines("web");
    assert_eq!(
        lines.len(),
        2,
        "the script's retry is written, the binary's is not"
    );
    for line in &lines {
        let envelope: serde_json::Value = serde_json::from_slice(line).unwrap();
        assert_eq!(envelope["replyBy"], first, "{envelope}");
    }
    let verdicts: Vec<String> = bridge.verdicts().into_iter().map(|v| v.2).collect();
    assert_eq!(verdicts, ["accepted", "duplicate"]);
}

#[test]
fn broadcast_writes_one_line_per_station_with_a_shared_thread() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let out = bridge.doorbell(&[
        "send", "--to", "all", "--from", "human", "--kind", "request", "--id", "01ALL", "status?",
    ]);
    let ids: Vec<&str> = out.ok().lines().collect();
    assert_eq!(
        ids,
        ["01ALL.design", "01ALL.web"],
        "everyone but the sender"
    );
    assert!(bridge.lines("human").is_empty());
    for name in ["web", "design"] {
        let envelope: serde_json::Value = serde_json::from_slice(&bridge.lines(name)[0]).unwrap();
        assert_eq!(envelope["id"], format!("01ALL.{name}"));
        assert_eq!(envelope["contextId"], "01ALL");
    }
}

/// A broadcast note shares one thread as a broadcast request does (DESIGN §5), so `thread`
/// of its id lists every copy (before: no `contextId`, and "no thread"). A note about a
/// request stays in that request's thread.
#[test]
fn a_broadcast_note_shares_a_thread_unless_it_is_about_a_request() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge
        .doorbell(&[
            "send",
            "--to",
            "all",
            "--from",
            "human",
            "--id",
            "01NOTE",
            "standup at ten",
        ])
        .ok();
    let thread = bridge.doorbell(&["thread", "01NOTE", "--json"]);
    let ids: Vec<String> = thread
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|m| m["envelope"]["id"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids, ["01NOTE.design", "01NOTE.web"], "{thread:?}");

    let asked = bridge.request("design", "human", "which room?");
    bridge
        .doorbell(&[
            "send",
            "--to",
            "all",
            "--from",
            "human",
            "--kind",
            "note",
            "--correlates-to",
            &asked,
            "--id",
            "01ABOUT",
            "room 4",
        ])
        .ok();
    for name in ["web", "design"] {
        let line = bridge.lines(name).pop().unwrap();
        let envelope: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(envelope["id"], format!("01ABOUT.{name}"));
        assert!(envelope.get("contextId").is_none(), "{envelope}");
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    let verdicts = bridge.verdicts();
    assert_eq!(verdicts.len(), 5, "{verdicts:?}");
    assert!(
        verdicts
            .iter()
            .all(|(_, _, verdict, _)| verdict == "accepted"),
        "{verdicts:?}"
    );
}

#[test]
fn a_broadcasts_id_is_answered_by_each_station_and_canceled_by_its_sender() {
    let bridge = Bridge::with_agents(&["web", "design", "ops", "human"]);
    bridge
        .doorbell(&[
            "send", "--to", "all", "--from", "human", "--kind", "request", "--id", "01ALL",
            "status?",
        ])
        .ok();
    bridge.doorbell(&["daemon", "--once"]).ok();
    // A station answers the broadcast by its id: the request it was asked.
    bridge
        .doorbell(&[
            "reply",
            "01ALL",
            "--from",
            "web",
            "--state",
            "completed",
            "fine",
        ])
        .ok();
    let answer: serde_json::Value =
        serde_json::from_slice(bridge.lines("human").last().unwrap()).unwrap();
    assert_eq!(answer["correlatesTo"], "01ALL.web");
    // Its sender cannot answer all at once with one state: it is told the ids.
    let ask = bridge.doorbell(&["reply", "01ALL", "--from", "human", "--state", "working"]);
    assert_eq!(ask.code, 2, "{ask:?}");
    assert!(
        ask.stderr.contains(
            "'01ALL' is a broadcast: 3 stations were asked, as 01ALL.design, 01ALL.ops, 01ALL.web"
        ),
        "{}",
        ask.stderr
    );
    // It cancels what is still open of it by its id.
    bridge.doorbell(&["daemon", "--once"]).ok();
    let cancel = bridge.doorbell(&["cancel", "01ALL", "--from", "human"]);
    assert_eq!(cancel.code, 0, "{cancel:?}");
    assert_eq!(cancel.stdout.lines().count(), 2, "{}", cancel.stdout);
    bridge.doorbell(&["daemon", "--once"]).ok();
    let debts = bridge.doorbell(&["debts", "--json"]).ok().to_owned();
    assert!(!debts.contains("01ALL"), "{debts}");
    for (name, state) in [("design", "canceled"), ("ops", "canceled")] {
        let last: serde_json::Value =
            serde_json::from_slice(bridge.lines(name).last().unwrap()).unwrap();
        assert_eq!(last["correlatesTo"], format!("01ALL.{name}"));
        assert_eq!(last["state"], state);
    }
    // Nothing left open: the id says why.
    let again = bridge.doorbell(&["cancel", "01ALL", "--from", "human"]);
    assert_eq!(again.code, 2, "{again:?}");
    assert!(again.stderr.contains("broadcast"), "{}", again.stderr);
}

#[test]
fn a_symlinked_inbox_is_refused_not_followed() {
    let bridge = Bridge::with_agents(&["design"]);
    let target = bridge.tmp.path().join("elsewhere.jsonl");
    std::fs::write(&target, "").unwrap();
    std::os::unix::fs::symlink(&target, bridge.inbox("web")).unwrap();
    let run = bridge.doorbell(&["send", "--to", "web", "--from", "design", "hi"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(run.stderr.contains("not a regular file"), "{}", run.stderr);
    assert_eq!(std::fs::read(&target).unwrap(), b"");
}

#[test]
fn text_from_stdin_drops_trailing_newlines_only() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge
        .doorbell_stdin(
            &["send", "--to", "web", "--from", "design", "-"],
            b"\n line one\n\tline two \n\n",
        )
        .ok();
    let envelope: serde_json::Value = serde_json::from_slice(&bridge.lines("web")[0]).unwrap();
    assert_eq!(
        envelope["message"]["parts"][0]["text"],
        "\n line one\n\tline two "
    );
}

/// A config changed while the daemon runs is not the judge's until it reloads: a sender that
/// only the file knows is refused at once with how to reload, and a line over the judge's
/// limit though under the file's is refused at once, not said sent and refused a moment
/// later. After SIGHUP both go.
#[test]
fn a_send_goes_by_the_running_judges_config_until_it_reloads() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let names = bridge.dir().join(".doorbell/names");
    let published = |what: &str| {
        std::fs::read_to_string(&names)
            .unwrap_or_default()
            .contains(what)
    };
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the names published",
        |_| published("limit max_line_bytes 1048576"),
    );
    bridge.config("max_line_bytes = 2000000\n\n[[loop]]\nname = \"cron\"\n");
    let from_cron = || {
        bridge.doorbell(&[
            "send",
            "--from",
            "cron",
            "--to",
            "web",
            "nightly build done",
        ])
    };
    let cron = from_cron();
    assert_eq!(cron.code, 2, "{cron:?}");
    assert!(cron.stderr.contains("reload"), "{}", cron.stderr);
    let long = "x".repeat(1_500_000);
    let big = bridge.doorbell_stdin(
        &["send", "--from", "design", "--to", "web", "-"],
        long.as_bytes(),
    );
    assert_eq!(big.code, 2, "{big:?}");
    assert!(big.stderr.contains("line-too-long"), "{}", big.stderr);
    daemon.signal("HUP");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the new names published",
        |_| published("loop cron") && published("limit max_line_bytes 2000000"),
    );
    from_cron().ok();
    bridge
        .doorbell_stdin(
            &["send", "--from", "design", "--to", "web", "-"],
            long.as_bytes(),
        )
        .ok();
    daemon.kill();
}

/// A sender that waits for an inbox's lock stamps its line's `createdAt` once it has the
/// lock: after the line written meanwhile, in the order a judge reads them (a catch-up
/// orders crossing answers by `createdAt`). Both senders: the shell sender stamped its line
/// before it waited, up to its `--timeout` too early.
#[test]
fn a_sender_that_waited_for_the_lock_stamps_its_line_after_the_lines_written_meanwhile() {
    for script in [false, true] {
        let bridge = Bridge::with_agents(&["web", "design", "ops"]);
        let inbox = std::fs::OpenOptions::new()
            .append(true)
            .open(bridge.inbox("web"))
            .unwrap();
        inbox.lock().unwrap();
        let mut sender = if script {
            bridge.script_command(&["--from", "design", "--to", "web", "late"])
        } else {
            bridge.command(&["send", "--from", "design", "--to", "web", "late"])
        };
        sender
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let mut sender = sender.spawn().unwrap();
        // The sender has its line and waits for the lock.
        let pid = sender.id();
        crate::util::wait_in_proc(
            std::time::Duration::from_secs(20),
            "the sender to open web's inbox",
            || crate::util::has_open(pid, "web-inbox.jsonl"),
        );
        // Meanwhile the lock's holder writes its own line, stamped in a later millisecond
        // than any the sender could have stamped before it waited.
        let seen = chrono::Utc::now().timestamp_millis();
        let now = loop {
            let now = chrono::Utc::now();
            if now.timestamp_millis() > seen {
                break now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            }
        };
        let own = crate::util::line("01HOLDER", "ops", "web", "note", "")
            .replace("2026-11-29T10:00:00Z", &now);
        assert!(own.contains(&now), "{own}");
        std::io::Write::write_all(&mut &inbox, format!("{own}\n").as_bytes()).unwrap();
        drop(inbox);
        assert!(sender.wait().unwrap().success());
        let lines = bridge.lines("web");
        assert_eq!(lines.len(), 2);
        let late: serde_json::Value = serde_json::from_slice(&lines[1]).unwrap();
        let late = late["createdAt"].as_str().unwrap();
        assert!(
            late >= now.as_str(),
            "script {script}: stamped {late}, before {now}"
        );
    }
}

#[test]
fn a_broadcast_cut_short_by_a_locked_inbox_says_what_was_written_and_how_to_finish() {
    // A relative --reply-by is another time when sent again: the advice names the one written.
    for extra in [&[][..], &["--reply-by", "2h"][..]] {
        let bridge = Bridge::with_agents(&["design", "human", "ops", "web"]);
        // Another process holds web's inbox lock (web is the last station written to).
        let held = std::fs::File::open(bridge.inbox("web")).unwrap();
        held.lock().unwrap();
        let args = [
            &[
                "send", "--to", "all", "--from", "design", "--kind", "request",
            ][..],
            extra,
        ]
        .concat();
        let sent = bridge.doorbell(&[&args[..], &["who can review?"]].concat());
        assert_eq!(sent.code, 1, "{sent:?}");
        assert!(
            sent.stderr.contains("written to human, ops only")
                && !sent.stderr.contains("nothing was written"),
            "{}",
            sent.stderr
        );
        let again: Vec<&str> = sent
            .stderr
            .split("send the same again with ")
            .nth(1)
            .and_then(|rest| rest.split(": what was written").next())
            .unwrap_or_else(|| panic!("no way to finish: {}", sent.stderr))
            .split(' ')
            .collect();
        let id = again[1].to_owned();
        assert!(
            sent.stderr.contains(&format!("{id}.human, {id}.ops")),
            "{}",
            sent.stderr
        );
        drop(held);
        // As told: each station then holds the request once.
        let mut retry = args.clone();
        retry.retain(|a| !extra.contains(a));
        retry.extend(&again);
        retry.push("who can review?");
        bridge.doorbell(&retry).ok();
        bridge.doorbell(&["daemon", "--once"]).ok();
        for station in ["human", "ops", "web"] {
            let lines = bridge.lines(station);
            assert_eq!(lines.len(), 1, "{station}: {lines:?}");
            let line: serde_json::Value = serde_json::from_slice(&lines[0]).unwrap();
            assert_eq!(line["id"], format!("{id}.{station}"));
        }
        assert!(
            bridge.verdicts().iter().all(|v| v.2 == "accepted"),
            "{:?}",
            bridge.verdicts()
        );
    }
}

/// `--data` goes as it was given, on one line: a number's digits, `-0`, `1e2` and the order of
/// the keys are the sender's, not a reformatting's.
#[test]
fn data_is_sent_as_given() {
    let bridge = Bridge::with_agents(&["design", "web"]);
    let data = "{\n  \"order\": 123456789012345678901234567890,\n  \"qty\": 1e2,\n  \"delta\": -0,\n  \"note\": \"a \\\"b\\\"\\n c\"\n}";
    bridge
        .doorbell(&["send", "--from", "design", "--to", "web", "--data", data])
        .ok();
    let lines = bridge.lines("web");
    assert_eq!(lines.len(), 1);
    let line = String::from_utf8(lines[0].clone()).unwrap();
    assert!(
        line.contains(
            r#""data":{"order":123456789012345678901234567890,"qty":1e2,"delta":-0,"note":"a \"b\"\n c"}"#
        ),
        "{line}"
    );
}
