//! Waiting from a shell (DESIGN §10): `read --wait` blocks until something arrives, and
//! `wait` takes several ids or a broadcast's id (fan-out, fan-in).

use std::process::{Child, Stdio};

use crate::util::Bridge;

fn spawn(bridge: &Bridge, args: &[&str]) -> Child {
    let mut command = bridge.command(args);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.spawn().unwrap()
}

fn finish(child: Child) -> (i32, String, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn read_wait_blocks_until_a_message_arrives_then_moves_the_cursor() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let reader = spawn(
        &bridge,
        &["read", "web", "--wait", "--timeout", "60s", "--json"],
    );
    let id = bridge.send("design", "web", "the footer is grey");
    let (code, stdout, stderr) = finish(reader);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(lines[0]["envelope"]["id"], id);
    // Read: the cursor moved, and the read log names the path.
    assert_eq!(bridge.read_json("web", &[]).len(), 0);
    assert!(bridge
        .doorbell(&["show", &id])
        .ok()
        .contains("read through read"));
}

#[test]
fn read_wait_times_out_with_124_and_prints_nothing() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let run = bridge.doorbell(&["read", "web", "--wait", "--timeout", "1s"]);
    assert_eq!(run.code, 124, "{run:?}");
    assert_eq!(run.stdout, "");
    assert!(run.stderr.contains("nothing arrived"), "{}", run.stderr);
    let both = bridge.doorbell(&["read", "web", "--wait", "--peek"]);
    assert_eq!(both.code, 2, "{both:?}");
}

#[test]
fn wait_on_a_broadcast_returns_when_every_station_has_answered() {
    let bridge = Bridge::with_agents(&["web", "design", "ops"]);
    let sent = bridge.doorbell(&[
        "send", "--from", "design", "--to", "web", "--to", "ops", "--kind", "request", "status?",
    ]);
    let base = crate::util::broadcast_id(sent.ok());
    let waiter = spawn(&bridge, &["wait", &base, "--json", "--timeout", "60s"]);
    for station in ["web", "ops"] {
        let id = format!("{base}.{station}");
        bridge
            .doorbell(&[
                "reply",
                &id,
                "--from",
                station,
                "--state",
                "completed",
                "ok",
            ])
            .ok();
    }
    let (code, stdout, stderr) = finish(waiter);
    assert_eq!(code, 0, "{stderr}");
    let answered: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ids: Vec<&str> = answered.iter().map(|a| a["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [format!("{base}.ops"), format!("{base}.web")]);
    assert!(answered.iter().all(|a| a["state"] == "completed"));
}

#[test]
fn wait_any_returns_at_the_first_answer_and_says_which() {
    let bridge = Bridge::with_agents(&["web", "design", "ops"]);
    let ask = |to: &str| {
        bridge
            .doorbell(&[
                "send", "--from", "design", "--to", to, "--kind", "request", "?",
            ])
            .ok()
            .trim()
            .to_owned()
    };
    let (first, second) = (ask("web"), ask("ops"));
    let waiter = spawn(
        &bridge,
        &["wait", &first, &second, "--any", "--timeout", "60s"],
    );
    bridge
        .doorbell(&["reply", &second, "--from", "ops", "--state", "failed", "no"])
        .ok();
    let (code, stdout, stderr) = finish(waiter);
    assert_eq!(code, 4, "failed ends badly: {stderr}");
    assert!(stdout.starts_with(&format!("{second}: failed")), "{stdout}");
    assert!(!stdout.contains(&first), "{stdout}");
    // Without --any, one unanswered request keeps the wait going until the timeout.
    let run = bridge.doorbell(&["wait", &first, &second, "--timeout", "1s"]);
    assert_eq!(run.code, 124, "{run:?}");
    assert!(run.stderr.contains(&first), "{}", run.stderr);
}

/// `wait` on the id `send` just printed, while the daemon is stopped (SIGSTOP, a long
/// catch-up): the request is in an inbox, not yet judged. The wait goes on to its answer or
/// its timeout instead of calling the id unknown; an id in no inbox still is.
#[test]
fn wait_on_a_request_the_judge_has_not_read_yet_waits_for_it() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    daemon.signal("STOP");
    let id = bridge.request("design", "web", "ETA?");
    let run = bridge.doorbell(&["wait", &id, "--timeout", "3s"]);
    assert_eq!(run.code, 124, "{run:?}");
    assert!(
        run.stderr.contains("timed out waiting for"),
        "{}",
        run.stderr
    );
    let unknown = bridge.doorbell(&["wait", "01NOSUCHREQUESTANYWHERE", "--timeout", "10s"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(
        unknown
            .stderr
            .contains("no request '01NOSUCHREQUESTANYWHERE'"),
        "{}",
        unknown.stderr
    );
    // An id only mentioned in a text not judged yet is no request on its way.
    bridge.append_raw(
        "web",
        br#"{"from":"design","text":"about 01ONLYMENTIONED and"#,
    );
    let mentioned = bridge.doorbell(&["wait", "01ONLYMENTIONED", "--timeout", "10s"]);
    assert_eq!(mentioned.code, 2, "{mentioned:?}");
    // Running again, the daemon judges it, and the wait begun before sees the answer.
    let waiter = spawn(&bridge, &["wait", &id, "--timeout", "60s"]);
    daemon.signal("CONT");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the request judged",
        |b| b.doorbell(&["show", &id]).code == 0,
    );
    bridge.reply(&id, "web", "completed", &[], "Friday");
    let (code, _, stderr) = finish(waiter);
    assert_eq!(code, 0, "{stderr}");
    daemon.kill();
}

/// `wait --json` on a request answered before the wait began says the answer, as it does
/// for one answered while it waits: the last response of the two.
#[test]
fn wait_on_a_request_answered_already_gives_its_answer() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let id = bridge
        .doorbell(&[
            "send", "--from", "design", "--to", "web", "--kind", "request", "?",
        ])
        .ok()
        .trim()
        .to_owned();
    for (state, text) in [("working", "on it"), ("completed", "the answer")] {
        bridge
            .doorbell(&["reply", &id, "--from", "web", "--state", state, text])
            .ok();
    }
    let run = bridge.doorbell(&["wait", &id, "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let doc: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap();
    assert_eq!(doc["state"], "completed", "{doc}");
    assert_eq!(
        doc["response"]["message"]["parts"][0]["text"], "the answer",
        "{doc}"
    );
}

/// Two answers to one request written while the judge is busy (a stopped daemon; an MCP
/// client's parallel calls): the second is refused at once, since the first closed the
/// request already, instead of being said sent and refused by the judge a moment later.
#[test]
fn a_second_closing_answer_written_before_the_first_is_judged_is_refused_at_once() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let id = bridge.request("design", "web", "ETA?");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the request judged",
        |b| b.verdict_count() == 1,
    );
    daemon.signal("STOP");
    bridge.reply(&id, "web", "completed", &[], "Friday");
    let second = bridge.doorbell(&["reply", &id, "--from", "web", "--state", "failed", "no"]);
    assert_ne!(second.code, 0, "{second:?}");
    assert!(
        second.stderr.contains("request-closed"),
        "{}",
        second.stderr
    );
    daemon.signal("CONT");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the answer judged",
        |b| b.verdict_count() == 2,
    );
    let verdicts: Vec<String> = bridge.verdicts().into_iter().map(|v| v.2).collect();
    assert_eq!(verdicts, ["accepted", "accepted"]);
    daemon.kill();
}

