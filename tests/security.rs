//! The security pass: each case from the attacker's angle. Another agent on the machine writes
//! whatever it likes into the bridge folder (symlinks, hostile names, borrowed ids, huge or
//! deep or countless lines, shell metacharacters) and the real `doorbell` binary and
//! `scripts/doorbell-send` must neither follow it, nor run it, nor fall over.
//!
//! The `long` feature (`DOORBELL_LONG=1 scripts/test`) adds the slow forms (a 1 GiB sparse line).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use doorbell_core::{
    judge_line, judge_stateless, Ledger, Limits, RefusalReason, Registry, Verdict,
};

use crate::util::{line, run, wait_for_file, Bridge, Daemon, Run, Watch, BIN};

const PATIENCE: Duration = Duration::from_secs(30);
const MIB: u64 = 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Every path under `root` with its kind and size, to prove a command changed nothing.
fn tree(root: &Path) -> BTreeMap<PathBuf, (String, u64)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            let kind = if meta.is_dir() {
                stack.push(entry.path());
                "dir"
            } else if meta.file_type().is_symlink() {
                "symlink"
            } else {
                "file"
            };
            let size = if meta.is_dir() { 0 } else { meta.len() };
            out.insert(entry.path(), (kind.to_owned(), size));
        }
    }
    out
}

/// `doorbell daemon --once` with optional extra global arguments; it must exit 0 and never
/// panic.
#[track_caller]
fn once(bridge: &Bridge, global: &[&str]) -> Run {
    let mut args = global.to_vec();
    args.extend(["daemon", "--once"]);
    let run = bridge.doorbell(&args);
    assert_eq!(run.code, 0, "daemon --once: {run:?}");
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    run
}

/// The verdict of the line at `offset` of `inbox`, its own or that of the run of lines that
/// name nobody it lies in: (verdict, reason).
fn verdict_at(bridge: &Bridge, inbox: &str, offset: u64) -> Option<(String, Option<String>)> {
    bridge
        .journal()
        .into_iter()
        .filter(|r| r["in"] == inbox && matches!(r["v"].as_str(), Some("a" | "d" | "r")))
        .find(|r| {
            let (start, span) = (r["o"].as_u64().unwrap(), r["n"].as_u64().unwrap_or(1));
            (start..start + span.max(1)).contains(&offset)
        })
        .map(|r| {
            let verdict = match r["v"].as_str() {
                Some("a") => "accepted",
                Some("d") => "duplicate",
                _ => "refused",
            };
            (verdict.to_owned(), r["reason"].as_str().map(str::to_owned))
        })
}

/// The lines of an inbox as JSON (lines that are not JSON are left out).
fn envelopes(bridge: &Bridge, inbox: &str) -> Vec<serde_json::Value> {
    bridge
        .lines(inbox)
        .iter()
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

/// Where each line of `bytes` starts.
fn starts(bytes: &[u8]) -> Vec<u64> {
    let mut out = vec![0];
    for (at, b) in bytes.iter().enumerate() {
        if *b == b'\n' && at + 1 < bytes.len() {
            out.push(at as u64 + 1);
        }
    }
    out
}

/// A config file in the test's folder.
fn config(bridge: &Bridge, text: &str) -> PathBuf {
    let path = bridge.tmp.path().join("doorbell.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The peak resident size (`VmHWM`) of a live process, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .expect("VmHWM in /proc/PID/status")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Stop a daemon with SIGTERM; it must exit 0.
#[track_caller]
fn stop(mut daemon: Daemon) {
    daemon.signal("TERM");
    assert_eq!(
        daemon.wait_exit(PATIENCE),
        Some(0),
        "stderr:\n{}",
        daemon.stderr.join("\n")
    );
}

/// A program's full path on `PATH`.
fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} not found on PATH"))
}

// ---------------------------------------------------------------------------------------------
// 1. A symlinked inbox.

#[test]
fn a_symlinked_inbox_is_never_read_or_written_through() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let outside = bridge.tmp.path().join("outside.jsonl");
    let planted = format!("{}\n", line("01PLANTED", "design", "x", "note", ""));
    std::fs::write(&outside, &planted).unwrap();
    std::os::unix::fs::symlink(&outside, bridge.inbox("x")).unwrap();
    // And one whose target does not exist yet: a writer that follows it would create it.
    let missing = bridge.tmp.path().join("created-outside.jsonl");
    std::os::unix::fs::symlink(&missing, bridge.inbox("z")).unwrap();
    bridge.send("design", "web", "a real line");

    let run = once(&bridge, &[]);
    assert!(
        run.stderr
            .contains("refusing an inbox that is not a regular file"),
        "no warning: {}",
        run.stderr
    );
    let verdicts = bridge.verdicts();
    assert!(
        verdicts.iter().all(|(inbox, ..)| inbox == "web"),
        "{verdicts:?}"
    );
    assert_eq!(verdicts.len(), 1, "{verdicts:?}");

    for to in ["x", "z"] {
        let send = bridge.doorbell(&["send", "--to", to, "--from", "design", "via link"]);
        assert_eq!(send.code, 2, "{send:?}");
        assert!(
            send.stderr.contains("not a regular file"),
            "{}",
            send.stderr
        );
        let script = bridge.script(&["--to", to, "--from", "design", "via link"], None);
        assert_eq!(script.code, 2, "{script:?}");
        assert!(script.stderr.contains("symlink"), "{}", script.stderr);
    }
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), planted);
    assert!(
        !missing.exists(),
        "a file was created through a dangling link"
    );
    once(&bridge, &[]);
    assert!(bridge.verdicts().iter().all(|(inbox, ..)| inbox == "web"));
}

/// Fake `date` and `flock` programs that swap the inbox for a symlink while the script runs:
/// `date` runs after the script's symlink check and before it opens the inbox; `flock` runs
/// after the open and puts the real inbox back, so a check by name alone passes again.
#[test]
fn a_symlinked_state_folder_is_never_followed() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let state = bridge.dir().join(".doorbell");
    let elsewhere = bridge.tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    // A live link (to a real folder) and a dangling one: both refused, naming the path.
    for target in [elsewhere.clone(), bridge.tmp.path().join("nowhere")] {
        let _ = std::fs::remove_dir_all(&state);
        let _ = std::fs::remove_file(&state);
        std::os::unix::fs::symlink(&target, &state).unwrap();
        for args in [&["daemon", "--once"][..], &["status"], &["read", "web"]] {
            let run = bridge.doorbell(args);
            assert_ne!(
                run.code,
                0,
                "{args:?} followed {}: {run:?}",
                target.display()
            );
            // And the advice keeps the state: move it back, never make an empty one.
            let said = format!(
                ".doorbell is not a folder (a symlink to {}",
                target.display()
            );
            assert!(
                run.stderr.contains(&said)
                    && run
                        .stderr
                        .contains("move the folder it points to back in its place"),
                "{args:?}: {}",
                run.stderr
            );
        }
        assert_eq!(
            std::fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "wrote through the link"
        );
    }
}

