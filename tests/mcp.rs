//! `doorbell mcp` driven by the official Python MCP SDK (`mcp` from `PyPI`, in the tests'
//! virtual environment): list the tools, send a request as one agent, read and answer it as
//! another, wait for the answer; in the SDK's default mode and in its legacy mode.

use serde_json::Value;

use crate::util::{python, run, Bridge};

const PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

fn client(bridge: &Bridge, mode: &str) -> Value {
    let mut command = std::process::Command::new(python());
    bridge.env(&mut command);
    command
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/mcp_client.py"
        ))
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .arg(mode);
    let ran = run(command, None);
    assert_eq!(ran.code, 0, "{mode}: {}{}", ran.stdout, ran.stderr);
    serde_json::from_str(ran.stdout.trim()).unwrap()
}

#[test]
fn the_python_sdk_sends_reads_answers_and_waits_through_doorbell_mcp() {
    for (mode, protocol) in [("auto", "2026-07-28"), ("legacy", "2025-11-25")] {
        let bridge = Bridge::with_agents(&["web", "design"]);
        let seen = client(&bridge, mode);
        assert_eq!(seen["protocol"], protocol, "{seen}");
        assert!(seen["connect_secs"].as_f64().unwrap() < 1.0, "{seen}");
        let tools: Vec<&str> = seen["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(
            tools,
            ["debts", "read", "reply", "send", "show", "status", "wait"]
        );
        assert!(seen["tools_list_chars"].as_u64().unwrap() < 6000, "{seen}");
        // The bounds the descriptions say are in the schemas a client checks against.
        assert_eq!(
            seen["bounds"],
            serde_json::json!({"read.max": [1, 50], "wait.timeout_secs": 600}),
            "{seen}"
        );
        assert_eq!(seen["unknown_tool_code"], -32602, "{seen}");
        assert!(seen["oversized"].as_str().unwrap().contains("shorten it"));
        let request = seen["request"].as_str().unwrap();
        assert_eq!(seen["waited"][0]["id"], request);
        assert_eq!(seen["waited"][0]["state"], "completed");
        assert_eq!(
            seen["thread"],
            serde_json::json!(["ETA for the footer?", "on it", "Friday"])
        );
        // The bridge agrees: one request, answered; nothing from the bad calls.
        assert_eq!(bridge.lines("web").len(), 1, "only the request reached web");
        assert!(!bridge.doorbell(&["debts"]).ok().contains(request));
        assert!(bridge
            .doorbell(&["show", request])
            .ok()
            .contains("read through mcp"));
    }
}

/// `read` returns at most 20,000 UTF-16 units of text (the first message always, a long one
/// cut with the way to the rest): a harness takes the whole result into the model's context,
/// and Claude Code cuts one over 25,000 tokens or swaps it for a file. What does not fit stays
/// unread and comes with the next call, in order, each message once.
#[test]
fn a_read_returns_what_a_harness_takes_and_leaves_the_rest_unread() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut sent = Vec::new();
    for n in 0..60 {
        sent.push(bridge.send("design", "web", &format!("{n} {}", "word ".repeat(600))));
    }
    let huge = "x".repeat(1_000_000);
    sent.push(
        bridge
            .doorbell_stdin(
                &["send", "--from", "design", "--to", "web", "-"],
                huge.as_bytes(),
            )
            .ok()
            .trim()
            .to_owned(),
    );
    let calls = client(&bridge, "reads");
    let calls = calls.as_array().unwrap();
    let mut read = Vec::new();
    for call in calls {
        let units = call["units"].as_u64().unwrap();
        assert!(units <= 20_000 + 200, "{units} units in one call");
        read.extend(
            call["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|id| id.as_str().unwrap().to_owned()),
        );
    }
    assert_eq!(read, sent, "each message once, in order");
    let last = calls.last().unwrap();
    assert_eq!(last["truncated"][0], sent[60].as_str(), "{last}");
    assert_eq!(last["more"], 0);
    assert!(calls[0]["more"].as_u64().unwrap() > 0, "{}", calls[0]);
}