/// While the judge is stopped, a line that a line written before it (and not judged yet)
/// would make the judge refuse is refused at once: a second `input-required` from the same
/// addressee, a `rejected` after its `working`, an id sent again with other content. A retry
/// of the same message is not refused: the judge takes it for a duplicate.
#[test]
fn a_line_that_an_unjudged_line_would_get_refused_is_refused_at_once() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let asked = bridge.request("design", "web", "which font?");
    let other = bridge.request("design", "web", "the footer?");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the requests judged",
        |b| b.verdict_count() == 2,
    );
    daemon.signal("STOP");
    let refused = |args: &[&str], reason: &str| {
        let run = bridge.doorbell(args);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        assert!(run.stderr.contains(reason), "{args:?}: {}", run.stderr);
    };
    bridge.reply(&asked, "web", "input-required", &[], "for print?");
    refused(
        &[
            "reply",
            &asked,
            "--from",
            "web",
            "--state",
            "input-required",
            "or web?",
        ],
        "bad-transition",
    );
    bridge.reply(&other, "web", "working", &[], "on it");
    refused(
        &[
            "reply", &other, "--from", "web", "--state", "rejected", "no",
        ],
        "bad-transition",
    );
    let note = [
        "send", "--to", "web", "--from", "design", "--id", "n-1", "hello",
    ];
    bridge.doorbell(&note).ok();
    bridge.doorbell(&note).ok();
    refused(
        &[
            "send", "--to", "web", "--from", "design", "--id", "n-1", "bye",
        ],
        "id-reused",
    );
    // Nothing the judge will take is refused: a retry of a closing answer not judged yet
    // (a duplicate), and the requester's cancel of a request it asked itself.
    let done = [
        "reply",
        &other,
        "--from",
        "web",
        "--state",
        "completed",
        "--id",
        "done-1",
        "done",
    ];
    bridge.doorbell(&done).ok();
    bridge.doorbell(&done).ok();
    daemon.signal("CONT");
    let own = "own-1";
    bridge
        .doorbell(&[
            "send", "--from", "web", "--to", "web", "--kind", "request", "--id", own, "todo",
        ])
        .ok();
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "the request to itself judged",
        |b| b.verdict_count() == 9,
    );
    daemon.signal("STOP");
    bridge.reply(own, "web", "working", &[], "on it");
    bridge.doorbell(&["cancel", own, "--from", "web"]).ok();
    daemon.signal("CONT");
    bridge.wait_for(
        std::time::Duration::from_secs(20),
        "every line judged",
        |b| b.verdict_count() == 11,
    );
    let verdicts: Vec<String> = bridge.verdicts().into_iter().map(|v| v.2).collect();
    let count = |verdict: &str| verdicts.iter().filter(|v| *v == verdict).count();
    assert_eq!(
        (count("accepted"), count("duplicate")),
        (9, 2),
        "{verdicts:?}"
    );
    daemon.kill();
}