#[test]
fn a_symlinked_cursor_is_never_followed_and_hurts_no_other_agent() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    bridge.send("design", "web", "one");
    bridge.send("web", "design", "two");
    let secret = bridge.tmp.path().join("secret");
    std::fs::write(&secret, "do not touch").unwrap();
    let cursor = bridge.dir().join("web-inbox.cursor");
    std::os::unix::fs::symlink(&secret, &cursor).unwrap();
    // Everyone else works; web reads from the start (shown again, never lost).
    bridge.doorbell(&["status"]).ok();
    assert_eq!(bridge.read_json("design", &[]).len(), 1);
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1, "web's message, shown");
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "do not touch");
    // The link was replaced by web's own cursor: nothing is shown twice from now on.
    assert!(!cursor.symlink_metadata().unwrap().file_type().is_symlink());
    assert!(bridge.read_json("web", &[]).is_empty());
}

fn swapping_path(bridge: &Bridge, inbox: &Path, target: &Path) -> std::ffi::OsString {
    let bin = bridge.tmp.path().join("swap-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let saved = inbox.with_extension("saved");
    // `iconv` runs between the script's checks of the inbox and its open (it escapes a text
    // that is not plain ASCII); `flock` once the inbox is open.
    let iconv = format!(
        "#!/bin/sh\nif [ -f '{inbox}' ] && [ ! -L '{inbox}' ]; then mv '{inbox}' '{saved}' && ln -s '{target}' '{inbox}'; fi\nexec '{real}' \"$@\"\n",
        inbox = inbox.display(),
        saved = saved.display(),
        target = target.display(),
        real = which("iconv").display(),
    );
    let flock = format!(
        "#!/bin/sh\nif [ -L '{inbox}' ] && [ -f '{saved}' ]; then rm '{inbox}' && mv '{saved}' '{inbox}'; fi\nexec '{real}' \"$@\"\n",
        inbox = inbox.display(),
        saved = saved.display(),
        real = which("flock").display(),
    );
    for (name, text) in [("iconv", iconv), ("flock", flock)] {
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(
            &path,
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
        )
        .unwrap();
    }
    let mut path = std::ffi::OsString::from(bin.as_os_str());
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    path
}

#[test]
fn script_refuses_to_append_through_a_symlink() {
    // The name is swapped for a link to a file outside between the script's check and its
    // open, and swapped back before its re-check: the outside file must stay untouched. The
    // file it locked is not the one the name names once the lock is held (as after a
    // rotation): it opens the name again and writes to the inbox there.
    let bridge = Bridge::with_agents(&["web", "design"]);
    let outside = bridge.tmp.path().join("victim.txt");
    std::fs::write(&outside, "precious\n").unwrap();
    let path = swapping_path(&bridge, &bridge.inbox("web"), &outside);
    let mut command = bridge.script_command(&["--to", "web", "--from", "design", "SWAPPÉ"]);
    command.env("PATH", &path);
    let script = run(command, None);
    assert_eq!(
        std::fs::read_to_string(&outside).unwrap(),
        "precious\n",
        "the script wrote through a symlink: {script:?}"
    );
    assert_eq!(script.code, 0, "{script:?}");
    let lines = bridge.lines("web");
    assert_eq!(lines.len(), 1, "{script:?}");
    assert!(String::from_utf8_lossy(&lines[0]).contains(script.stdout.trim()));

    // A link to a file that does not exist: following it with `>>` would create it.
    let bridge = Bridge::with_agents(&["web", "design"]);
    let created = bridge.tmp.path().join("created.txt");
    let path = swapping_path(&bridge, &bridge.inbox("web"), &created);
    let mut command = bridge.script_command(&["--to", "web", "--from", "design", "SWAPPÉ"]);
    command.env("PATH", &path);
    let script = run(command, None);
    assert_ne!(script.code, 0, "{script:?}");
    assert!(
        !created.exists(),
        "the script created a file through a symlink: {script:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Hostile names.

const BAD_NAMES: [&str; 11] = [
    "../x",
    "..",
    "a/b",
    "/tmp/x",
    "é",
    "wéb",
    "x\u{202e}y",
    "",
    "a b",
    "Web",
    "-rf",
];

#[test]
fn hostile_names_on_the_command_line_exit_2_and_write_nothing() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let long = "a".repeat(65);
    let before = tree(bridge.tmp.path());
    for name in BAD_NAMES.iter().copied().chain([long.as_str()]) {
        for (to, from) in [(name, "design"), ("web", name)] {
            let to_flag = format!("--to={to}");
            let from_flag = format!("--from={from}");
            let send = bridge.doorbell(&["send", &to_flag, &from_flag, "hi"]);
            assert_eq!(send.code, 2, "send {to:?} {from:?}: {send:?}");
            assert!(
                send.stderr.contains("is not a valid agent name"),
                "{send:?}"
            );
            let script = bridge.script(&[&to_flag, &from_flag, "hi"], None);
            assert_eq!(script.code, 2, "script {to:?} {from:?}: {script:?}");
            assert!(script.stderr.contains("invalid agent name"), "{script:?}");
            for run in [&send, &script] {
                assert!(!run.stderr.contains("panicked"), "{run:?}");
            }
        }
        let add = bridge.doorbell(&["agent", "add", name]);
        assert_eq!(add.code, 2, "agent add {name:?}: {add:?}");
    }
    // NUL cannot travel in an argument; through stdin it is refused by both senders.
    let send = bridge.doorbell_stdin(&["send", "--to", "web", "--from", "design", "-"], b"a\0b");
    assert_eq!(send.code, 2, "{send:?}");
    let script = bridge.script(&["--to", "web", "--from", "design"], Some(b"a\0b"));
    assert_eq!(script.code, 2, "{script:?}");
    assert_eq!(tree(bridge.tmp.path()), before, "something was written");
}

#[test]
fn hostile_names_inside_envelopes_are_refused_with_their_reason() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut lines = Vec::new();
    for bad in [
        "../x",
        "..",
        "a/b",
        "/etc/passwd",
        "é",
        "\\u0000",
        "x\\u0000y",
        "a\\/b",
    ] {
        lines.push((line("01TO", "design", bad, "note", ""), "bad-field"));
        lines.push((line("01FROM", bad, "web", "note", ""), "bad-field"));
    }
    // A raw NUL or a raw control byte inside a JSON string is not JSON.
    lines.push((line("01RAWNUL", "design", "we\0b", "note", ""), "bad-json"));
    lines.push((line("01RAWNUL2", "des\0ign", "web", "note", ""), "bad-json"));
    // A valid name that is not this inbox's owner, and one that is nobody.
    lines.push((line("01DOTS", "design", "a..b", "note", ""), "misaddressed"));
    lines.push((
        line("01NOBODY", "a..b", "web", "note", ""),
        "unknown-sender",
    ));
    let mut text = String::new();
    for (l, _) in &lines {
        text.push_str(l);
        text.push('\n');
    }
    bridge.append_raw("web", text.as_bytes());
    let before: BTreeSet<PathBuf> = tree(&bridge.dir()).into_keys().collect();
    once(&bridge, &[]);
    let offsets = starts(text.as_bytes());
    for ((l, reason), offset) in lines.iter().zip(offsets) {
        assert_eq!(
            verdict_at(&bridge, "web", offset),
            Some(("refused".to_owned(), Some((*reason).to_owned()))),
            "{l}"
        );
    }
    // Nothing new in the folder but the judge's own state.
    let after: BTreeSet<PathBuf> = tree(&bridge.dir()).into_keys().collect();
    let new: Vec<&PathBuf> = after
        .difference(&before)
        .filter(|p| !p.starts_with(bridge.dir().join(".doorbell")))
        .collect();
    assert!(new.is_empty(), "{new:?}");
    assert!(tree(bridge.tmp.path())
        .keys()
        .all(|p| p.starts_with(bridge.tmp.path())));
    // Only design, a station, hears of its refusals; nothing is addressed to a bad name.
    for inbox in ["web", "human"] {
        assert!(envelopes(&bridge, inbox)
            .iter()
            .all(|e| e["from"] != "bridge"));
    }
    let notices: Vec<_> = envelopes(&bridge, "design")
        .into_iter()
        .filter(|e| e["from"] == "bridge")
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
}

#[test]
fn hostile_inbox_file_names_are_never_read_as_inboxes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let planted = |to: &str| format!("{}\n", line("01PLANTED", "design", to, "note", ""));
    let mut foreign: Vec<PathBuf> = ["é", "Web", "-x", ".hidden", "", "a b", "wéb"]
        .iter()
        .map(|name| {
            let path = bridge.inbox(name);
            std::fs::write(&path, planted(name)).unwrap();
            path
        })
        .collect();
    // A file name that is not UTF-8 at all.
    let raw = bridge
        .dir()
        .join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"\xff-inbox.jsonl"));
    std::fs::write(&raw, planted("x")).unwrap();
    foreign.push(raw);
    // `a..b` is a valid name without a slash: a station like any other, inside the folder.
    std::fs::write(bridge.inbox("a..b"), planted("a..b")).unwrap();
    let foreign_before: Vec<Vec<u8>> = foreign.iter().map(|p| std::fs::read(p).unwrap()).collect();

    once(&bridge, &[]);
    let judged: BTreeSet<String> = bridge.verdicts().into_iter().map(|v| v.0).collect();
    assert_eq!(judged, BTreeSet::from(["a..b".to_owned()]));
    for command in [
        &["status"][..],
        &["agent", "list"],
        &["check"],
        &["debts"],
        &["report"],
    ] {
        let run = bridge.doorbell(command);
        assert!(run.code == 0 || run.code == 2, "{command:?}: {run:?}");
        assert!(!run.stderr.contains("panicked"), "{command:?}: {run:?}");
    }
    let list = bridge.doorbell(&["agent", "list"]);
    assert!(list.stdout.contains("a..b"), "{list:?}");
    assert!(
        !list.stdout.contains("Web") && !list.stdout.contains('é'),
        "{list:?}"
    );
    let id = bridge.send("design", "a..b", "hello dots");
    assert!(envelopes(&bridge, "a..b")
        .iter()
        .any(|e| e["id"] == id.as_str()));
    for (path, bytes) in foreign.iter().zip(&foreign_before) {
        assert_eq!(&std::fs::read(path).unwrap(), bytes, "{}", path.display());
    }
    assert!(!bridge.tmp.path().join("b-inbox.jsonl").exists());
}

