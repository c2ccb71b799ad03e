//! `doorbell read`: only accepted, complete lines; the cursor moves past what was judged and
//! never into a line; a replaced inbox is detected, not trusted.

use crate::util::{line, run_within, Bridge, WatchChild};

fn ids(records: &[serde_json::Value]) -> Vec<String> {
    records
        .iter()
        .map(|r| r["envelope"]["id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn read_twice_shows_nothing_the_second_time_and_peek_shows_the_same_twice() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for text in ["one", "two"] {
        bridge.send("design", "web", text);
    }
    let peek1 = bridge.read_json("web", &["--peek"]);
    let peek2 = bridge.read_json("web", &["--peek"]);
    assert_eq!(peek1.len(), 2);
    assert_eq!(ids(&peek1), ids(&peek2));
    assert_eq!(bridge.read_json("web", &[]).len(), 2);
    assert!(bridge.read_json("web", &[]).is_empty());
    assert_eq!(
        bridge.read_json("web", &["--all"]).len(),
        2,
        "--all shows read messages too"
    );
    bridge.send("design", "web", "three");
    let third = bridge.read_json("web", &[]);
    assert_eq!(third.len(), 1);
    assert_eq!(third[0]["envelope"]["message"]["parts"][0]["text"], "three");
}

#[test]
fn read_with_room_prints_what_fits_and_leaves_the_rest_unread_and_counted() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let texts: Vec<String> = (0..5).map(|n| format!("{n}{}", "x".repeat(900))).collect();
    for text in &texts {
        bridge.send("design", "web", text);
    }
    // Two messages fit in 2,500 characters; the other three stay unread, counted.
    let first = bridge.doorbell(&["read", "web", "--max-chars", "2500"]);
    let shown: Vec<&str> = first.ok().lines().filter(|l| l.contains("xxx")).collect();
    assert_eq!(shown.len(), 2, "{}", first.stdout);
    assert!(shown[0].contains(&texts[0]) && shown[1].contains(&texts[1]));
    assert!(
        first.stdout.trim_end().ends_with(
            "3 more messages are not shown here, for room: run `doorbell read web --max-chars 2500` again."
        ),
        "{}",
        first.stdout
    );
    // As JSON, one message per line; the count goes to stderr.
    let second = bridge.doorbell(&["read", "web", "--json", "--max-chars", "2500"]);
    let records: Vec<serde_json::Value> = second
        .ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0]["envelope"]["message"]["parts"][0]["text"],
        texts[2]
    );
    assert!(
        second.stderr.contains("1 more message is not shown"),
        "{}",
        second.stderr
    );
    // A message larger than the room is printed alone, whole.
    let third = bridge.doorbell(&["read", "web", "--max-chars", "10"]);
    assert!(third.ok().contains(&texts[4]), "{}", third.stdout);
    assert!(!third.stdout.contains("more message"), "{}", third.stdout);
    assert!(bridge.read_json("web", &[]).is_empty(), "all read once");
    // A read that moves no cursor, or reads from the start, cannot be run again for the
    // rest: it says what it left, not to run it again.
    for extra in [&["--all"][..], &["--all", "--peek"]] {
        let mut args = vec!["read", "web", "--max-chars", "2500"];
        args.extend_from_slice(extra);
        let run = bridge.doorbell(&args);
        assert!(
            run.ok()
                .trim_end()
                .ends_with("3 more messages are not shown here, past --max-chars 2500."),
            "{extra:?}: {}",
            run.stdout
        );
    }
}

/// The room is counted as the harness that keeps a shell tool's output counts it: in UTF-16
/// code units, where an emoji is two. Counted in characters, four texts of 450 emoji fitted
/// in 2,500 and Claude Code cut the middle of what it was shown, read.
#[test]
fn read_with_room_counts_an_emoji_as_the_harness_does() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for n in 0..5 {
        bridge.send("design", "web", &format!("{n}{}", "😀".repeat(450)));
    }
    let first = bridge.doorbell(&["read", "web", "--max-chars", "2500"]);
    let shown = first.ok().lines().filter(|l| l.contains('😀')).count();
    assert_eq!(shown, 2, "{}", first.stdout);
    assert!(
        first.stdout.contains("3 more messages are not shown here"),
        "{}",
        first.stdout
    );
}