/// Append design's request `base.station` of broadcast `base` to `station`'s inbox, as
/// `send --to all` writes it.
fn broadcast_request(bridge: &Bridge, base: &str, station: &str) {
    let context = format!(r#","contextId":"{base}""#);
    let line = crate::util::line(
        &format!("{base}.{station}"),
        "design",
        station,
        "request",
        &context,
    );
    bridge.append_raw(station, format!("{line}\n").as_bytes());
}

/// The inotify instances process `pid` holds: a `wait` has one once it has looked at the
/// ledger and watches for what comes next.
fn watches(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |fds| {
        fds.flatten()
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter(|target| target.to_string_lossy() == "anon_inode:inotify")
            .count()
    })
}

#[test]
fn a_wait_on_a_broadcast_the_judge_has_not_read_yet_waits_for_its_answers() {
    let bridge = Bridge::with_agents(&["web", "design", "ops"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    // The judge is behind (busy, or stopped) when the broadcast is written and waited on.
    daemon.signal("STOP");
    let base = "01BROADCASTNOTJUDGED";
    for station in ["ops", "web"] {
        broadcast_request(&bridge, base, station);
    }
    let waiter = spawn(&bridge, &["wait", base, "--json", "--timeout", "60s"]);
    let pid = waiter.id();
    let patience = std::time::Duration::from_secs(20);
    crate::util::wait_in_proc(patience, "the wait to have looked", || watches(pid) > 0);
    daemon.signal("CONT");
    bridge.wait_for(patience, "the broadcast judged", |b| {
        b.verdicts().len() == 2
    });
    for station in ["ops", "web"] {
        let id = format!("{base}.{station}");
        bridge.reply(&id, station, "completed", &[], "done");
    }
    let (code, stdout, stderr) = finish(waiter);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

#[test]
fn a_wait_on_a_broadcast_judged_in_two_sweeps_waits_for_every_request() {
    let bridge = Bridge::with_agents(&["web", "design", "ops"]);
    let _daemon = crate::util::Daemon::start(&bridge, &[]);
    let base = "01BROADCASTTWOSWEEPS";
    let request = |station: &str| broadcast_request(&bridge, base, station);
    let patience = std::time::Duration::from_secs(20);
    // The judge has read one of the broadcast's inboxes when the wait begins.
    request("ops");
    bridge.wait_for(patience, "ops's request judged", |b| {
        b.verdicts().len() == 1
    });
    let waiter = spawn(&bridge, &["wait", base, "--json", "--timeout", "60s"]);
    let pid = waiter.id();
    crate::util::wait_in_proc(patience, "the wait to have looked", || watches(pid) > 0);
    request("web");
    bridge.wait_for(patience, "web's request judged", |b| {
        b.verdicts().len() == 2
    });
    for station in ["ops", "web"] {
        bridge.reply(
            &format!("{base}.{station}"),
            station,
            "completed",
            &[],
            "done",
        );
    }
    let (code, stdout, stderr) = finish(waiter);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");
}

/// The answer written while the daemon was stopped, a `wait` begun then (it found the lock
/// held, so it judged nothing), and the daemon killed: no write came after to wake the wait,
/// and it waited out its timeout. It judges what the daemon left once the lock goes.
#[test]
fn a_wait_judges_the_answer_a_killed_daemon_left_unjudged() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let patience = std::time::Duration::from_secs(20);
    let id = bridge.request("design", "web", "is the footer grey?");
    bridge.wait_for(patience, "the request judged", |b| b.verdicts().len() == 1);
    daemon.signal("STOP");
    bridge.append_raw(
        "design",
        response("01KILLEDANSWER", "web", "design", &id, "completed").as_bytes(),
    );
    let waiter = spawn(&bridge, &["wait", &id, "--json", "--timeout", "20s"]);
    let pid = waiter.id();
    crate::util::wait_in_proc(patience, "the wait to have looked", || watches(pid) > 0);
    daemon.kill();
    let (code, stdout, stderr) = finish(waiter);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("01KILLEDANSWER"), "{stdout}");
}

/// A response to `request` from `from` to `to` in state `state`, written by hand.
fn response(id: &str, from: &str, to: &str, request: &str, state: &str) -> String {
    let extra = format!(r#","correlatesTo":"{request}","contextId":"{request}","state":"{state}""#);
    format!("{}\n", crate::util::line(id, from, to, "response", &extra))
}

fn request(id: &str, from: &str, to: &str) -> String {
    format!("{}\n", crate::util::line(id, from, to, "request", ""))
}

/// Lines judged in one catch-up share their `seenAt`. The thread still lists them as they
/// were accepted, and `wait` shows the answer that ended the request (before: ties went by
/// id, so answers whose ids sort first came before their request, and `wait` showed the
/// `working` answer as the one that completed it).
#[test]
fn a_thread_judged_in_one_pass_is_in_the_order_it_was_accepted() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = "01ZZTIEDREQUEST";
    bridge.append_raw("web", request(asked, "design", "web").as_bytes());
    bridge.append_raw(
        "design",
        response("01AATIEDWORKING", "web", "design", asked, "working").as_bytes(),
    );
    bridge.append_raw(
        "design",
        response("01AATIEDDONE", "web", "design", asked, "completed").as_bytes(),
    );
    let thread: Vec<String> = bridge
        .doorbell(&["thread", asked, "--json"])
        .ok()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|m| m.get("trace").is_none())
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(thread, [asked, "01AATIEDWORKING", "01AATIEDDONE"]);
    let waited: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["wait", asked, "--json"]).ok()).unwrap();
    assert_eq!(waited["state"], "completed");
    assert_eq!(waited["response"]["id"], "01AATIEDDONE", "{waited}");
}