/// A file named for a `[[loop]]` of the config (one `touch` away for anyone who can write to
/// the folder) is no inbox and stops nothing: judging goes on, neither sender writes to it,
/// the loop sends by its rules, `status` and a restarted daemon say so.
#[test]
fn a_file_named_for_a_config_loop_is_no_inbox_and_stops_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.config("[[loop]]\nname = \"cron\"\nowner = \"design\"\n");
    let mut daemon = Daemon::start(&bridge, &[]);
    let accepted_in_web = |bridge: &Bridge| {
        bridge
            .verdicts()
            .iter()
            .filter(|v| v.0 == "web" && v.2 == "accepted")
            .count()
    };
    bridge.send("design", "web", "before");
    bridge.wait_for(Duration::from_secs(10), "the first note", |b| {
        accepted_in_web(b) == 1
    });
    // Anyone who can write to the folder makes one, and writes to it.
    std::fs::write(bridge.inbox("cron"), "").unwrap();
    let to_cron = line("01TOCRON", "design", "cron", "request", "");
    bridge.append_raw("cron", format!("{to_cron}\n").as_bytes());
    let after = line("01AFTERCRON", "design", "web", "request", "");
    bridge.append_raw("web", format!("{after}\n").as_bytes());
    bridge.wait_for(Duration::from_secs(10), "the line after it", |b| {
        accepted_in_web(b) == 2
    });
    assert!(
        !bridge.verdicts().iter().any(|v| v.0 == "cron"),
        "the loop's file was read as an inbox"
    );
    // Neither sender writes to it; the loop sends by its rules, whatever files there are.
    let sent = bridge.doorbell(&["send", "--from", "design", "--to", "cron", "hi"]);
    assert_eq!(sent.code, 2, "{sent:?}");
    assert!(sent.stderr.contains("[[loop]]"), "{}", sent.stderr);
    let script = bridge.script(&["--from", "design", "--to", "cron", "hi"], None);
    assert_eq!(script.code, 2, "{script:?}");
    let response = [
        "--from",
        "cron",
        "--to",
        "web",
        "--kind",
        "response",
        "--state",
        "completed",
        "--correlates-to",
        "01AFTERCRON",
        "done",
    ];
    for sent in [
        bridge.doorbell(&[&["send"][..], &response].concat()),
        bridge.script(&response, None),
    ] {
        assert_eq!(sent.code, 2, "{sent:?}");
        assert!(
            sent.stderr.contains("loops never send responses"),
            "{sent:?}"
        );
    }
    bridge.send("cron", "web", "a loop's note");
    bridge
        .script(&["--from", "cron", "--to", "web", "another"], None)
        .ok();
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("cron-inbox.jsonl is no inbox and nothing reads it"),
        "{}",
        status.stderr
    );
    // A restart judges on.
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(Duration::from_secs(10)), Some(0));
    let mut daemon = Daemon::start(&bridge, &[]);
    daemon.expect_stderr("cron-inbox.jsonl is no inbox", Duration::from_secs(10));
    bridge.wait_for(Duration::from_secs(10), "the loop's notes", |b| {
        accepted_in_web(b) == 4
    });
}