/// The command `read` suggests for what did not fit runs as it says where it was run from:
/// with the binary's path when `PATH` finds no `doorbell`, and the `--dir` it was given (a
/// hook's environment). A bare `doorbell read` there was "not found".
#[test]
fn reads_suggestion_names_the_binary_and_the_folder_it_was_run_with() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for n in 0..3 {
        bridge.send("design", "web", &format!("{n}{}", "x".repeat(900)));
    }
    let dir = bridge.dir();
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_doorbell"));
    bridge.env(&mut command);
    command
        .env_remove("DOORBELL_DIR")
        .env("PATH", "/usr/bin:/bin")
        .args([
            "--dir",
            dir.to_str().unwrap(),
            "read",
            "web",
            "--max-chars",
            "1500",
        ]);
    let ran = crate::util::run(command, None);
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    let suggested = ran
        .stdout
        .lines()
        .last()
        .and_then(|line| line.split('`').nth(1))
        .unwrap_or_else(|| panic!("no command suggested: {}", ran.stdout))
        .to_owned();
    assert!(
        suggested.starts_with(env!("CARGO_BIN_EXE_doorbell"))
            && suggested.contains(&format!("--dir {}", dir.display())),
        "{suggested}"
    );
    let mut again = std::process::Command::new("sh");
    bridge.env(&mut again);
    again
        .env_remove("DOORBELL_DIR")
        .env("PATH", "/usr/bin:/bin")
        .args(["-c", &suggested]);
    let rest = crate::util::run(again, None);
    assert_eq!(rest.code, 0, "{suggested}: {}", rest.stderr);
    assert!(rest.stdout.contains("1xxx"), "{}", rest.stdout);
}

#[test]
fn a_partial_last_line_is_never_shown_and_the_cursor_stops_before_it() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let whole = line("01WHOLE", "design", "web", "note", "");
    let partial = line("01PART", "design", "web", "note", "");
    let (head, tail) = partial.split_at(40);
    bridge.append_raw("web", format!("{whole}\n{head}").as_bytes());
    assert_eq!(ids(&bridge.read_json("web", &[])), ["01WHOLE"]);
    let cursor: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(bridge.dir().join("web-inbox.cursor")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        cursor["offset"],
        whole.len() + 1,
        "the cursor is at the start of the partial line"
    );
    bridge.append_raw("web", format!("{tail}\n").as_bytes());
    assert_eq!(
        ids(&bridge.read_json("web", &[])),
        ["01PART"],
        "the completed line is shown whole"
    );
}

#[test]
fn refused_lines_are_not_shown_but_passed() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.append_raw("web", b"not json\n");
    bridge.send("design", "web", "good");
    assert_eq!(bridge.read_json("web", &[]).len(), 1);
    assert!(bridge.read_json("web", &[]).is_empty());
}

#[test]
fn a_cursor_on_a_replaced_inbox_is_detected_not_trusted() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for text in ["one", "two", "three"] {
        bridge.send("design", "web", text);
    }
    assert_eq!(bridge.read_json("web", &[]).len(), 3);
    // Replace the inbox by rename with a longer file of other messages.
    let replacement = bridge.dir().join("web-inbox.tmp");
    let mut content = String::new();
    for i in 0..5 {
        content += &line(&format!("01NEW{i}"), "design", "web", "note", "");
        content += "\n";
    }
    std::fs::write(&replacement, content).unwrap();
    std::fs::rename(&replacement, bridge.inbox("web")).unwrap();
    let run = bridge.doorbell(&["read", "web", "--json"]);
    run.ok();
    assert!(
        run.stderr.contains("replaced or truncated"),
        "{}",
        run.stderr
    );
    let got: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        ids(&got),
        ["01NEW0", "01NEW1", "01NEW2", "01NEW3", "01NEW4"]
    );
}