/// `show` and `debts` stay within what a harness takes, however long the text, the thread
/// or the list: a long text comes in pages that join up to it, a thread's latest messages
/// with their texts cut, the debts counted past fifty.
#[test]
fn show_and_debts_answer_in_pages_and_counts_not_megabytes() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let huge: String = (b'a'..=b'z')
        .cycle()
        .take(200_000)
        .map(char::from)
        .collect();
    let request = bridge
        .doorbell_stdin(
            &[
                "send", "--from", "design", "--to", "web", "--kind", "request", "-",
            ],
            huge.as_bytes(),
        )
        .ok()
        .trim()
        .to_owned();
    for n in 0..30 {
        bridge
            .doorbell(&[
                "reply",
                &request,
                "--from",
                "web",
                "--state",
                "working",
                &format!("{n} {}", "still ".repeat(500)),
            ])
            .ok();
    }
    for n in 0..60 {
        bridge.request("design", "web", &format!("ask {n}"));
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    let mut raw = Raw::start(&bridge, "web");
    let mut text = String::new();
    let mut from = 0;
    for id in 1.. {
        raw.call(
            id,
            "show",
            &serde_json::json!({"id": request, "from": from}),
        );
        let answer = raw.answer(id);
        let content = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            content.len() < 60_000,
            "{} bytes in one show",
            content.len()
        );
        let shown = &answer["result"]["structuredContent"];
        let thread = shown["thread"].as_array().unwrap();
        assert_eq!(thread.len(), 20, "the latest 20 of the thread");
        assert_eq!(shown["threadEarlier"], 11);
        assert_eq!(
            shown["message"]["from"], "design",
            "the sender, on every page"
        );
        let page = shown["message"]["text"].as_str().unwrap();
        let Some(next) = shown["message"]["next"].as_u64() else {
            text.push_str(page);
            break;
        };
        let (kept, _) = page.split_once(" … (").unwrap();
        text.push_str(kept);
        from = next;
        assert!(id < 100, "pages never end");
    }
    assert_eq!(text, huge, "the pages join up to the text");
    raw.call(1000, "debts", &serde_json::json!({}));
    let debts = &raw.answer(1000)["result"]["structuredContent"];
    assert_eq!(debts["owes"].as_array().unwrap().len(), 50);
    // The 60 asks and the long request, still being worked on.
    assert_eq!(debts["owesMore"], 11, "{}", debts["owesMore"]);
}

/// `doorbell mcp` spoken to in raw JSON-RPC lines, for what the SDK does not do on demand
/// (a cancel at a chosen moment, a client that just goes): initialized on start.
struct Raw {
    server: std::process::Child,
    to: Option<std::process::ChildStdin>,
    from: std::io::BufReader<std::process::ChildStdout>,
}

impl Raw {
    fn start(bridge: &Bridge, agent: &str) -> Raw {
        let mut command = bridge.command(&["mcp", "--agent", agent]);
        command
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut server = command.spawn().unwrap();
        let to = server.stdin.take();
        let from = std::io::BufReader::new(server.stdout.take().unwrap());
        let mut raw = Raw { server, to, from };
        raw.say(
            &serde_json::json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}}),
        );
        raw.answer(0);
        raw.say(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        raw
    }

    fn say(&mut self, message: &Value) {
        self.say_raw(&message.to_string());
    }

    /// One line as written, for what `serde_json` would not write.
    fn say_raw(&mut self, line: &str) {
        use std::io::Write;
        writeln!(self.to.as_mut().unwrap(), "{line}").unwrap();
    }

    /// Call `tool` as request `id` (answered later, by [`Raw::answer`]).
    fn call(&mut self, id: u64, tool: &str, arguments: &Value) {
        self.say(
            &serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}),
        );
    }

    /// The answer to request `id`, skipping any other line.
    fn answer(&mut self, id: u64) -> Value {
        loop {
            let value = self.next();
            if value["id"] == id {
                return value;
            }
        }
    }

    /// The server's next line, if one comes within `patience`.
    fn next_within(&mut self, patience: std::time::Duration) -> Option<Value> {
        if self.from.buffer().is_empty() {
            let mut fds = [rustix::event::PollFd::new(
                self.from.get_ref(),
                rustix::event::PollFlags::IN,
            )];
            let timeout = rustix::event::Timespec {
                tv_sec: i64::try_from(patience.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: 0,
            };
            if rustix::event::poll(&mut fds, Some(&timeout)).ok()? == 0 {
                return None;
            }
        }
        Some(self.next())
    }

    /// The server's next line.
    fn next(&mut self) -> Value {
        use std::io::BufRead;
        let mut line = String::new();
        assert!(
            self.from.read_line(&mut line).unwrap() > 0,
            "the server ended"
        );
        serde_json::from_str(&line).unwrap()
    }
}