#[test]
fn a_reload_naming_a_loop_owner_that_is_no_station_stops_no_judging() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    bridge.config("[[loop]]\nname = \"cron\"\nowner = \"ops\"\n");
    daemon.signal("HUP");
    daemon.expect_stderr(
        "names 'ops' as its owner, which is no station",
        Duration::from_secs(10),
    );
    let ask = line("01CRONASKS", "cron", "web", "request", "");
    let note = line("01CRONNOTE", "cron", "web", "note", "");
    bridge.append_raw("web", format!("{ask}\n{note}\n").as_bytes());
    bridge.wait_for(Duration::from_secs(10), "both lines judged", |b| {
        b.verdicts().len() == 2
    });
    let verdicts = bridge.verdicts();
    assert_eq!(verdicts[0].2, "refused", "{verdicts:?}");
    assert_eq!(verdicts[1].2, "accepted", "{verdicts:?}");
    let shown = bridge.doorbell(&["show", "01CRONASKS"]).ok().to_owned();
    assert!(shown.contains("whose owner 'ops' is no station"), "{shown}");
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("names 'ops' as its owner, which is no station"),
        "{}",
        status.stderr
    );
}

/// An inbox file made by hand for a name no station may have (a built-in loop's, `all`) makes
/// no station: nothing reads it, `status` says so, a request to it or from it is refused,
/// and a broadcast goes to the stations only (before: `bridge` became a station owing debts
/// no loop could pay).
#[test]
fn inbox_files_for_reserved_names_make_no_station() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    for name in ["all", "bridge", "debt-loop"] {
        std::fs::write(bridge.inbox(name), "").unwrap();
    }
    let to_bridge = line("01TOBRIDGE", "design", "bridge", "request", "");
    bridge.append_raw("bridge", format!("{to_bridge}\n").as_bytes());
    let from_all = line("01FROMALL", "all", "web", "request", "");
    bridge.append_raw("web", format!("{from_all}\n").as_bytes());
    let sent = bridge.doorbell(&[
        "send", "--from", "design", "--to", "all", "--kind", "request", "who?",
    ]);
    let stations: BTreeSet<&str> = sent
        .ok()
        .lines()
        .filter_map(|id| id.rsplit_once('.').map(|(_, station)| station))
        .collect();
    assert_eq!(stations, BTreeSet::from(["web", "human"]));
    once(&bridge, &[]);
    let debtors: BTreeSet<String> =
        serde_json::from_str::<serde_json::Value>(bridge.doorbell(&["debts", "--json"]).ok())
            .unwrap()["debts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["debtor"].as_str().unwrap().to_owned())
            .collect();
    assert_eq!(
        debtors,
        BTreeSet::from(["web".to_owned(), "human".to_owned()])
    );
    let judged: BTreeSet<String> = bridge.verdicts().into_iter().map(|v| v.0).collect();
    assert!(
        !judged.contains("bridge"),
        "a reserved inbox was read: {judged:?}"
    );
    assert!(
        bridge
            .verdicts()
            .iter()
            .any(|v| v.0 == "web" && v.2 == "refused"),
        "the request from 'all' was accepted"
    );
    let status = bridge.doorbell(&["status"]);
    assert!(
        status
            .stderr
            .contains("bridge-inbox.jsonl is no inbox and nothing reads it"),
        "{}",
        status.stderr
    );
    for to in ["all", "bridge"] {
        let script = bridge.script(&["--to", to, "--from", "design", "hi"], None);
        assert_eq!(script.code, 2, "{to}: {script:?}");
    }
}