#[test]
fn a_truncated_inbox_is_read_again_from_the_start() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    for text in ["one", "two"] {
        bridge.send("design", "web", text);
    }
    assert_eq!(bridge.read_json("web", &[]).len(), 2);
    std::fs::OpenOptions::new()
        .write(true)
        .open(bridge.inbox("web"))
        .unwrap()
        .set_len(0)
        .unwrap();
    bridge.send("design", "web", "after truncation");
    let got = bridge.read_json("web", &[]);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0]["envelope"]["message"]["parts"][0]["text"],
        "after truncation"
    );
}

#[test]
fn human_output_escapes_terminal_controls() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    // Marks that reorder what a terminal shows, a zero-width space, a tag character and a
    // line separator come out escaped too.
    for text in [
        "hi \u{1b}[2J there",
        "pay \u{202e}01$\u{202c} now\u{2028}\u{2066}x\u{2069}\u{200b}\u{e0041}",
    ] {
        bridge.send("design", "web", text);
    }
    let out = bridge.doorbell(&["read", "web"]);
    let text = out.ok();
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(text.contains("hi \\u{1b}[2J there"), "{text}");
    assert!(
        !text.contains([
            '\u{202e}',
            '\u{202c}',
            '\u{2028}',
            '\u{2066}',
            '\u{2069}',
            '\u{200b}',
            '\u{e0041}'
        ]),
        "{text:?}"
    );
    assert!(text.contains("pay \\u{202e}01$\\u{202c} now"), "{text}");
    assert!(text.contains("note design → web"), "{text}");
}