/// A `wait` the client cancels lets go of what it holds (its thread, its watch of the
/// folder) at once, not at its deadline ten minutes on; the server goes on answering.
#[test]
fn a_cancelled_wait_lets_go_at_once() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let id = bridge.request("design", "web", "ETA?");
    let mut raw = Raw::start(&bridge, "design");
    let pid = raw.server.id();
    let watches = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
            .count()
    };
    let before = watches();
    raw.call(
        2,
        "wait",
        &serde_json::json!({"ids": [id], "timeout_secs": 600}),
    );
    crate::util::wait_in_proc(PATIENCE, "the wait to watch the folder", || {
        watches() > before
    });
    raw.say(
        &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user pressed Esc"}}),
    );
    crate::util::wait_in_proc(PATIENCE, "the cancelled wait to let go", || {
        watches() == before
    });
    raw.call(3, "status", &serde_json::json!({}));
    assert!(raw.answer(3)["result"].is_object());
}

/// A server that waits again and again while a daemon runs keeps what it holds bounded:
/// each `wait` waited for the judge to let go on a thread of its own, with the bridge lock
/// open, and neither ended while the daemon ran (300 waits, 300 threads and files; at
/// `ulimit -n` every tool failed with "Too many open files").
#[test]
fn waits_beside_a_running_daemon_leave_no_thread_or_file_behind() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let _daemon = crate::util::Daemon::start(&bridge, &[]);
    let id = bridge.request("design", "web", "ETA?");
    let mut raw = Raw::start(&bridge, "design");
    let pid = raw.server.id();
    // Each waiting thread held the bridge lock open: the threads are what the files were.
    // (A wait's own watch lets go of its copy a little after it answers, on `notify`'s
    // thread.)
    let waiting_threads = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|name| name.trim() == "after-the-judge")
            .count()
    };
    for call in 1..=40 {
        raw.call(
            call,
            "wait",
            &serde_json::json!({"ids": [id], "timeout_secs": 0}),
        );
        assert!(raw.answer(call)["result"].is_object());
    }
    let threads = waiting_threads();
    assert!(
        threads <= 1,
        "after 40 waits: {threads} threads waiting for the judge to let go"
    );
}

/// A call whose text ends in half an emoji (a lone surrogate escape, as JavaScript writes a
/// string cut in the middle of one) is answered: the half is U+FFFD, as Node writes it in
/// UTF-8. It was dropped unanswered, and the client waited for ever.
#[test]
fn a_call_with_half_an_emoji_is_answered() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut raw = Raw::start(&bridge, "design");
    raw.say_raw(
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send","arguments":{"to":["web"],"text":"cut here \ud83d"}}}"#,
    );
    // Both are answered, in whichever order the server finishes them: were 7 dropped, only
    // 8's answer would come.
    raw.call(8, "status", &serde_json::json!({}));
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < 2 {
        let Some(answer) = raw.next_within(PATIENCE) else {
            break;
        };
        answers.insert(answer["id"].as_u64().unwrap_or_default(), answer);
    }
    assert!(answers.contains_key(&8), "{answers:?}");
    let answer = answers
        .remove(&7)
        .unwrap_or_else(|| panic!("the call with half an emoji was not answered: {answers:?}"));
    assert!(answer["result"].is_object(), "{answer}");
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(
        read[0]["envelope"]["message"]["parts"][0]["text"],
        "cut here \u{fffd}"
    );
}

/// A `read` the client cancels (its user pressed Esc while another reader held the inbox)
/// gets no answer, so nothing in it may count as read: the message stays unread.
#[test]
fn a_cancelled_read_leaves_the_messages_unread() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let id = bridge.send("design", "web", "are you there?");
    // Another reader holds web's inbox.
    let reads = bridge.dir().join(".doorbell/reads");
    std::fs::create_dir_all(&reads).unwrap();
    let lock = std::fs::File::create(reads.join("web.lock")).unwrap();
    lock.lock().unwrap();
    let mut raw = Raw::start(&bridge, "web");
    raw.call(2, "read", &serde_json::json!({}));
    raw.say(
        &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2, "reason": "the user pressed Esc"}}),
    );
    // Answered after the cancel was taken in: the read waits for the lock still.
    raw.call(3, "status", &serde_json::json!({}));
    raw.answer(3);
    lock.unlock().unwrap();
    // The read ends (unanswered); then the message is still unread.
    raw.call(4, "read", &serde_json::json!({}));
    let again = raw.answer(4);
    let messages = &again["result"]["structuredContent"]["messages"];
    assert_eq!(messages[0]["id"], id.as_str(), "{again}");
    drop(raw.to.take());
    let _ = raw.server.wait();
}

