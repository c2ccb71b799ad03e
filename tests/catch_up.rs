//! The judge's catch-up: every line judged once, across inboxes in any order.

use crate::util::{line, note_of, Bridge};

#[test]
fn responses_read_before_their_requests_are_accepted() {
    // `aaa` sorts first, so its inbox is read before the requests in `zzz`'s inbox.
    let bridge = Bridge::with_agents(&["aaa", "zzz"]);
    let mut responses = String::new();
    let mut requests = String::new();
    for i in 0..50 {
        let request = format!("01REQ{i:04}");
        requests += &line(&request, "aaa", "zzz", "request", "");
        requests += "\n";
        responses += &line(
            &format!("01RSP{i:04}"),
            "zzz",
            "aaa",
            "response",
            &format!(r#","correlatesTo":"{request}","state":"working""#),
        );
        responses += "\n";
        responses += &line(
            &format!("01FIN{i:04}"),
            "zzz",
            "aaa",
            "response",
            &format!(r#","correlatesTo":"{request}","state":"completed""#),
        );
        responses += "\n";
    }
    // A response to a request that exists nowhere is still refused.
    responses += &line(
        "01ORPHAN",
        "zzz",
        "aaa",
        "response",
        r#","correlatesTo":"01NOWHERE","state":"completed""#,
    );
    responses += "\n";
    bridge.append_raw("aaa", responses.as_bytes());
    bridge.append_raw("zzz", requests.as_bytes());
    let run = bridge.doorbell(&["daemon", "--once"]);
    run.ok();
    let verdicts = bridge.verdicts();
    assert_eq!(
        verdicts.len(),
        152,
        "every line judged exactly once, and the notice to zzz"
    );
    let refused: Vec<_> = verdicts.iter().filter(|v| v.2 != "accepted").collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].3.as_deref(), Some("unknown-request"));
    // Held lines were judged in their inbox's order: working before completed.
    assert_eq!(bridge.read_json("aaa", &[]).len(), 100);
    // The sender of the orphan is told, once.
    let notices: Vec<_> = bridge
        .read_json("zzz", &[])
        .into_iter()
        .filter(|m| m["envelope"]["from"] == "bridge")
        .collect();
    assert_eq!(notices.len(), 1);
    let text = notices[0]["envelope"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap();
    assert!(
        text.contains("'01ORPHAN' in aaa-inbox.jsonl: unknown-request"),
        "{text}"
    );
    // A second catch-up judges nothing again and tells nobody twice.
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(bridge.verdicts().len(), 152);
}

#[test]
fn a_killed_judge_resumes_without_judging_twice() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for i in 0..20 {
        bridge.send("design", "web", &format!("n{i}"));
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    // A torn last journal record, as a judge killed mid-write leaves it.
    let journal = bridge.dir().join(".doorbell/journal.jsonl");
    let mut bytes = std::fs::read(&journal).unwrap();
    let before = bridge.verdicts().len();
    bytes.extend_from_slice(br#"{"in":"web","o":12"#);
    std::fs::write(&journal, &bytes).unwrap();
    bridge.send("design", "web", "after");
    bridge.doorbell(&["daemon", "--once"]).ok();
    let verdicts = bridge.verdicts();
    assert_eq!(verdicts.len(), before + 1);
    let mut offsets: Vec<_> = verdicts.iter().map(|v| (v.0.clone(), v.1)).collect();
    offsets.dedup();
    assert_eq!(offsets.len(), verdicts.len(), "no line has two verdicts");
}

#[test]
fn a_second_judge_is_refused_with_exit_3() {
    let bridge = Bridge::with_agents(&["web"]);
    let lock_path = bridge.dir().join(".doorbell/lock");
    std::fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap();
    file.lock().unwrap();
    std::fs::write(&lock_path, "pid 4242 (doorbell daemon)\n").unwrap();
    let run = bridge.doorbell(&["daemon", "--once"]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(run.stderr.contains("pid 4242"), "{}", run.stderr);
    // Reading still works from the journal as it stands.
    assert_eq!(bridge.doorbell(&["read", "web"]).code, 0);
}

/// A backlog in several inboxes is read a round at a time (a megabyte of each in turn):
/// a line longer than a round is still judged whole, the lines after it too, and a
/// conversation split across the rounds of two inboxes is accepted.
#[test]
fn a_backlog_read_in_rounds_judges_a_line_longer_than_a_round() {
    let bridge = Bridge::with_agents(&["aaa", "zzz"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(&config, "max_line_bytes = 4194304\n").unwrap();
    let mut aaa = String::new();
    let mut zzz = String::new();
    for i in 0..3000 {
        aaa += &note_of(&format!("01AAA{i:05}"), "zzz", "aaa", 800);
        zzz += &note_of(&format!("01ZZZ{i:05}"), "aaa", "zzz", 800);
    }
    // The request is read in zzz's first round, its answer in aaa's last.
    zzz.insert_str(0, &(line("01REQUEST", "aaa", "zzz", "request", "") + "\n"));
    aaa += &note_of("01BIG", "zzz", "aaa", 2_500_000);
    aaa += &(line(
        "01ANSWER",
        "zzz",
        "aaa",
        "response",
        r#","correlatesTo":"01REQUEST","state":"completed""#,
    ) + "\n");
    aaa += &note_of("01AFTER", "zzz", "aaa", 100);
    bridge.append_raw("aaa", aaa.as_bytes());
    bridge.append_raw("zzz", zzz.as_bytes());
    let config = config.to_str().unwrap();
    let run = bridge.doorbell(&["daemon", "--once", "--config", config]);
    run.ok();
    assert!(
        run.stderr
            .contains("judged 6004 lines: 6004 accepted, 0 duplicate, 0 refused"),
        "{}",
        run.stderr
    );
    let ids: Vec<String> = bridge
        .read_json("aaa", &["--config", config])
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 3003, "{:?}", &ids[2990..]);
    assert_eq!(ids[2999..], ["01AAA02999", "01BIG", "01ANSWER", "01AFTER"]);
    assert!(
        ids.windows(2).take(2999).all(|w| w[0] < w[1]),
        "in the inbox's order"
    );
}

/// `daemon --once`, which must end within a minute (a catch-up that reads in circles fails
/// here instead of hanging the suite); its stderr.
fn once_within_a_minute(bridge: &Bridge) -> String {
    let child = bridge
        .command(&["daemon", "--once"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let (done, ended) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    let Ok(output) = ended.recv_timeout(std::time::Duration::from_secs(60)) else {
        let _ = std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status();
        panic!("daemon --once still ran after a minute");
    };
    let output = output.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    stderr
}

/// A line held for its request keeps judging behind it; the rounds after it go on from
/// where the last one stopped reading (they read the same megabyte again, for ever).
#[test]
fn a_held_line_before_a_megabyte_does_not_stop_the_rounds() {
    let bridge = Bridge::with_agents(&["aaa", "zzz"]);
    let mut aaa = line(
        "01NOREQUEST",
        "zzz",
        "aaa",
        "response",
        r#","correlatesTo":"01NOSUCHREQUEST","state":"completed""#,
    ) + "\n";
    for i in 0..1500 {
        aaa += &note_of(&format!("01AAA{i:05}"), "zzz", "aaa", 800);
    }
    bridge.append_raw("aaa", aaa.as_bytes());
    bridge.append_raw("zzz", note_of("01ZZZ00001", "aaa", "zzz", 10).as_bytes());
    let stderr = once_within_a_minute(&bridge);
    assert!(
        stderr.contains("judged 1503 lines: 1502 accepted, 0 duplicate, 1 refused"),
        "{stderr}"
    );
    let refused: Vec<_> = bridge
        .verdicts()
        .into_iter()
        .filter(|v| v.2 != "accepted")
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].3.as_deref(), Some("unknown-request"));
}

/// Two crossing conversations, each inbox's first response waiting for its turn behind a
/// line in the other inbox's second round: the rounds read on and every line is judged.
#[test]
fn turns_that_point_past_a_round_in_both_inboxes_are_judged() {
    let bridge = Bridge::with_agents(&["aaa", "zzz"]);
    let response = |id: &str, from: &str, to: &str, request: &str, state: &str, at: &str| {
        format!(
            r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"response","correlatesTo":"{request}","state":"{state}","createdAt":"2026-11-29T{at}Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{state}"}}]}}}}"#
        ) + "\n"
    };
    let mut aaa = line("01REQUEST2", "zzz", "aaa", "request", "") + "\n";
    aaa += &response("01A1", "zzz", "aaa", "01REQUEST1", "working", "10:02:00");
    let mut zzz = line("01REQUEST1", "aaa", "zzz", "request", "") + "\n";
    zzz += &response("01B2", "aaa", "zzz", "01REQUEST2", "working", "10:03:00");
    for i in 0..1500 {
        aaa += &note_of(&format!("01AAA{i:05}"), "zzz", "aaa", 800);
        zzz += &note_of(&format!("01ZZZ{i:05}"), "aaa", "zzz", 800);
    }
    aaa += &response("01A2", "zzz", "aaa", "01REQUEST2", "canceled", "10:00:00");
    zzz += &response("01B1", "aaa", "zzz", "01REQUEST1", "canceled", "10:01:00");
    bridge.append_raw("aaa", aaa.as_bytes());
    bridge.append_raw("zzz", zzz.as_bytes());
    let stderr = once_within_a_minute(&bridge);
    // In the order of their times, as a live judge would have them, each inbox's own order
    // kept: 01A2's cancel (10:00, but written after 01A1, 10:02) closes 01REQUEST2 before
    // 01B2's `working` (10:03), which is refused; 01B1's cancel (10:01, but written after
    // 01B2, 10:03) comes after 01A1's `working` (10:02), which stands.
    assert!(
        stderr.contains("judged 3007 lines: 3006 accepted, 0 duplicate, 1 refused"),
        "{stderr}"
    );
    let journal = bridge.journal();
    let mut refused: Vec<_> = journal
        .iter()
        .filter(|r| r["v"] == "r")
        .map(|r| (r["id"].as_str().unwrap(), r["reason"].as_str().unwrap()))
        .collect();
    refused.sort_unstable();
    assert_eq!(refused, [("01B2", "request-closed")], "{refused:?}");
}