/// Cursors are not synced, so a power loss can leave one unreadable: reading goes back to the
/// start, with a warning, rather than refusing to read at all.
#[test]
fn an_unreadable_cursor_means_reading_from_the_start() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    // Torn JSON, and bytes that are not even UTF-8: what a power loss leaves is anything.
    for garbage in [&b"\0\0{\"vers"[..], &b"\xff\xfe{\"version\":\xc3"[..]] {
        assert_eq!(bridge.read_json("web", &[]).len(), 1);
        std::fs::write(bridge.dir().join("web-inbox.cursor"), garbage).unwrap();
        let status = bridge.doorbell(&["status"]);
        assert_eq!(status.code, 0, "{}", status.stderr);
        let run = bridge.doorbell(&["read", "web", "--json"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        assert_eq!(run.stdout.lines().count(), 1, "shown again: {}", run.stdout);
        assert!(
            run.stderr.contains("cursor file cannot be read"),
            "{}",
            run.stderr
        );
        assert!(
            bridge.read_json("web", &[]).is_empty(),
            "and the cursor is whole again"
        );
        std::fs::write(bridge.dir().join("web-inbox.cursor"), b"").unwrap();
    }
}

/// A cursor path that cannot be read at all (a folder in its place) stops that agent's reader
/// with a clear error; status says it is the read position, not the inbox, that is wrong.
#[test]
fn a_cursor_that_cannot_be_opened_is_named_as_the_cursor() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    std::fs::create_dir(bridge.dir().join("web-inbox.cursor")).unwrap();
    let run = bridge.doorbell(&["read", "web"]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(run.stderr.contains("web-inbox.cursor"), "{}", run.stderr);
    let status = bridge.doorbell(&["status"]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert!(
        status.stderr.contains("web's read position cannot be read"),
        "{}",
        status.stderr
    );
    assert!(
        !status.stderr.contains("web's inbox cannot be read"),
        "{}",
        status.stderr
    );
}

#[test]
fn two_readers_of_one_agent_never_show_the_same_message() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let mut lines = String::new();
    for n in 0..2000 {
        lines.push_str(&line(&format!("01R{n:05}"), "design", "web", "note", ""));
        lines.push('\n');
    }
    std::fs::write(bridge.inbox("web"), lines).unwrap();
    bridge.doorbell(&["daemon", "--once"]).ok();
    // Two `read` loops, as two shells of one agent would run them, each until it sees
    // nothing three times in a row.
    let reader = || {
        let mut seen = Vec::new();
        let mut empty = 0;
        while empty < 3 {
            let ids: Vec<String> = bridge
                .read_json("web", &[])
                .iter()
                .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
                .collect();
            empty = if ids.is_empty() { empty + 1 } else { 0 };
            seen.extend(ids);
        }
        seen
    };
    let readers: Vec<Vec<String>> = std::thread::scope(|scope| {
        let handles = [scope.spawn(reader), scope.spawn(reader)];
        handles.map(|h| h.join().unwrap()).into()
    });
    let mut all: Vec<String> = readers.into_iter().flatten().collect();
    let shown = all.len();
    all.sort();
    all.dedup();
    assert_eq!(
        shown,
        all.len(),
        "{} messages shown twice",
        shown - all.len()
    );
    assert_eq!(all.len(), 2000, "every message shown once");
}

#[test]
fn a_cursor_temp_file_left_by_a_killed_reader_is_removed_by_the_next() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    // pid 4194305 is above the kernel's pid_max: no process has it. The test's own pid is
    // alive: a running reader's temp file is never touched.
    let dead = bridge.dir().join(".web-inbox.cursor.tmp.4194305");
    let alive = bridge
        .dir()
        .join(format!(".web-inbox.cursor.tmp.{}", std::process::id()));
    std::fs::write(&dead, "partial").unwrap();
    std::fs::write(&alive, "in flight").unwrap();
    // Where a reader makes its temp files now: `.doorbell/reads/`.
    let reads = bridge.dir().join(".doorbell/reads");
    std::fs::create_dir_all(&reads).unwrap();
    let dead_in_reads = reads.join(".web-inbox.cursor.tmp.4194305");
    std::fs::write(&dead_in_reads, "partial").unwrap();
    assert_eq!(bridge.read_json("web", &[]).len(), 1);
    assert!(!dead.exists(), "the dead reader's temp file is gone");
    assert!(!dead_in_reads.exists(), "and the one in .doorbell/reads/");
    assert!(alive.exists(), "a live one is kept");
    // What a reader writes on its way is hidden: nothing else appeared beside the inboxes.
    let visible: Vec<String> = std::fs::read_dir(bridge.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    let mut visible = visible;
    visible.sort();
    assert_eq!(
        visible,
        ["design-inbox.jsonl", "web-inbox.cursor", "web-inbox.jsonl"]
    );
}

/// The judge reads its own notices back whole even when they are longer than
/// `max_line_bytes`, and accepts them; a reader with the same config shows them too. It used
/// to skip every line longer than its limit, accepted or not: the sender never saw why its
/// line was refused.
#[test]
fn an_accepted_line_longer_than_max_line_bytes_is_shown() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(&config, "max_line_bytes = 300\n").unwrap();
    let config = config.to_str().unwrap();
    let bad = line(
        "01NOREQUEST",
        "design",
        "web",
        "response",
        r#","state":"completed""#,
    );
    bridge.append_raw("web", format!("{bad}\n").as_bytes());
    bridge
        .doorbell(&["daemon", "--once", "--config", config])
        .ok();
    let notice = &bridge.lines("design")[0];
    assert!(notice.len() > 300, "the notice is {} bytes", notice.len());
    let read = bridge.read_json("design", &["--config", config]);
    assert_eq!(read.len(), 1, "{read:?}");
    assert_eq!(read[0]["envelope"]["from"], "bridge");
    assert!(read[0]["envelope"].to_string().contains("01NOREQUEST"));
    // Read: the cursor moved past it.
    assert!(bridge.read_json("design", &["--config", config]).is_empty());
}