/// A client that goes away (its stdin closed) while a `wait` runs: the server ends at once,
/// not when the wait would have (up to ten minutes later).
#[test]
fn the_server_ends_when_its_client_goes_during_a_wait() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = bridge.request("web", "design", "anyone?");
    let mut raw = Raw::start(&bridge, "web");
    raw.call(
        2,
        "wait",
        &serde_json::json!({"ids": [asked], "timeout_secs": 120}),
    );
    // The wait has begun once a later call is answered.
    raw.call(3, "status", &serde_json::json!({}));
    raw.answer(3);
    drop(raw.to.take());
    let (tx, ended) = std::sync::mpsc::channel();
    let mut server = raw.server;
    let pid = server.id();
    std::thread::spawn(move || {
        let _ = tx.send(server.wait());
    });
    let status = ended.recv_timeout(std::time::Duration::from_secs(20));
    if status.is_err() {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status();
    }
    assert!(
        status.is_ok(),
        "the server still ran 20 s after its client went"
    );
}

/// A client that cancels its `read` ignores the answer, whether it comes before the cancel
/// is taken in or after (MCP says a client ignores what comes after it cancelled): so no
/// cancelled read counts as read, at whatever moment its cancel arrives.
#[test]
fn no_cancelled_read_counts_as_read_whenever_the_cancel_comes() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut raw = Raw::start(&bridge, "web");
    let mut sent = Vec::new();
    for trial in 0..30u64 {
        sent.push(bridge.send("design", "web", &format!("message {trial}")));
        let id = trial + 1;
        raw.call(id, "read", &serde_json::json!({}));
        let cancel = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": id, "reason": "the user pressed Esc"}});
        // At once, while the read runs; or once its answer is here (late, crossing it).
        if trial % 2 == 0 {
            raw.say(&cancel);
        } else {
            raw.answer(id);
            raw.say(&cancel);
        }
    }
    // Every message is still unread once the cancels are all taken in.
    let unread = |b: &Bridge| {
        b.read_json("web", &["--peek"])
            .iter()
            .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "every cancelled read undone",
        |b| unread(b).len() == sent.len(),
    );
    assert_eq!(unread(&bridge), sent);
    drop(raw.to.take());
    let _ = raw.server.wait();
}

/// A read answered, then its cancel and the next read written together (the user pressed
/// Esc and the agent read again): the cancel came first, so the next read starts where the
/// cancelled one began, and the message the client never took is in it (before: the next
/// read ran first, went on from the cancelled read's end, and that message counted as read
/// though the agent never got it, in 28 of 30 tries).
#[test]
fn a_read_written_after_a_cancel_starts_where_the_cancelled_read_began() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut raw = Raw::start(&bridge, "web");
    for trial in 0..20u64 {
        let sent = [
            bridge.send("design", "web", &format!("first {trial}")),
            bridge.send("design", "web", &format!("second {trial}")),
        ];
        let (cancelled, next) = (100 + 2 * trial, 101 + 2 * trial);
        raw.call(cancelled, "read", &serde_json::json!({"max": 1}));
        raw.answer(cancelled);
        raw.say(
            &serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": {"requestId": cancelled, "reason": "the user pressed Esc"}}),
        );
        raw.call(next, "read", &serde_json::json!({}));
        let answer = raw.answer(next);
        let got: Vec<&str> = answer["result"]["structuredContent"]["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(got, sent, "trial {trial}: {answer}");
    }
    drop(raw.to.take());
    let _ = raw.server.wait();
}

/// A tool call whose params are not the shape of `tools/call` is invalid params (-32602), as
/// MCP says, not an unknown method; a method the server does not have is -32601.
#[test]
fn a_tool_call_of_the_wrong_shape_is_invalid_params() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut raw = Raw::start(&bridge, "web");
    raw.call(2, "read", &serde_json::json!("max=5"));
    let wrong = raw.answer(2);
    assert_eq!(wrong["error"]["code"], -32602, "{wrong}");
    raw.say(&serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/delete"}));
    let unknown = raw.answer(3);
    assert_eq!(unknown["error"]["code"], -32601, "{unknown}");
    drop(raw.to.take());
    let _ = raw.server.wait();
}

