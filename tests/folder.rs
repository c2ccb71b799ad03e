//! The folder's life (DESIGN §9): what a user's machine does to a bridge folder — copy it,
//! restore it from a backup, move it to another disk — loses nothing from view and repeats
//! nothing.

use std::path::Path;

use crate::util::{line, Bridge};

/// `cp -a FROM TO`: every file gets a new inode, the bytes and times stay.
fn copy_folder(from: &Path, to: &Path) {
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_copied_or_restored_folder_keeps_every_unread_message_and_repeats_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let first = bridge.send("design", "web", "read before the copy");
    bridge.read_json("web", &[]);
    let unread = bridge.send("design", "web", "unread at the copy");
    // A refused line: its sender (design) is told once.
    bridge.append_raw(
        "web",
        format!("{}\n", line("01BADTO", "design", "nobody", "note", "")).as_bytes(),
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    let told = bridge.lines("design").len();
    assert_eq!(told, 1, "one refusal notice before the copy");

    // The copy replaces the original, as a restore from a backup would.
    let copy = bridge.tmp.path().join("copy");
    copy_folder(&bridge.dir(), &copy);
    std::fs::remove_dir_all(bridge.dir()).unwrap();
    std::fs::rename(&copy, bridge.dir()).unwrap();

    // The unread message is still unread, and nothing already read comes back.
    assert_eq!(
        unread_of(&bridge, "web"),
        1,
        "status sees the unread message"
    );
    let read = bridge.read_json("web", &[]);
    let ids: Vec<&str> = read
        .iter()
        .map(|m| m["envelope"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [unread.trim()], "read {first} already");
    // No line was judged again: no duplicate verdicts, no second notice.
    let verdicts = bridge.verdicts();
    assert!(
        verdicts.iter().all(|v| v.2 != "duplicate"),
        "lines judged again as duplicates: {verdicts:?}"
    );
    bridge.doorbell(&["daemon", "--once"]).ok();
    assert_eq!(
        bridge.lines("design").len(),
        told,
        "the refusal was told once"
    );
    // New traffic goes on as before.
    let after = bridge.send("design", "web", "after the restore");
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["envelope"]["id"], after.trim());
}

fn unread_of(bridge: &Bridge, agent: &str) -> u64 {
    let status = bridge.doorbell(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(status.ok()).unwrap();
    status["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == agent)
        .unwrap()["unread"]
        .as_u64()
        .unwrap()
}

/// Run `doorbell ARGS` as `nobody`, for whom a file's mode counts (root reads any file).
fn as_nobody(bridge: &Bridge, args: &[&str]) -> crate::util::Run {
    let mut command = std::process::Command::new("setpriv");
    bridge.env(&mut command);
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_doorbell"))
        .args(args);
    crate::util::run(command, None)
}

#[test]
fn an_unreadable_inbox_is_skipped_and_said_while_every_other_station_works() {
    let bridge = Bridge::with_agents(&["web", "design", "ops", "human"]);
    bridge.send("design", "web", "for web");
    bridge.send("web", "ops", "for ops");
    // The whole folder belongs to nobody, as a user's own folder belongs to them.
    let chown = std::process::Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(bridge.tmp.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bridge.inbox("web"), std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(0o000);
    let once = as_nobody(&bridge, &["daemon", "--once"]);
    assert_eq!(
        once.code, 0,
        "one unreadable inbox stopped the judge: {once:?}"
    );
    assert!(
        once.stderr.contains("web-inbox.jsonl") && once.stderr.contains("cannot read this inbox"),
        "{}",
        once.stderr
    );
    // Everyone else reads, and status works and says what is wrong.
    let read = as_nobody(&bridge, &["read", "ops", "--json"]);
    assert_eq!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout.lines().count(), 1);
    let status = as_nobody(&bridge, &["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stderr.contains("web's inbox cannot be read"),
        "{}",
        status.stderr
    );
    // Made readable again: its message is judged and shown, nothing lost.
    mode(0o600);
    let read = as_nobody(&bridge, &["read", "web", "--json"]);
    assert_eq!(read.code, 0, "{read:?}");
    assert_eq!(read.stdout.lines().count(), 1, "{}", read.stdout);
}

#[test]
fn a_hard_linked_or_renamed_inbox_is_not_judged_again_and_no_sender_is_told_of_refusals() {
    for how in ["hard link", "rename"] {
        let bridge = Bridge::with_agents(&["web", "design", "human"]);
        for n in 0..3 {
            bridge.send("design", "web", &format!("message {n}"));
        }
        bridge.doorbell(&["daemon", "--once"]).ok();
        let judged = bridge.verdicts().len();
        let other = bridge.inbox("frontend");
        match how {
            "hard link" => std::fs::hard_link(bridge.inbox("web"), &other).unwrap(),
            _ => std::fs::rename(bridge.inbox("web"), &other).unwrap(),
        }
        let once = bridge.doorbell(&["daemon", "--once"]);
        assert_eq!(once.code, 0, "{how}: {once:?}");
        assert!(
            once.stderr.contains("web's file under another name"),
            "{how}: {}",
            once.stderr
        );
        // Nothing judged again: no `misaddressed` refusals, no notice to design.
        assert_eq!(
            bridge.verdicts().len(),
            judged,
            "{how}: {:?}",
            bridge.verdicts()
        );
        assert!(
            bridge.lines("design").is_empty(),
            "{how}: design was told of refusals"
        );
        let status = bridge.doorbell(&["status"]);
        assert!(
            status
                .stderr
                .contains("frontend-inbox.jsonl is web's inbox under another name"),
            "{how}: {}",
            status.stderr
        );
    }
}

#[test]
fn a_megabyte_of_blank_lines_is_one_refused_fragment_not_hundreds_of_megabytes() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let mut bytes = b"\n".repeat(1 << 20);
    bytes.extend_from_slice(b"  \t\r\n");
    bridge.append_raw("web", &bytes);
    let after = bridge.send("design", "web", "after the blanks");
    let once = bridge.doorbell(&["daemon", "--once"]);
    assert!(
        once.stderr
            .contains("judged 2 lines: 1 accepted, 0 duplicate, 1 refused"),
        "{}",
        once.stderr
    );
    let state: u64 = std::fs::read_dir(bridge.dir().join(".doorbell"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        state < 256 * 1024,
        "1 MiB of blank lines made {state} bytes of state"
    );
    let verdicts = bridge.verdicts();
    assert_eq!(
        verdicts[0],
        (
            "web".to_owned(),
            0,
            "refused".to_owned(),
            Some("bad-json".to_owned())
        )
    );
    // The message after them reads as ever; the blanks are never shown.
    let read = bridge.read_json("web", &[]);
    assert_eq!(read.len(), 1);
    assert_eq!(read[0]["envelope"]["id"], after.trim());
}

#[test]
fn a_process_holding_an_inbox_lock_stops_neither_the_judge_nor_a_sender_for_good() {
    let bridge = Bridge::with_agents(&["web", "design", "ops", "human"]);
    // A refused line from web: its notice is due in web's own inbox.
    bridge.append_raw(
        "design",
        format!(
            "{}\n",
            line("01BADPRIO", "web", "design", "note", r#","priority":9"#)
        )
        .as_bytes(),
    );
    // Another process holds web's inbox lock and hangs.
    let held = std::fs::OpenOptions::new()
        .read(true)
        .open(bridge.inbox("web"))
        .unwrap();
    held.lock().unwrap();
    let daemon = crate::util::Daemon::start(&bridge, &[]);
    let mut daemon = daemon;
    daemon.expect_stderr(
        "another process holds this inbox's lock",
        std::time::Duration::from_secs(30),
    );
    // Everything else is judged meanwhile.
    let id = bridge.send("design", "ops", "judged while web is locked");
    let watch = crate::util::Watch::start(&bridge, "ops");
    assert_eq!(watch.next(std::time::Duration::from_secs(30)), id.trim());
    // Senders to web get a clear error instead of hanging.
    let started = std::time::Instant::now();
    let sent = bridge.doorbell(&["send", "--from", "design", "--to", "web", "hello?"]);
    assert_eq!(sent.code, 1, "{sent:?}");
    assert!(
        sent.stderr.contains("locked by another process"),
        "{}",
        sent.stderr
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let script = bridge.script(&["--from", "design", "--to", "web", "--", "hello?"], None);
    assert_eq!(script.code, 1, "{script:?}");
    assert!(
        script.stderr.contains("locked by another process"),
        "{}",
        script.stderr
    );
    // Released: the notice is written, once.
    drop(held);
    bridge.send("design", "ops", "a nudge for the judge");
    daemon.expect_stderr("lock was released", std::time::Duration::from_secs(30));
    drop(watch);
    daemon.kill();
    let notices = bridge
        .lines("web")
        .iter()
        .filter(|l| String::from_utf8_lossy(l).contains("01BADPRIO"))
        .count();
    assert_eq!(notices, 1, "the refusal notice, written once");
}