/// A file name is chosen by whoever can write in the folder: its terminal escapes never
/// reach the terminal raw, in a log line, a warning, the board, or an error.
#[test]
fn terminal_escapes_in_file_names_reach_no_terminal_raw() {
    let bridge = Bridge::with_agents(&["web", "design"]);
    let name = "web\x1b]0;owned\x07\x1b[2J\x1b[31m\u{9b}31m";
    std::fs::write(bridge.dir().join(format!("{name}-inbox.jsonl")), "x\n").unwrap();
    bridge.send("design", "web", "hello");
    let dir = bridge.dir().display().to_string();
    let hostile_dir = format!("{dir}/{name}");
    for command in [
        &["read", "web"][..],
        &["status"],
        &["status", "--format", "markdown"],
        &["check", &hostile_dir],
        &["read", &format!("web{name}")],
    ] {
        let run = bridge.doorbell(command);
        assert!(!run.stderr.contains("panicked"), "{command:?}: {run:?}");
        for (what, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
            assert!(
                !text.contains(['\x1b', '\x07', '\u{9b}']),
                "{command:?}: raw escapes on {what}: {text:?}"
            );
        }
    }
    let status = bridge.doorbell(&["status"]);
    assert!(
        status.stderr.contains("web\\u{1b}]0;owned"),
        "the name is said, escaped: {status:?}"
    );
    // As JSON (for machines, as `read --json` is), the name as it is, escaped by JSON alone.
    let json: serde_json::Value =
        serde_json::from_str(bridge.doorbell(&["status", "--json"]).ok()).unwrap();
    assert!(
        json["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("web\x1b]0;owned")),
        "{json}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Reserved ids and built-in loop names used by others.

#[test]
fn builtin_loop_names_and_reserved_ids_from_others_are_refused_borrowed_name() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let request = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "a question",
        ])
        .ok()
        .trim()
        .to_owned();
    once(&bridge, &[]);
    let correlates = format!(r#","correlatesTo":"{request}""#);
    let forged = [
        line("01FAKEBRIDGE", "bridge", "web", "note", ""),
        line("01FAKEDEBT", "debt-loop", "web", "note", &correlates),
        line("01FAKEREPORT", "report-loop", "web", "note", ""),
        line(
            "bridge:refused:0123456789abcdef0123456789abcdef",
            "design",
            "web",
            "note",
            "",
        ),
        line(
            "ring:0123456789abcdef:0:1",
            "design",
            "web",
            "note",
            &correlates,
        ),
        line("escalation:0123456789abcdef:0", "design", "web", "note", ""),
        line("report:2026-11-29", "design", "web", "note", ""),
        // A response that would close the request, under a borrowed name.
        line(
            "01FAKECLOSE",
            "debt-loop",
            "web",
            "response",
            &format!(r#"{correlates},"state":"canceled""#),
        ),
    ];
    let start = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    let text: String = forged.iter().flat_map(|l| [l.as_str(), "\n"]).collect();
    bridge.append_raw("web", text.as_bytes());
    once(&bridge, &[]);
    for (l, offset) in forged.iter().zip(starts(text.as_bytes())) {
        assert_eq!(
            verdict_at(&bridge, "web", start + offset),
            Some(("refused".to_owned(), Some("borrowed-name".to_owned()))),
            "{l}"
        );
    }
    // The request is still open, owed by web.
    let debts = bridge.doorbell(&["debts", "--json"]);
    assert!(debts.ok().contains(&request), "{debts:?}");
    // Built-in loops are never answered; design, a station, is told once.
    let notices: Vec<_> = envelopes(&bridge, "design")
        .into_iter()
        .filter(|e| e["from"] == "bridge")
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    let text = notices[0]["message"]["parts"][0]["text"].as_str().unwrap();
    assert_eq!(text.matches("borrowed-name").count(), 4, "{text}");
    // Both senders refuse to write such lines at all.
    for args in [
        &["--to", "web", "--from", "bridge", "x"][..],
        &["--to", "web", "--from", "debt-loop", "x"],
        &["--to", "web", "--from", "design", "--id", "ring:0:0:1", "x"],
        &[
            "--to",
            "web",
            "--from",
            "design",
            "--id",
            "report:2026-11-29",
            "x",
        ],
    ] {
        let mut send = vec!["send"];
        send.extend_from_slice(args);
        let run = bridge.doorbell(&send);
        assert_eq!(run.code, 2, "{args:?}: {run:?}");
        let script = bridge.script(args, None);
        assert_eq!(script.code, 2, "{args:?}: {script:?}");
    }
}

#[test]
fn a_forged_report_note_id_does_not_stop_the_real_note() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.send("design", "web", "some traffic");
    let out = bridge.doorbell(&["report", "--daily"]);
    out.ok();
    let reports: Vec<String> = std::fs::read_dir(bridge.dir().join("reports"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let date = reports[0].strip_suffix(".md").unwrap().to_owned();
    // The next day's note id, forged before that report exists, by a station and as the loop.
    let next =
        chrono::NaiveDate::parse_from_str(&date, "%Y-%m-%d").unwrap() + chrono::Duration::days(1);
    let forged_id = format!("report:{}", next.format("%Y-%m-%d"));
    let forged = format!(
        "{}\n{}\n",
        line(&forged_id, "report-loop", "human", "note", ""),
        line(&forged_id, "design", "human", "note", "")
    );
    let start = std::fs::metadata(bridge.inbox("human")).unwrap().len();
    bridge.append_raw("human", forged.as_bytes());
    once(&bridge, &[]);
    for offset in starts(forged.as_bytes()) {
        assert_eq!(
            verdict_at(&bridge, "human", start + offset),
            Some(("refused".to_owned(), Some("borrowed-name".to_owned())))
        );
    }
    // Today's real note is there and accepted, once.
    let real = format!("report:{date}");
    let human = std::fs::read(bridge.inbox("human")).unwrap();
    let notes: Vec<u64> = starts(&human)
        .into_iter()
        .filter(|&o| {
            let rest = &human[o as usize..];
            let end = rest.iter().position(|&b| b == b'\n').unwrap();
            serde_json::from_slice::<serde_json::Value>(&rest[..end])
                .is_ok_and(|e| e["id"] == real.as_str() && e["from"] == "report-loop")
        })
        .collect();
    assert_eq!(notes.len(), 1, "{}", String::from_utf8_lossy(&human));
    assert_eq!(
        verdict_at(&bridge, "human", notes[0]),
        Some(("accepted".to_owned(), None))
    );
}

#[test]
fn a_forged_line_cannot_close_a_pending_notice_intent() {
    // A refusal's notice is journaled as an intent, then written. Simulate a judge killed
    // between the two (journal cut after the intent, the notice not in the inbox), then let
    // another agent write a line with the intent's id before the judge comes back.
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line("01BAD", "web", "design", "note", r#","priority":9"#)
        )
        .as_bytes(),
    );
    once(&bridge, &[]);
    let state = bridge.dir().join(".doorbell");
    let journal = std::fs::read_to_string(state.join("journal.jsonl")).unwrap();
    let cut = journal
        .lines()
        .position(|l| l.contains(r#""v":"i""#))
        .expect("the notice's intent");
    let intent: serde_json::Value =
        serde_json::from_str(journal.lines().nth(cut).unwrap()).unwrap();
    let id = intent["id"].as_str().unwrap().to_owned();
    assert_eq!(intent["in"], "web");
    let kept: String = journal
        .lines()
        .take(cut + 1)
        .flat_map(|l| [l, "\n"])
        .collect();
    std::fs::write(state.join("journal.jsonl"), kept).unwrap();
    for file in ["index.db", "index.db-wal", "index.db-shm"] {
        let _ = std::fs::remove_file(state.join(file));
    }
    std::fs::write(bridge.inbox("web"), "").unwrap();

    // The forgery: the notice's id, as the bridge and as design, in web's inbox and design's.
    let forged_web = format!(
        "{}\n",
        line(&id, "bridge", "web", "note", "").replace("from bridge", "all is well")
    );
    bridge.append_raw("web", forged_web.as_bytes());
    let design_start = std::fs::metadata(bridge.inbox("design")).unwrap().len();
    bridge.append_raw(
        "design",
        format!("{}\n", line(&id, "design", "design", "note", "")).as_bytes(),
    );
    once(&bridge, &[]);

    assert_eq!(
        verdict_at(&bridge, "web", 0),
        Some(("refused".to_owned(), Some("borrowed-name".to_owned()))),
        "the forged notice was taken for the bridge's own"
    );
    assert_eq!(
        verdict_at(&bridge, "design", design_start),
        Some(("refused".to_owned(), Some("borrowed-name".to_owned())))
    );
    // The real notice was still written, and accepted.
    let web = std::fs::read(bridge.inbox("web")).unwrap();
    let real: Vec<u64> = starts(&web)
        .into_iter()
        .skip(1)
        .filter(|&o| {
            let rest = &web[o as usize..];
            let end = rest.iter().position(|&b| b == b'\n').unwrap();
            serde_json::from_slice::<serde_json::Value>(&rest[..end]).is_ok_and(|e| {
                e["id"] == id.as_str()
                    && e["message"]["parts"][0]["text"]
                        .as_str()
                        .is_some_and(|t| t.contains("'01BAD'"))
            })
        })
        .collect();
    assert_eq!(real.len(), 1, "{}", String::from_utf8_lossy(&web));
    assert_eq!(
        verdict_at(&bridge, "web", real[0]),
        Some(("accepted".to_owned(), None))
    );
}

// ---------------------------------------------------------------------------------------------
// 4. A huge line.

/// Append `len` bytes of `x` (or a hole, when `sparse`) and a newline to `path`.
fn append_huge(path: &Path, len: u64, sparse: bool) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    if sparse {
        let at = file.metadata().unwrap().len();
        file.set_len(at + len).unwrap();
    } else {
        let chunk = vec![b'x'; MIB as usize];
        for _ in 0..len / MIB {
            file.write_all(&chunk).unwrap();
        }
        file.write_all(&chunk[..(len % MIB) as usize]).unwrap();
    }
    file.write_all(b"\n").unwrap();
}

/// A line of `len` bytes between two good notes, against `max_line_bytes = 4096`: refused
/// `line-too-long`, the note after it accepted, the judge's peak memory well under the line.
fn huge_line_is_refused_in_bounded_memory(len: u64, sparse: bool) {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = config(&bridge, "max_line_bytes = 4096\n");
    let config = config.to_str().unwrap();
    bridge.send("design", "web", "before");
    let huge_at = std::fs::metadata(bridge.inbox("web")).unwrap().len();
    append_huge(&bridge.inbox("web"), len, sparse);
    let after = bridge.send("design", "web", "after");
    let after_at = huge_at + len + 1;

    let started = Instant::now();
    let daemon = Daemon::start(&bridge, &["--config", config]);
    let peak = peak_rss(daemon.child.id());
    let took = started.elapsed();
    println!(
        "a {len}-byte line: daemon caught up in {took:?}, peak resident {} KiB",
        peak / 1024
    );
    stop(daemon);
    assert_eq!(
        verdict_at(&bridge, "web", huge_at),
        Some(("refused".to_owned(), Some("line-too-long".to_owned())))
    );
    assert_eq!(
        verdict_at(&bridge, "web", after_at),
        Some(("accepted".to_owned(), None))
    );
    assert_eq!(bridge.verdicts().len(), 3, "{:?}", bridge.verdicts());
    assert!(
        bridge
            .read_json("web", &[])
            .iter()
            .any(|m| m["envelope"]["id"] == after.as_str()),
        "the line after the huge one is readable"
    );
    assert!(peak < 32 * MIB, "peak resident {} KiB", peak / 1024);

    // The offline check and `daemon --once` see the same, in the same bounds.
    let check = bridge.doorbell(&["--config", config, "check"]);
    assert_eq!(check.code, 2, "{check:?}");
    assert!(check.stdout.contains("line-too-long"), "{check:?}");
    once(&bridge, &["--config", config]);
}

#[test]
fn a_64_mib_line_is_refused_in_bounded_memory_and_the_next_line_accepted() {
    huge_line_is_refused_in_bounded_memory(64 * MIB, false);
}

#[cfg(feature = "long")]
#[test]
fn long_a_1_gib_sparse_line_is_refused_in_bounded_memory() {
    huge_line_is_refused_in_bounded_memory(1024 * MIB, true);
}

// ---------------------------------------------------------------------------------------------
// 5. Nesting a million deep.

const DEEP: usize = 1_000_000;

/// Lines nested a million deep, each otherwise plausible.
fn deep_lines() -> Vec<Vec<u8>> {
    let arrays = format!("{}{}", "[".repeat(DEEP), "]".repeat(DEEP));
    let objects = format!("{}1{}", r#"{"a":"#.repeat(DEEP), "}".repeat(DEEP));
    let in_data = format!(
        r#"{{"id":"01DEEP","from":"design","to":"web","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"parts":[{{"type":"data","data":{{"x":{}{}}}}}]}}}}"#,
        "[".repeat(DEEP),
        "]".repeat(DEEP)
    );
    let unknown_field = format!(r#"{{"from":"design","junk":{}"#, r#"{"a":"#.repeat(DEEP));
    let open_only = format!(r#"{{"id":{}"#, "[".repeat(DEEP));
    [arrays, objects, in_data, unknown_field, open_only]
        .into_iter()
        .map(String::into_bytes)
        .collect()
}

#[test]
fn a_million_deep_nesting_is_refused_by_the_judge_without_overflow() {
    // On a thread with an ordinary 2 MiB stack: a recursive parser would overflow it.
    std::thread::Builder::new()
        .stack_size(2 * MIB as usize)
        .spawn(|| {
            let limits = Limits {
                max_line_bytes: 64 * MIB as usize,
            };
            let registry = Registry {
                stations: BTreeSet::from(["web".to_owned(), "design".to_owned()]),
                loops: BTreeSet::new(),
                owners: std::collections::BTreeMap::default(),
                ..Registry::default()
            };
            let ledger = Ledger::default();
            for bytes in deep_lines() {
                let refusal = judge_stateless(&bytes, Some("web"), &limits).unwrap_err();
                assert_eq!(refusal.reason, RefusalReason::BadJson, "{refusal:?}");
                let (verdict, _) =
                    judge_line(&bytes, "web", &limits, &registry, &ledger, &|_| false);
                match verdict {
                    Verdict::Refused(r) => assert_eq!(r.reason, RefusalReason::BadJson),
                    other => panic!("{other:?}"),
                }
            }
        })
        .unwrap()
        .join()
        .expect("judging deep nesting panicked");
}

#[test]
fn a_million_deep_nesting_is_refused_by_check_and_the_daemon() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let config = config(&bridge, "max_line_bytes = 16777216\n");
    let config = config.to_str().unwrap();
    let mut text = Vec::new();
    for bytes in deep_lines() {
        text.extend_from_slice(&bytes);
        text.push(b'\n');
    }
    text.extend_from_slice(line("01AFTERDEEP", "design", "web", "note", "").as_bytes());
    text.push(b'\n');
    bridge.append_raw("web", &text);

    let check = bridge.doorbell(&[
        "--config",
        config,
        "check",
        bridge.inbox("web").to_str().unwrap(),
    ]);
    assert_eq!(check.code, 2, "{check:?}");
    assert!(!check.stderr.contains("overflow") && !check.stderr.contains("panicked"));
    assert_eq!(
        check.stdout.matches("bad-json").count(),
        5,
        "{}",
        check.stdout
    );

    once(&bridge, &["--config", config]);
    let offsets = starts(&text);
    for &offset in &offsets[..5] {
        assert_eq!(
            verdict_at(&bridge, "web", offset),
            Some(("refused".to_owned(), Some("bad-json".to_owned())))
        );
    }
    assert_eq!(
        verdict_at(&bridge, "web", offsets[5]),
        Some(("accepted".to_owned(), None))
    );
    // The line whose sender could be read is told about, once.
    let notices: Vec<_> = envelopes(&bridge, "design")
        .into_iter()
        .filter(|e| e["from"] == "bridge")
        .collect();
    assert!(notices.len() <= 1, "{notices:?}");
}

// ---------------------------------------------------------------------------------------------
// 6. A million tiny lines.

#[test]
fn a_million_tiny_lines_are_judged_once_each_in_bounded_memory_and_state() {
    // A million in the short form, four in the long form (the `long` feature).
    let long = cfg!(feature = "long");
    let tiny = if long { 4_000_000 } else { 1_000_000 };
    // Memory is measured as a slope: the judge's peak for a third of the lines, then for all
    // of them. The allocator's and the runtime's fixed costs cancel out; what is left is
    // what each line costs. The lines that name nobody come in runs of a thousand, each run
    // one record; a cost kept per line, as a short string key in a list, measured 53 bytes
    // a line, and a set of every refusal's key, as the refused log once kept, 100 or more.
    // Each figure is the lower of two runs: a save still in flight holds a batch more (the
    // judge waits for it rather than hold a third), for a moment, in whichever run it
    // happens to; that is a bound, not a cost per line, and a busy machine must not read it
    // as one.
    let base = tiny_lines_are_judged_once_each(tiny / 3, false)
        .min(tiny_lines_are_judged_once_each(tiny / 3, false));
    let peak = tiny_lines_are_judged_once_each(tiny, false)
        .min(tiny_lines_are_judged_once_each(tiny, true));
    let per_line = peak.saturating_sub(base) / (tiny - tiny / 3) as u64;
    println!("{per_line} bytes of peak memory per tiny line");
    assert!(
        per_line < 16,
        "peak resident {} KiB for {tiny} lines, {} KiB for {}: {per_line} bytes a line",
        peak / 1024,
        base / 1024,
        tiny / 3
    );
}

/// Judge `tiny` tiny lines with a daemon and return its peak memory; with `check`, also
/// check every verdict, the notices, and the state the lines left.
fn tiny_lines_are_judged_once_each(tiny: usize, check: bool) -> u64 {
    const FROM_DESIGN: usize = 1_000;
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    // `{}`, `1` and blank lines, none naming a sender, with a refused line from a station
    // every 1000th.
    let mut text = Vec::with_capacity(tiny * 3 + FROM_DESIGN * 200);
    let mut from_design = BTreeSet::new();
    for i in 0..tiny {
        if i % (tiny / FROM_DESIGN) == 0 {
            from_design.insert(text.len() as u64);
            let id = format!("01TINY{i}");
            text.extend_from_slice(
                line(&id, "design", "web", "note", r#","priority":7"#).as_bytes(),
            );
        } else if i % 7 == 0 {
            // A blank line.
        } else if i % 2 == 0 {
            text.extend_from_slice(b"{}");
        } else {
            text.extend_from_slice(b"1");
        }
        text.push(b'\n');
    }
    bridge.append_raw("web", &text);
    let inbox_bytes = text.len() as u64;
    let lines = starts(&text);
    drop(text);

    let started = Instant::now();
    let daemon = Daemon::spawn_within(bridge.command(&["daemon"]), Duration::from_secs(300));
    let caught_up = started.elapsed();
    let peak = peak_rss(daemon.child.id());
    stop(daemon);
    println!(
        "{tiny} tiny lines: daemon caught up in {caught_up:?}, peak resident {} KiB",
        peak / 1024
    );
    if !check {
        return peak;
    }

    // Every line is judged once and refused: design's each by a record of its own, those
    // between two of them by one record for the run, which covers them all. Counted
    // straight from the journal.
    let mut verdicts = Vec::new();
    for record in bridge.journal().into_iter().filter(|r| r["in"] == "web") {
        match record["v"].as_str() {
            Some("m" | "i") => continue,
            Some("r") => {}
            _ => panic!("{record}"),
        }
        let span = record["n"].as_u64().unwrap();
        verdicts.push((record["o"].as_u64().unwrap(), span, record));
    }
    verdicts.sort_by_key(|(offset, _, _)| *offset);
    let mut next = 0;
    for (offset, span, record) in &verdicts {
        assert_eq!(*offset, next, "every line judged once, in order: {record}");
        next = offset + span;
        if from_design.contains(offset) {
            assert_eq!(record["reason"], "bad-field", "{record}");
            assert!(
                lines.binary_search(&next).is_ok() || next == inbox_bytes,
                "one line: {record}"
            );
        } else {
            let detail = record["detail"].as_str().unwrap();
            assert!(
                detail.contains("lines in a row that name no sender"),
                "{record}"
            );
        }
    }
    assert_eq!(next, inbox_bytes, "every line judged");
    assert_eq!(verdicts.len(), 2 * FROM_DESIGN, "a record for each run");

    // What tiny lines leave behind is bounded by the bytes written, not by their number
    // (DESIGN §9: at most 4× those bytes, or coalesced). Each line its own record, the
    // state was 170 times the inbox.
    let state: u64 = std::fs::read_dir(bridge.dir().join(".doorbell"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    println!("{inbox_bytes} bytes of tiny lines, {state} bytes of state");
    assert!(
        state <= 4 * inbox_bytes,
        "{inbox_bytes} bytes of tiny lines left {state} bytes of state"
    );

    // One notice policy: lines that name no sender are told to nobody; design's refusals
    // are coalesced, each named in exactly one notice.
    assert!(envelopes(&bridge, "web")
        .iter()
        .all(|e| e["from"] != "bridge"));
    assert!(envelopes(&bridge, "human").is_empty());
    let notices: Vec<_> = envelopes(&bridge, "design")
        .into_iter()
        .filter(|e| e["from"] == "bridge")
        .collect();
    let per_notice = doorbell_core::notice::MAX_PER_NOTICE;
    assert_eq!(notices.len(), FROM_DESIGN.div_ceil(per_notice), "coalesced");
    let all_text: String = notices
        .iter()
        .map(|n| {
            n["message"]["parts"][0]["text"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for i in (0..tiny).step_by(tiny / FROM_DESIGN) {
        let named = format!("'01TINY{i}'");
        assert_eq!(all_text.matches(&named).count(), 1, "{named}");
    }
    peak
}

// ---------------------------------------------------------------------------------------------
// 7. Hooks are never given message text.

#[test]
fn hooks_never_see_message_text_or_run_it() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let out = bridge.tmp.path().join("hook.dump");
    let pwned = bridge.tmp.path().join("pwned");
    // The hook dumps its argv, environment and stdin.
    let dump = format!(
        "{{ printf 'argv:'; printf ' [%s]' \"$0\" \"$@\"; echo; env; echo stdin:; cat; }} > '{0}.tmp' && mv '{0}.tmp' '{0}'",
        out.display()
    );
    let config = config(
        &bridge,
        &format!(
            "[[agent]]\nname = \"web\"\nhook = [\"sh\", \"-c\", {}, \"hook\", \"fixed\"]\n",
            serde_json::to_string(&dump).unwrap()
        ),
    );
    let daemon = Daemon::start(&bridge, &["--config", config.to_str().unwrap()]);
    let canary = "CANARY7F3A";
    let p = pwned.display();
    let text = format!(
        "{canary} $(touch {p}1) `touch {p}2`; touch {p}3 | touch {p}4 && touch {p}5 ' \" \\ $HOME ${{IFS}} {canary}"
    );
    let id = bridge
        .doorbell(&[
            "send",
            "--to",
            "web",
            "--from",
            "design",
            "--kind",
            "request",
            "--task-id",
            &format!("{canary}-task"),
            "--data",
            &format!(r#"{{"cmd":"$(touch {p}6) {canary}"}}"#),
            &text,
        ])
        .ok()
        .trim()
        .to_owned();
    wait_for_file(&out, PATIENCE);
    stop(daemon);
    let dump = std::fs::read_to_string(&out).unwrap();
    assert!(
        !dump.contains(canary),
        "message content reached the hook:\n{dump}"
    );
    assert!(dump.contains("argv: [hook] [fixed]\n"), "{dump}");
    assert!(dump.contains(&format!("DOORBELL_ID={id}\n")), "{dump}");
    assert!(dump.contains("DOORBELL_AGENT=web\n"), "{dump}");
    assert!(dump.ends_with("stdin:\n"), "the hook had a stdin:\n{dump}");
    for n in 1..=6 {
        let path = PathBuf::from(format!("{p}{n}"));
        assert!(
            !path.exists(),
            "{} was created: text was run",
            path.display()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 8. Folder and file modes.

/// A `doorbell` command run under `umask 000`.
fn permissive(bridge: &Bridge, args: &[&str]) -> Run {
    let mut command = Command::new("sh");
    bridge.env(&mut command);
    command
        .args(["-c", "umask 000 && exec \"$0\" \"$@\"", BIN])
        .args(args);
    run(command, None)
}

#[test]
fn every_file_and_folder_is_private_even_under_umask_000() {
    let bridge = Bridge::new();
    // doorbell creates the folder itself.
    std::fs::remove_dir(bridge.dir()).unwrap();
    for name in ["web", "design", "human"] {
        permissive(&bridge, &["agent", "add", name]).ok();
    }
    permissive(
        &bridge,
        &[
            "send", "--to", "web", "--from", "design", "--kind", "request", "q",
        ],
    )
    .ok();
    let mut command = Command::new("sh");
    bridge.env(&mut command);
    command
        .args(["-c", "umask 000 && exec sh \"$@\"", "sh"])
        .arg(crate::util::script())
        .args(["--to", "design", "--from", "web", "via the script"]);
    run(command, None).ok();
    bridge.append_raw("design", b"not json\n");
    permissive(&bridge, &["daemon", "--once"]).ok();
    permissive(&bridge, &["report", "--daily"]).ok();
    permissive(&bridge, &["read", "web"]).ok();
    permissive(
        &bridge,
        &["send", "--to", "web", "--from", "design", "again"],
    )
    .ok();
    permissive(&bridge, &["daemon", "--once"]).ok();

    let state = bridge.dir().join(".doorbell");
    for expected in [
        state.join("journal.jsonl"),
        state.join("index.db"),
        state.join("refused.jsonl"),
        state.join("lock"),
        bridge.dir().join("web-inbox.cursor"),
    ] {
        assert!(expected.exists(), "{} was not created", expected.display());
    }
    let mut seen = 0;
    let mut wrong = Vec::new();
    let mut check = |path: &Path, want: u32| {
        let mode = std::fs::symlink_metadata(path).unwrap().mode() & 0o7777;
        seen += 1;
        if mode != want {
            wrong.push(format!("{} is {mode:o}, not {want:o}", path.display()));
        }
    };
    check(&bridge.dir(), 0o700);
    for (path, (kind, _)) in tree(&bridge.dir()) {
        check(&path, if kind == "dir" { 0o700 } else { 0o600 });
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert!(seen >= 12, "only {seen} paths");
}

// ---------------------------------------------------------------------------------------------
// 9. No network port.

/// The inodes of every socket `pid` holds open.
fn sockets_of(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")
                .and_then(|s| s.strip_suffix(']'))
                .map(str::to_owned)
        })
        .collect()
}

/// Every inode of an IP socket on the machine's (this namespace's) tables.
fn network_inodes() -> BTreeSet<String> {
    let mut inodes = BTreeSet::new();
    for table in ["tcp", "tcp6", "udp", "udp6", "raw", "raw6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/net/{table}")) else {
            continue;
        };
        for row in text.lines().skip(1) {
            if let Some(inode) = row.split_whitespace().nth(9) {
                inodes.insert(inode.to_owned());
            }
        }
    }
    inodes
}

#[track_caller]
fn assert_no_network_socket(pid: u32, what: &str) {
    let mine = sockets_of(pid);
    let network = network_inodes();
    let open: Vec<&String> = mine.iter().filter(|s| network.contains(*s)).collect();
    assert!(open.is_empty(), "{what} holds network sockets {open:?}");
    // Whatever sockets it has are local (unix) ones.
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    for socket in &mine {
        assert!(
            unix.split_whitespace().any(|field| field == socket),
            "{what}: socket {socket} is neither IP nor unix"
        );
    }
}

#[test]
fn the_daemon_and_watch_open_no_network_socket() {
    // The check itself must be able to see a listening socket.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let network = network_inodes();
    assert!(
        sockets_of(std::process::id())
            .iter()
            .any(|s| network.contains(s)),
        "a TCP listener is not visible in /proc/net"
    );
    drop(listener);

    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut daemon = Daemon::start(&bridge, &[]);
    let id = bridge.send("design", "web", "hello");
    bridge.wait_for(PATIENCE, "the note judged", |b| b.verdict_count() == 1);
    assert_no_network_socket(daemon.child.id(), "the daemon");

    let watch = Watch::start(&bridge, "web");
    assert_eq!(watch.next(PATIENCE), id);
    assert_no_network_socket(watch.id(), "watch");
    drop(watch);
    daemon.expect_stderr("judging", PATIENCE);
    stop(daemon);
}