/// What a message's text holds reaches the model as a hook shows it: no control, bidi or
/// invisible character raw (a tag character is text to a model and nothing to a person), and
/// a read within its cap however the text escapes.
#[test]
fn read_and_show_give_no_invisible_or_control_character_raw_and_keep_their_cap() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let escapes = bridge.send("design", "web", &"\u{1b}".repeat(7900));
    let hidden = "ok\u{e0041}\u{e0042}\u{202e}\u{200b}\u{9b}\u{1b}[2J";
    let id = bridge.send("design", "web", hidden);
    let raw_chars = ['\u{e0041}', '\u{202e}', '\u{200b}', '\u{9b}', '\u{1b}'];
    let mut raw = Raw::start(&bridge, "web");
    raw.call(2, "read", &serde_json::json!({}));
    let read = raw.answer(2);
    let text = read["result"]["content"][0]["text"].as_str().unwrap();
    assert!(
        text.encode_utf16().count() <= 20_000,
        "{} units",
        text.encode_utf16().count()
    );
    let messages = read["result"]["structuredContent"]["messages"]
        .as_array()
        .unwrap();
    assert_eq!(messages[0]["id"], escapes.as_str());
    for c in raw_chars {
        assert!(!text.contains(c), "{c:?} raw in {text}");
    }
    raw.call(3, "show", &serde_json::json!({"id": id}));
    let shown = raw.answer(3);
    let text = shown["result"]["content"][0]["text"].as_str().unwrap();
    for c in raw_chars {
        assert!(!text.contains(c), "{c:?} raw in {text}");
    }
    let message = &shown["result"]["structuredContent"]["message"];
    assert!(
        message["text"]
            .as_str()
            .unwrap()
            .starts_with("ok\\u{e0041}\\u{e0042}\\u{202e}"),
        "{message}"
    );
}

/// A wait on several requests says which are answered and which it still waits for, timed
/// out or not, with `any` too; `doorbell wait` prints what was answered before it times out.
#[test]
fn a_wait_says_what_is_answered_and_what_is_still_waited_for() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let answered = bridge.request("design", "web", "ETA?");
    let open = bridge.request("design", "web", "and the logo?");
    bridge.reply(&answered, "web", "completed", &[], "Friday");
    let mut raw = Raw::start(&bridge, "design");
    let ids = [answered.as_str(), open.as_str()];
    for (n, any, timed_out) in [(2, false, true), (3, true, false)] {
        raw.call(
            n,
            "wait",
            &serde_json::json!({"ids": ids, "any": any, "timeout_secs": 1}),
        );
        let got = raw.answer(n);
        let result = &got["result"]["structuredContent"];
        assert_eq!(result["timedOut"], timed_out, "any {any}: {got}");
        assert_eq!(result["answered"][0]["id"], answered.as_str(), "{got}");
        assert_eq!(result["answered"].as_array().unwrap().len(), 1, "{got}");
        assert_eq!(result["waiting"], serde_json::json!([open]), "{got}");
    }
    drop(raw.to.take());
    let _ = raw.server.wait();
    let run = bridge.doorbell(&["wait", &answered, &open, "--timeout", "1s", "--json"]);
    assert_eq!(run.code, 124, "{run:?}");
    assert!(run.stdout.contains(&answered), "{run:?}");
    assert!(run.stderr.contains(&open), "{run:?}");
}

/// A read of at most 0 messages reads none (an error, the message still unread), and a
/// misspelt argument is an error naming the ones there are, never a default used in silence.
#[test]
fn a_read_of_none_and_a_misspelt_argument_are_errors() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let id = bridge.send("design", "web", "are you there?");
    let mut raw = Raw::start(&bridge, "web");
    raw.call(2, "read", &serde_json::json!({"max": 0}));
    let none = raw.answer(2);
    assert_eq!(none["result"]["isError"], true, "{none}");
    raw.call(3, "wait", &serde_json::json!({"ids": [id], "timeout_s": 1}));
    let typo = raw.answer(3);
    assert_eq!(typo["result"]["isError"], true, "{typo}");
    assert!(typo.to_string().contains("timeout_secs"), "{typo}");
    raw.call(4, "read", &serde_json::json!({}));
    let read = raw.answer(4);
    let messages = &read["result"]["structuredContent"]["messages"];
    assert_eq!(messages[0]["id"], id.trim(), "{read}");
    // A tool that takes no argument refuses one too, rather than ignoring it.
    for (id, tool) in [(5, "debts"), (6, "status")] {
        raw.call(id, tool, &serde_json::json!({"verbose": true}));
        let answer = raw.answer(id);
        assert!(
            answer["result"]["isError"] == true || answer["error"]["code"] == -32602,
            "{tool}: {answer}"
        );
        assert!(answer.to_string().contains("verbose"), "{tool}: {answer}");
        raw.call(id + 10, tool, &serde_json::json!({}));
        let fine = raw.answer(id + 10);
        assert!(
            fine["result"]["structuredContent"].is_object(),
            "{tool}: {fine}"
        );
    }
    drop(raw.to.take());
    let _ = raw.server.wait();
}