/// A blank line longer than the reader's limit, inside a run of blank lines refused as one,
/// is no message: the reader skips it and shows what follows.
#[test]
fn a_long_blank_line_inside_a_refused_run_is_not_shown() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let config = bridge.tmp.path().join("small.toml");
    std::fs::write(&config, "max_line_bytes = 300\n").unwrap();
    let config = config.to_str().unwrap();
    let after = line("01AFTERBLANKS", "design", "web", "note", "");
    bridge.append_raw(
        "web",
        format!("\n{}\n{after}\n", " ".repeat(400)).as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(
        ids(&bridge.read_json("web", &["--config", config])),
        ["01AFTERBLANKS"]
    );
}

/// Lines that name nobody, one after another, are refused as one run with one record; no
/// line inside the run is shown, not even one that reads as an envelope but for its id and
/// sender, and the message after the run is.
#[test]
fn no_line_of_a_refused_run_of_lines_that_name_nobody_is_shown() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let nameless = line("01NAMELESS", "design", "web", "note", "")
        .replace("01NAMELESS", "not an id")
        .replace(r#""from":"design""#, r#""from":"Not A Name""#);
    let after = line("01AFTERRUN", "design", "web", "note", "");
    bridge.append_raw(
        "web",
        format!("1\n{nameless}\n{{}}\n\n{after}\n").as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    one_run_and_only_the_message_after_it_read(&bridge);
}

/// A reader whose cursor lies inside a run judged as one (its lines judged one sweep at a
/// time, then together again after the journal was lost) passes over the rest of the run.
#[test]
fn a_cursor_inside_a_run_of_lines_that_name_nobody_shows_none_of_it() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let first = line("01BEFORERUN", "design", "web", "note", "");
    bridge.append_raw("web", format!("{first}\n1\n").as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(ids(&bridge.read_json("web", &[])), ["01BEFORERUN"]);
    let after = line("01AFTERRUN", "design", "web", "note", "");
    bridge.append_raw("web", format!("{{}}\n{after}\n").as_bytes());
    bridge.doorbell(&["daemon", "--once"]).ok();
    for file in ["journal.jsonl", "index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(bridge.dir().join(".doorbell").join(file));
    }
    bridge.doorbell(&["daemon", "--once"]).ok();
    one_run_and_only_the_message_after_it_read(&bridge);
}

/// web's refusals are one run, and `read` shows the message after it, `01AFTERRUN`, and
/// nothing of the run: no line of it, and no warning that one no longer reads as a message.
fn one_run_and_only_the_message_after_it_read(bridge: &Bridge) {
    let refused: Vec<_> = bridge
        .verdicts()
        .into_iter()
        .filter(|(_, _, verdict, _)| verdict == "refused")
        .collect();
    assert_eq!(refused.len(), 1, "one record for the run: {refused:?}");
    let read = bridge.doorbell(&["read", "web", "--json"]);
    let shown: Vec<serde_json::Value> = read
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(ids(&shown), ["01AFTERRUN"], "{read:?}");
    assert!(!read.stderr.contains("no longer reads"), "{read:?}");
}

/// `.doorbell/reads/` (the reader locks, the read logs) made a symlink is never written
/// through: a reader stops with an error that names it, shows nothing and moves nothing, and
/// once it is a folder again the message is there.
#[test]
fn a_symlinked_reads_folder_is_never_written_through() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    bridge.doorbell(&["daemon", "--once"]).ok();
    let elsewhere = bridge.tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let reads = bridge.dir().join(".doorbell/reads");
    let _ = std::fs::remove_dir_all(&reads);
    std::os::unix::fs::symlink(&elsewhere, &reads).unwrap();
    let run = bridge.doorbell(&["read", "web", "--json"]);
    assert_eq!(run.code, 2, "refused: {run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert!(
        run.stderr
            .contains(".doorbell/reads is not a regular file or folder"),
        "{}",
        run.stderr
    );
    let written: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().collect();
    assert!(written.is_empty(), "{written:?}");
    std::fs::remove_file(&reads).unwrap();
    assert_eq!(bridge.read_json("web", &[]).len(), 1, "the message, kept");
}