/// `wait --any` on requests answered before it began says the one answered first, whatever
/// the ids (before: the lowest id among the answered, and its exit code).
#[test]
fn wait_any_says_the_request_answered_first_not_the_first_by_id() {
    let bridge = Bridge::with_agents(&["web", "design", "ops"]);
    let (low, high) = ("01BBASKEDFIRST", "01CCASKEDSECOND");
    bridge.append_raw("web", request(low, "design", "web").as_bytes());
    bridge.append_raw("ops", request(high, "design", "ops").as_bytes());
    // ops answers first, in design's inbox; web after it.
    bridge.append_raw(
        "design",
        response("01DDOPSFAILED", "ops", "design", high, "failed").as_bytes(),
    );
    bridge.append_raw(
        "design",
        response("01EEWEBDONE", "web", "design", low, "completed").as_bytes(),
    );
    let run = bridge.doorbell(&["wait", low, high, "--any", "--timeout", "10s"]);
    assert_eq!(run.code, 4, "ops's failure came first: {run:?}");
    assert!(
        run.stdout.starts_with(&format!("{high}: failed")),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains(low), "{}", run.stdout);
}

/// The requester's own input after `input-required` hands the turn back: `wait --any` waits
/// for the addressee again, and shows the addressee's answer, never the requester's input
/// (before: it returned at once, showing the requester's own message as the answer).
#[test]
fn wait_any_after_the_requesters_input_waits_for_the_addressee() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let asked = "01FFASKEDFORINPUT";
    bridge.append_raw("web", request(asked, "design", "web").as_bytes());
    bridge.append_raw(
        "design",
        response("01FGWHICHCOLOUR", "web", "design", asked, "input-required").as_bytes(),
    );
    let answered = || -> serde_json::Value {
        let run = bridge.doorbell(&["wait", asked, "--any", "--json", "--timeout", "10s"]);
        serde_json::from_str(run.ok()).unwrap()
    };
    let before = answered();
    assert_eq!(before["response"]["id"], "01FGWHICHCOLOUR", "{before}");
    bridge.append_raw(
        "web",
        response("01FHBLUEPLEASE", "design", "web", asked, "working").as_bytes(),
    );
    let run = bridge.doorbell(&["wait", asked, "--any", "--json", "--timeout", "1s"]);
    assert_eq!(run.code, 124, "the turn is web's again: {run:?}");
    bridge.append_raw(
        "design",
        response("01FIDONEINBLUE", "web", "design", asked, "completed").as_bytes(),
    );
    let after = answered();
    assert_eq!(after["state"], "completed");
    assert_eq!(after["response"]["id"], "01FIDONEINBLUE", "{after}");
}
