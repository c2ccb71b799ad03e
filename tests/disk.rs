//! Real disk faults, in the long form (`DOORBELL_LONG=1`, as root): the judge's folder on a
//! 1 MiB tmpfs that fills up while the daemon runs, then the same folder remounted read-only.
//! The seam-driven tests beside the store and the daemon cover every fault point on every
//! run; this one checks the real kernel errors end to end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::util::{line, Bridge, Daemon};

const PATIENCE: Duration = Duration::from_secs(60);

/// A tmpfs mounted for the test, unmounted (lazily, if something still holds it) at the end.
struct Mount(PathBuf);

impl Mount {
    fn tmpfs(at: &Path, size: &str) -> Mount {
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(
            status.success(),
            "the long form mounts a tmpfs and needs root (it runs as root in CI)"
        );
        Mount(at.to_path_buf())
    }

    fn remount(&self, how: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{how}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remount,{how}");
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fill the file system at `dir` with one file until a write fails; return it.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 4096];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            return path;
        }
    }
}

fn note(i: usize) -> String {
    format!(
        "{}\n",
        line(&format!("01DISK{i:05}"), "design", "web", "note", "")
    )
}

/// Each line of web's inbox has exactly one verdict.
fn each_line_judged_once(bridge: &Bridge, lines: usize) {
    let verdicts = bridge.verdicts();
    let mut offsets: Vec<u64> = verdicts
        .iter()
        .filter(|v| v.0 == "web")
        .map(|v| v.1)
        .collect();
    assert_eq!(offsets.len(), lines, "one verdict per line");
    offsets.dedup();
    assert_eq!(offsets.len(), lines, "no line judged twice");
    assert!(verdicts.iter().all(|v| v.2 == "accepted"), "{verdicts:?}");
}

#[test]
fn long_a_full_then_read_only_disk_loses_and_repeats_nothing() {
    let bridge = Bridge::with_agents(&["web", "design", "human"]);
    let state = bridge.dir().join(".doorbell");
    std::fs::remove_dir_all(&state).ok();
    std::fs::create_dir(&state).unwrap();
    let mount = Mount::tmpfs(&state, "1m");

    let mut daemon = Daemon::start(&bridge, &[]);
    for i in 0..100 {
        bridge.append_raw("web", note(i).as_bytes());
    }
    bridge.wait_for(PATIENCE, "100 verdicts", |b| b.verdict_count() == 100);

    // The state folder fills up (the inboxes live elsewhere and still take lines).
    let filler = fill(&state);
    for i in 100..400 {
        bridge.append_raw("web", note(i).as_bytes());
    }
    daemon.expect_stderr("judging paused", PATIENCE);
    let paused = daemon.expect_stderr("No space left on device", PATIENCE);
    println!("{paused}");
    // The person asks what is stuck, and is told.
    let status = bridge.doorbell(&["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stderr.contains(".doorbell has 0 KiB free"),
        "{status:?}"
    );
    std::fs::remove_file(&filler).unwrap();
    daemon.expect_stderr("judging resumed", PATIENCE);
    bridge.wait_for(PATIENCE, "400 verdicts", |b| b.verdict_count() == 400);
    daemon.signal("TERM");
    assert_eq!(daemon.wait_exit(PATIENCE), Some(0));
    each_line_judged_once(&bridge, 400);

    // Read-only: the judge cannot start, and says why; nothing is judged or lost.
    for i in 400..450 {
        bridge.append_raw("web", note(i).as_bytes());
    }
    mount.remount("ro");
    let refused = bridge.doorbell(&["daemon", "--once"]);
    assert_ne!(refused.code, 0, "{refused:?}");
    assert_eq!(
        refused.stderr.matches("Read-only file system").count(),
        1,
        "the cause, said once: {}",
        refused.stderr
    );
    println!("{}", refused.stderr.trim());
    // `status` cannot catch up either, and shows what was judged, saying why.
    let status = bridge.doorbell(&["status"]);
    assert_eq!(status.code, 0, "{status:?}");
    assert!(
        status.stderr.contains(".doorbell is read-only"),
        "{status:?}"
    );
    assert!(
        status.stderr.contains("Read-only file system"),
        "{status:?}"
    );
    mount.remount("rw");
    bridge.doorbell(&["daemon", "--once"]).ok();
    each_line_judged_once(&bridge, 450);
    drop(mount);
}