/// `.doorbell/` on another mount (a volume, a bind mount) cannot take a rename across it: the
/// cursor's temp file is made beside it instead, and the cursor moves. Played with a tmpfs
/// over `.doorbell/reads/` in a mount namespace of the reader's own.
#[test]
fn a_cursor_moves_when_its_state_folder_is_another_mount() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    bridge.send("design", "web", "two");
    bridge.doorbell(&["daemon", "--once"]).ok();
    let reads = bridge.dir().join(".doorbell/reads");
    std::fs::create_dir_all(&reads).unwrap();
    let mut command = std::process::Command::new("unshare");
    command.args(["--map-root-user", "--mount", "sh", "-c"]);
    command.arg(r#"mount -t tmpfs tmpfs "$1" && shift && exec "$@" read web --json"#);
    command
        .arg("sh")
        .arg(&reads)
        .arg(env!("CARGO_BIN_EXE_doorbell"));
    bridge.env(&mut command);
    let run = crate::util::run(command, None);
    assert_eq!(run.ok().lines().count(), 2, "{}", run.stderr);
    assert!(
        bridge.read_json("web", &[]).is_empty(),
        "the cursor moved past both"
    );
}

/// A `watch` whose output nobody reads (a paused pager) stays in its turn, holding the
/// agent's reader lock. `read`, and `read --wait` past its timeout, do not wait for it
/// without end: they name it and exit 3, having shown and moved nothing. Once its output is
/// read, the watch shows the message, once.
#[test]
fn a_read_behind_a_paused_watch_names_it_instead_of_hanging() {
    use std::io::{BufRead, Read};
    let bridge = Bridge::with_agents(&["web", "human"]);
    let mut watch = WatchChild::spawn(&bridge, "web");
    // More than a pipe holds: the watch's write of it blocks until the test reads.
    let text = "x".repeat(300_000);
    let id = bridge
        .doorbell_stdin(
            &["send", "--from", "human", "--to", "web", "-"],
            text.as_bytes(),
        )
        .ok()
        .trim()
        .to_owned();
    let mut output = std::io::BufReader::new(watch.0.stdout.take().unwrap());
    // Its first byte: the watch is in its turn now, and stays in it.
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut first = [0u8; 1];
        output.read_exact(&mut first).unwrap();
        tx.send(()).unwrap();
        output
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("the watch printed nothing");
    let within = std::time::Duration::from_secs(30);
    for args in [
        &["read", "web", "--json"][..],
        &["read", "web", "--json", "--wait", "--timeout", "1s"][..],
    ] {
        let run = run_within(bridge.command(args), within);
        assert_eq!(run.code, 3, "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?} showed {}", run.stdout);
        let watch_pid = format!("pid {}: doorbell watch web", watch.0.id());
        assert!(
            run.stderr.contains("another reader of web") && run.stderr.contains(&watch_pid),
            "{args:?} does not name the watch ({watch_pid}): {}",
            run.stderr
        );
    }
    // Its output read, the watch ends its turn: the message was shown once, by the watch.
    let mut output = reader.join().unwrap();
    let mut rest = String::new();
    output.read_line(&mut rest).unwrap();
    let shown: serde_json::Value = serde_json::from_str(&format!("{{{rest}")).unwrap();
    assert_eq!(shown["envelope"]["id"], id.as_str());
    assert_eq!(
        run_within(bridge.command(&["read", "web"]), within).ok(),
        ""
    );
}

/// Whether process `pid` holds `path` open.
fn holds_open(pid: u32, path: &std::path::Path) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target == path))
    })
}

/// A `read` waits for another reader's turn while the inbox is truncated in place and
/// written again (`: >`, a restore with `cp`). It shows what the judge accepted in the new
/// file, once: never a refused line, never old bytes, and it leaves the cursor on a line's
/// start, so the next reader works.
#[test]
fn a_read_that_waited_while_the_inbox_was_rewritten_in_place_shows_only_the_new_messages() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let patience = std::time::Duration::from_secs(20);
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    for n in 0..3 {
        bridge.send("design", "web", &format!("old {n}"));
    }
    assert_eq!(bridge.read_json("web", &[]).len(), 3);
    // Another reader's turn: the test holds web's reader lock.
    let lock_path = std::fs::canonicalize(bridge.dir().join(".doorbell/reads/web.lock")).unwrap();
    let lock = std::fs::File::open(&lock_path).unwrap();
    lock.lock().unwrap();
    let reader = bridge
        .command(&["read", "web", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Nothing is written while it waits: its open lock file is looked for in /proc.
    crate::util::wait_in_proc(patience, "the read to wait for its turn", || {
        holds_open(reader.id(), &lock_path)
    });
    // Meanwhile the inbox is emptied in place and written again.
    std::fs::write(bridge.inbox("web"), b"").unwrap();
    let refused = line("01MISADDRESSEDNEWLINE", "design", "design", "note", "");
    bridge.append_raw("web", format!("{refused}\n").as_bytes());
    let new: Vec<String> = ["new A, a little longer than the others", "new B", "new C"]
        .iter()
        .map(|text| bridge.send("design", "web", text))
        .collect();
    bridge.wait_for(patience, "the new file judged", |b| {
        b.journal()
            .iter()
            .filter(|r| r["in"] == "web" && r["g"] == 1 && r["v"] == "a")
            .count()
            == 3
    });
    drop(lock);
    let out = reader.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let m: serde_json::Value = serde_json::from_str(l).unwrap();
            m["envelope"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(shown, new, "the new messages, once");
    // The cursor is on a line's start: the next reads work and show what comes next.
    assert_eq!(bridge.doorbell(&["read", "web"]).ok(), "");
    let later = bridge.send("design", "web", "later");
    let read: Vec<_> = bridge
        .read_json("web", &[])
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(read, [later]);
    daemon.kill();
}

/// A process that holds an agent's cursor file locked (the cursor moves under `flock`, which
/// any tool may take) never hangs a reader: after a bounded wait it says so and exits, and
/// what it showed is shown again once the holder lets go.
#[test]
fn a_cursor_locked_by_another_process_fails_the_read_instead_of_hanging_it() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "first");
    bridge.read_json("web", &[]);
    let second = bridge.send("design", "web", "second");
    let cursor = std::fs::File::open(bridge.dir().join("web-inbox.cursor")).unwrap();
    cursor.lock().unwrap();
    let run = crate::util::run_within(
        bridge.command(&["read", "web"]),
        std::time::Duration::from_secs(40),
    );
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stderr.contains("locked by another process"), "{run:?}");
    cursor.unlock().unwrap();
    let again: Vec<String> = bridge
        .read_json("web", &[])
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(again, [second]);
}

#[test]
fn a_message_damaged_after_it_was_judged_is_passed_over_and_said_and_the_rest_is_read() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    // Past the first 4 KiB, which a file's marker covers (a change there is a new file).
    let ids: Vec<String> = (1..=40)
        .map(|n| {
            bridge
                .send("design", "web", &format!("message {n}"))
                .trim()
                .to_owned()
        })
        .collect();
    bridge.doorbell(&["daemon", "--once"]).ok();
    // A byte of the 30th line damaged in place: it no longer reads as JSON.
    let inbox = bridge.inbox("web");
    let bytes = std::fs::read(&inbox).unwrap();
    let thirtieth = bytes
        .split(|b| *b == b'\n')
        .take(30)
        .map(|l| l.len() + 1)
        .sum::<usize>();
    assert!(thirtieth > 4096);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&inbox)
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&file, b"X", (thirtieth - 3) as u64).unwrap();
    let read = bridge.doorbell(&["read", "web", "--json"]);
    assert_eq!(read.code, 0, "{read:?}");
    let shown: Vec<serde_json::Value> = read
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut expected = ids.clone();
    expected.remove(29);
    assert_eq!(self::ids(&shown), expected, "{}", read.stderr);
    assert!(
        read.stderr.contains("no longer reads as one"),
        "{}",
        read.stderr
    );
    // Read: nothing shown again.
    assert!(bridge.read_json("web", &[]).is_empty());
}
