//! The one helper every end-to-end test uses: a temporary bridge folder and a way to run the
//! real binary or the shell sender against it with a clean environment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde::Deserialize;
use tempfile::TempDir;

pub const BIN: &str = env!("CARGO_BIN_EXE_doorbell");

/// The shell sender in this repository.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/doorbell-send")
}

/// A finished command: its exit code and output as text.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(output: &Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Assert success and return stdout.
    #[track_caller]
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        &self.stdout
    }
}

/// A bridge folder in a temporary directory, with its own HOME so nothing leaks in or out.
pub struct Bridge {
    pub tmp: TempDir,
}

impl Default for Bridge {
    fn default() -> Self {
        Self::new()
    }
}

impl Bridge {
    /// An empty bridge folder.
    pub fn new() -> Bridge {
        let tmp = tempfile::Builder::new()
            .prefix("doorbell-test")
            .tempdir()
            .unwrap();
        std::fs::create_dir(tmp.path().join("bridge")).unwrap();
        std::fs::create_dir(tmp.path().join("home")).unwrap();
        Bridge { tmp }
    }

    /// An empty bridge folder in memory (`/dev/shm`) when the machine has it: an fsync there
    /// is free, so tests that measure a schedule or run many cases are not slowed by a disk
    /// busy with other tests. SIGKILL safety needs no disk.
    pub fn in_memory() -> Bridge {
        let mut builder = tempfile::Builder::new();
        builder.prefix("doorbell-test");
        let shm = Path::new("/dev/shm");
        let tmp = if shm.is_dir() {
            builder.tempdir_in(shm).or_else(|_| builder.tempdir())
        } else {
            builder.tempdir()
        }
        .unwrap();
        std::fs::create_dir(tmp.path().join("bridge")).unwrap();
        std::fs::create_dir(tmp.path().join("home")).unwrap();
        Bridge { tmp }
    }

    /// A bridge with these agents' inboxes.
    pub fn with_agents(names: &[&str]) -> Bridge {
        let bridge = Bridge::new();
        for name in names {
            bridge.doorbell(&["agent", "add", name]).ok();
        }
        bridge
    }

    pub fn dir(&self) -> PathBuf {
        self.tmp.path().join("bridge")
    }

    pub fn inbox(&self, name: &str) -> PathBuf {
        self.dir().join(format!("{name}-inbox.jsonl"))
    }

    /// Give `command` the bridge's clean environment (for commands run through a wrapper).
    /// The environment of a user who installed doorbell: the binary on `PATH`.
    pub fn env(&self, command: &mut Command) {
        let bin = Path::new(BIN)
            .parent()
            .expect("the binary's folder")
            .to_path_buf();
        let path = std::env::var_os("PATH").unwrap_or_default();
        let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))
            .expect("a PATH");
        command
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.tmp.path().join("home"))
            .env("XDG_CONFIG_HOME", self.tmp.path().join("home/.config"))
            .env("XDG_DATA_HOME", self.tmp.path().join("home/.local/share"))
            .env("DOORBELL_DIR", self.dir())
            .env("LC_ALL", "C.UTF-8");
    }

    /// A `doorbell` command with the bridge's environment, not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        self.env(&mut command);
        command.args(args);
        command
    }

    /// A `scripts/doorbell-send` command with the bridge's environment, not yet run.
    pub fn script_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("sh");
        self.env(&mut command);
        command.arg(script()).args(args);
        command
    }

    /// Write the bridge's config file (`$XDG_CONFIG_HOME/doorbell/doorbell.toml`).
    pub fn config(&self, text: &str) {
        let dir = self.tmp.path().join("home/.config/doorbell");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("doorbell.toml"), text).unwrap();
    }

    /// Run `doorbell ARGS` with no stdin.
    pub fn doorbell(&self, args: &[&str]) -> Run {
        run(self.command(args), None)
    }

    /// Make `name`'s inbox look last written `secs` seconds ago (its file's time).
    pub fn age_inbox(&self, name: &str, secs: u64) {
        let then = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
        std::fs::File::options()
            .append(true)
            .open(self.inbox(name))
            .unwrap()
            .set_modified(then)
            .unwrap();
    }

    /// `doorbell send --to TO --from FROM TEXT` (a note), which must succeed; its id.
    #[track_caller]
    pub fn send(&self, from: &str, to: &str, text: &str) -> String {
        self.doorbell(&["send", "--to", to, "--from", from, text])
            .ok()
            .trim()
            .to_owned()
    }

    /// `doorbell send --to TO --from FROM --kind request TEXT`, which must succeed; its id.
    #[track_caller]
    pub fn request(&self, from: &str, to: &str, text: &str) -> String {
        self.doorbell(&[
            "send", "--to", to, "--from", from, "--kind", "request", text,
        ])
        .ok()
        .trim()
        .to_owned()
    }

    /// `doorbell reply ID --from FROM --state STATE [EXTRA…] TEXT`, which must succeed.
    #[track_caller]
    pub fn reply(&self, id: &str, from: &str, state: &str, extra: &[&str], text: &str) {
        let mut args = vec!["reply", id, "--from", from, "--state", state];
        args.extend_from_slice(extra);
        args.push(text);
        self.doorbell(&args).ok();
    }

    /// Run `doorbell ARGS` with `stdin` as its standard input.
    pub fn doorbell_stdin(&self, args: &[&str], stdin: &[u8]) -> Run {
        run(self.command(args), Some(stdin))
    }

    /// Run `scripts/doorbell-send ARGS`.
    pub fn script(&self, args: &[&str], stdin: Option<&[u8]>) -> Run {
        run(self.script_command(args), stdin)
    }

    /// Append raw bytes to an inbox, as a writer that ignores the rules would.
    pub fn append_raw(&self, name: &str, bytes: &[u8]) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.inbox(name))
            .unwrap();
        file.write_all(bytes).unwrap();
    }

    /// The inbox's lines, without their newlines.
    pub fn lines(&self, name: &str) -> Vec<Vec<u8>> {
        let bytes = std::fs::read(self.inbox(name)).unwrap();
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    }

    /// `read --json` as parsed records.
    pub fn read_json(&self, agent: &str, extra: &[&str]) -> Vec<serde_json::Value> {
        let mut args = vec!["read", agent, "--json"];
        args.extend_from_slice(extra);
        self.doorbell(&args)
            .ok()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The ids `read AGENT --json` shows (and the cursor moves past).
    pub fn read_ids(&self, agent: &str) -> Vec<String> {
        self.read_json(agent, &[])
            .iter()
            .map(|m| m["envelope"]["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The journal's records.
    pub fn journal(&self) -> Vec<serde_json::Value> {
        let text =
            std::fs::read_to_string(self.dir().join(".doorbell/journal.jsonl")).unwrap_or_default();
        // A record the judge is still writing has no newline yet: not a record so far.
        let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
        complete
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The journal's verdicts (not marks) as (inbox, offset, verdict, reason), spelled out.
    pub fn verdicts(&self) -> Vec<(String, u64, String, Option<String>)> {
        self.journal()
            .into_iter()
            .filter(|r| r["v"] != "m" && r["v"] != "i")
            .map(|r| {
                let verdict = match r["v"].as_str().unwrap() {
                    "a" => "accepted",
                    "d" => "duplicate",
                    "r" => "refused",
                    other => panic!("unknown verdict {other}"),
                };
                (
                    r["in"].as_str().unwrap().to_owned(),
                    r["o"].as_u64().unwrap(),
                    verdict.to_owned(),
                    r["reason"].as_str().map(str::to_owned),
                )
            })
            .collect()
    }
}

/// Run a command to completion, feeding it `stdin` (or nothing).
pub fn run(mut command: Command, stdin: Option<&[u8]>) -> Run {
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().expect("spawn");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        match pipe.write_all(bytes) {
            // The command may end without reading its input (a usage error): not ours to fail.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            other => other.unwrap(),
        }
    }
    Run::from(&child.wait_with_output().unwrap())
}

/// Run a command with no stdin to its end; one still running after `within` is killed and
/// the test fails (a command that must not hang).
#[track_caller]
pub fn run_within(mut command: Command, within: std::time::Duration) -> Run {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command.spawn().expect("spawn");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    if let Ok(output) = rx.recv_timeout(within) {
        return Run::from(&output.unwrap());
    }
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
    panic!("{command:?} still ran after {within:?}");
}

/// A note with its newline, whose text is `text_bytes` long.
pub fn note_of(id: &str, from: &str, to: &str, text_bytes: usize) -> String {
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"note","createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{}"}}]}}}}"#,
        "x".repeat(text_bytes)
    ) + "\n"
}

/// One envelope line as `doorbell send` would write it, for tests that append directly.
pub fn line(id: &str, from: &str, to: &str, kind: &str, extra: &str) -> String {
    let state = match kind {
        "request" => r#","state":"submitted""#,
        _ => "",
    };
    format!(
        r#"{{"id":"{id}","from":"{from}","to":"{to}","kind":"{kind}"{state}{extra},"createdAt":"2026-11-29T10:00:00Z","message":{{"role":"agent","parts":[{{"type":"text","text":"{id} from {from}"}}]}}}}"#
    )
}

/// The id a broadcast's requests share (`ID.station` each), from what `send` printed.
#[track_caller]
pub fn broadcast_id(printed: &str) -> String {
    let first = printed.lines().next().expect("an id printed");
    first
        .rsplit_once('.')
        .expect("a broadcast's id")
        .0
        .to_owned()
}

/// A running `doorbell daemon`, its stderr collected line by line.
pub struct Daemon {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Everything the daemon wrote to stderr so far.
    pub stderr: Vec<String>,
}

impl Daemon {
    /// Everything the daemon wrote to stderr so far, without waiting.
    pub fn stderr_so_far(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.stderr.push(line);
        }
        &self.stderr
    }

    /// Start the daemon on `bridge` and wait (up to 30 s) until it says it is judging.
    pub fn start(bridge: &Bridge, extra: &[&str]) -> Daemon {
        let mut args = vec!["daemon"];
        args.extend_from_slice(extra);
        Daemon::spawn(bridge.command(&args))
    }

    /// Start a prepared daemon command (e.g. one run through `sh -c 'ulimit ...; exec ...'`)
    /// and wait (up to 30 s) until it says it is judging.
    pub fn spawn(command: Command) -> Daemon {
        Daemon::spawn_within(command, std::time::Duration::from_secs(30))
    }

    /// Start a prepared daemon command and wait up to `ready_within` until it says it is
    /// judging (a long catch-up needs longer than the usual 30 s).
    pub fn spawn_within(command: Command, ready_within: std::time::Duration) -> Daemon {
        Daemon::spawn_saying(command, "doorbell: judging", ready_within)
    }

    /// Start a prepared command and wait up to `ready_within` until its stderr says `ready`.
    pub fn spawn_saying(
        mut command: Command,
        ready: &str,
        ready_within: std::time::Duration,
    ) -> Daemon {
        command
            .env("DOORBELL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn daemon");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut daemon = Daemon {
            child,
            lines,
            stderr: Vec::new(),
        };
        daemon.expect_stderr(ready, ready_within);
        daemon
    }

    /// Wait until a stderr line contains `needle`; panic after `timeout`.
    #[track_caller]
    pub fn expect_stderr(&mut self, needle: &str, timeout: std::time::Duration) -> String {
        if let Some(line) = self.stderr.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(error) => panic!(
                    "daemon never said {needle:?} within {timeout:?} ({error}); stderr:\n{}",
                    self.stderr.join("\n")
                ),
            }
        }
    }

    /// Where the stderr read so far ends, for [`Daemon::expect_stderr_since`]: everything the
    /// daemon wrote before this call is taken in first, up to the line in the pipe now.
    pub fn stderr_mark(&mut self) -> usize {
        while let Ok(line) = self.lines.try_recv() {
            self.stderr.push(line);
        }
        self.stderr.len()
    }

    /// Wait until a stderr line after `mark` contains `needle`; panic after `timeout`.
    #[track_caller]
    pub fn expect_stderr_since(
        &mut self,
        mark: usize,
        needle: &str,
        timeout: std::time::Duration,
    ) -> String {
        if let Some(line) = self.stderr[mark..].iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.stderr.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(error) => panic!(
                    "daemon never said {needle:?} within {timeout:?} ({error}); stderr:\n{}",
                    self.stderr[mark..].join("\n")
                ),
            }
        }
    }

    /// Send a signal by name (`TERM`, `KILL`, `HUP`, ...); a `STOP` returns once the daemon
    /// has stopped.
    pub fn signal(&self, name: &str) {
        signal(self.child.id(), name);
    }

    /// Wait for the daemon to exit, up to `timeout`; its exit code (None: killed by a signal).
    /// Its stderr closing is the event: the pipe ends when the process does.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stderr.push(line),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    panic!("daemon did not exit within {timeout:?}")
                }
            }
        }
        self.child.wait().unwrap().code()
    }

    /// After the daemon exited: every stderr line it wrote, waiting (up to `timeout`) for the
    /// pipe to close.
    pub fn finish_stderr(&mut self, timeout: std::time::Duration) -> &[String] {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.stderr.push(line),
                Err(_) => return &self.stderr,
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Bridge {
    /// Block until `done` holds, re-checking whenever an inbox or the journal changes; panic
    /// after `timeout`. Event-driven: no sleeping between checks.
    #[track_caller]
    pub fn wait_for(
        &self,
        timeout: std::time::Duration,
        what: &str,
        mut done: impl FnMut(&Bridge) -> bool,
    ) {
        use notify::Watcher;
        let (tx, rx) = std::sync::mpsc::channel();
        let mut watcher = notify::recommended_watcher(move |_event| {
            let _ = tx.send(());
        })
        .unwrap();
        let state = self.dir().join(".doorbell");
        std::fs::create_dir_all(&state).unwrap();
        watcher
            .watch(&self.dir(), notify::RecursiveMode::NonRecursive)
            .unwrap();
        watcher
            .watch(&state, notify::RecursiveMode::NonRecursive)
            .unwrap();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if done(self) {
                return;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(
                !left.is_zero(),
                "timed out after {timeout:?} waiting for {what}"
            );
            // A change wakes us; the timeout only bounds the wait.
            let _ = rx.recv_timeout(left);
            while rx.try_recv().is_ok() {}
        }
    }

    /// How many verdicts the journal holds for lines of `inbox`.
    pub fn verdict_count(&self) -> usize {
        self.verdicts().len()
    }
}

// ---------------------------------------------------------------------------------------------
// What the bridge folder says: the journal, the refused log, the notices. Complete lines only:
// the judge may be mid-append.

/// One record of `.doorbell/journal.jsonl`: a verdict, a mark (`v` = `m`) or an intent (`i`).
#[derive(Debug, Deserialize)]
pub struct JournalRecord {
    #[serde(rename = "in")]
    pub inbox: String,
    #[serde(rename = "g", default)]
    pub gen: u32,
    #[serde(rename = "o")]
    pub offset: u64,
    /// The bytes it covers: one line, or a run of lines that name nobody.
    #[serde(rename = "n", default)]
    pub span: u64,
    #[serde(rename = "v")]
    pub verdict: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "a", default)]
    pub accepted: Option<AcceptedLine>,
    #[serde(default)]
    pub tell: bool,
}

/// What an accepted line's record says of it.
#[derive(Debug, Deserialize)]
pub struct AcceptedLine {
    pub id: String,
    #[serde(rename = "k")]
    pub kind: String,
}

/// One record of `.doorbell/refused.jsonl`.
#[derive(Debug, Deserialize)]
pub struct RefusedRecord {
    pub inbox: String,
    pub generation: u32,
    pub offset: u64,
    pub reason: String,
    #[serde(default)]
    pub id: Option<String>,
}

/// One refused line as a notice names it.
#[derive(Debug)]
pub struct Named {
    pub key: Key,
    pub id: Option<String>,
    pub reason: String,
}

/// A refusal notice found in an inbox.
#[derive(Debug)]
pub struct Notice {
    /// Where the notice line is: the inbox of the station it tells.
    pub inbox: String,
    pub offset: u64,
    pub id: String,
    pub text: String,
    pub named: Vec<Named>,
}

/// A line's place: inbox, generation, offset.
pub type Key = (String, u32, u64);

/// The complete lines of `bytes`, with their offsets; and whether a fragment follows them.
pub fn split_lines(bytes: &[u8]) -> (Vec<(u64, Vec<u8>)>, bool) {
    let mut lines = Vec::new();
    let mut start = 0;
    for (at, _) in bytes.iter().enumerate().filter(|(_, &b)| b == b'\n') {
        lines.push((start as u64, bytes[start..at].to_vec()));
        start = at + 1;
    }
    (lines, start < bytes.len())
}

/// The complete records of a JSON-lines file (none when it does not exist).
pub fn read_records<T: for<'de> Deserialize<'de>>(path: &Path) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_default();
    // A record being written (no newline yet) is not read.
    split_lines(&bytes)
        .0
        .iter()
        .map(|(offset, l)| {
            serde_json::from_slice(l).unwrap_or_else(|e| {
                panic!(
                    "{} at byte {offset}: {e}: {}",
                    path.display(),
                    String::from_utf8_lossy(l)
                )
            })
        })
        .collect()
}

/// The refusal notices among an inbox's complete lines (`inbox` is the station they tell).
pub fn notices_in(inbox: &str, lines: &[(u64, Vec<u8>)]) -> Vec<Notice> {
    let mut notices = Vec::new();
    for (offset, bytes) in lines {
        if !bytes.starts_with(br#"{"id":"bridge:"#) {
            continue;
        }
        let envelope: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        let parts = &envelope["message"]["parts"];
        let named = parts[1]["data"]["refused"]
            .as_array()
            .unwrap_or_else(|| panic!("a notice without its data part: {envelope}"))
            .iter()
            .map(|r| Named {
                key: (
                    r["inbox"].as_str().unwrap().to_owned(),
                    r["generation"].as_u64().unwrap() as u32,
                    r["offset"].as_u64().unwrap(),
                ),
                id: r["id"].as_str().map(str::to_owned),
                reason: r["reason"].as_str().unwrap().to_owned(),
            })
            .collect();
        assert_eq!(envelope["from"], "bridge", "{envelope}");
        assert_eq!(envelope["to"], inbox, "{envelope}");
        notices.push(Notice {
            inbox: inbox.to_owned(),
            offset: *offset,
            id: envelope["id"].as_str().unwrap().to_owned(),
            text: parts[0]["text"].as_str().unwrap().to_owned(),
            named,
        });
    }
    notices
}

/// Wait (event-driven) until `path` exists; panic after `timeout`.
#[track_caller]
pub fn wait_for_file(path: &Path, timeout: std::time::Duration) {
    wait_until(path, timeout, "appeared", Path::exists);
}

/// Wait (on the folder's inotify events, never by sleeping) until `path` holds `needle`;
/// its text.
pub fn wait_for_text(path: &Path, needle: &str, timeout: std::time::Duration) -> String {
    let holds = |p: &Path| std::fs::read_to_string(p).is_ok_and(|t| t.contains(needle));
    wait_until(path, timeout, &format!("held {needle:?}"), holds);
    std::fs::read_to_string(path).unwrap()
}

/// Wait until `done(path)`, woken by changes in its folder.
fn wait_until(path: &Path, timeout: std::time::Duration, what: &str, done: impl Fn(&Path) -> bool) {
    use notify::Watcher;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |_event| {
        let _ = tx.send(());
    })
    .unwrap();
    watcher
        .watch(path.parent().unwrap(), notify::RecursiveMode::NonRecursive)
        .unwrap();
    let deadline = std::time::Instant::now() + timeout;
    while !done(path) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        assert!(!left.is_zero(), "{} never {what}", path.display());
        let _ = rx.recv_timeout(left);
    }
}

/// A running `doorbell watch AGENT --json`: the ids it prints, in order. Killed when dropped.
pub struct Watch {
    child: WatchChild,
    ids: std::sync::mpsc::Receiver<String>,
}

/// `doorbell watch AGENT --json` started, its output piped and not read yet; killed when
/// dropped (a failed test leaves no watcher behind).
pub struct WatchChild(pub std::process::Child);

impl WatchChild {
    pub fn spawn(bridge: &Bridge, agent: &str) -> WatchChild {
        WatchChild::spawn_with(bridge, agent, &[])
    }

    /// With `extra` arguments: `--keep-output` keeps the printing in the watch itself, for
    /// tests of its own path.
    pub fn spawn_with(bridge: &Bridge, agent: &str, extra: &[&str]) -> WatchChild {
        let mut args = vec!["watch", agent, "--json"];
        args.extend_from_slice(extra);
        let mut command = bridge.command(&args);
        command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .stdin(std::process::Stdio::null());
        WatchChild(command.spawn().unwrap())
    }
}

impl Drop for WatchChild {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Watch {
    pub fn start(bridge: &Bridge, agent: &str) -> Watch {
        Watch::start_with(bridge, agent, &[])
    }

    /// A watch that prints itself (`--keep-output`): its output is never the daemon's.
    pub fn start_keeping_output(bridge: &Bridge, agent: &str) -> Watch {
        Watch::start_with(bridge, agent, &["--keep-output"])
    }

    pub fn start_with(bridge: &Bridge, agent: &str, extra: &[&str]) -> Watch {
        use std::io::BufRead;
        let mut child = WatchChild::spawn_with(bridge, agent, extra);
        let stdout = child.0.stdout.take().unwrap();
        let (tx, ids) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let value: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
                let id = value["envelope"]["id"].as_str().unwrap().to_owned();
                if tx.send(id).is_err() {
                    return;
                }
            }
        });
        Watch { child, ids }
    }

    /// The id of the next message printed; panics after `timeout`.
    #[track_caller]
    pub fn next(&self, timeout: std::time::Duration) -> String {
        self.ids
            .recv_timeout(timeout)
            .expect("watch printed nothing in time")
    }

    /// The id of the next message printed within `timeout`, if one was.
    pub fn next_within(&self, timeout: std::time::Duration) -> Option<String> {
        self.ids.recv_timeout(timeout).ok()
    }

    pub fn id(&self) -> u32 {
        self.child.0.id()
    }
}

/// The Python of the tests' virtual environment (`target/test-venv`), made from
/// `tests/python/requirements.txt` the first time a test needs it: the official SDKs that
/// drive doorbell as their users' programs would. One test makes it; the others wait.
pub fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let requirements = root.join("tests/python/requirements.txt");
    let venv = root.join("target/test-venv");
    let stamp = venv.join("requirements.txt");
    let wanted = std::fs::read(&requirements).unwrap();
    std::fs::create_dir_all(root.join("target")).unwrap();
    let lock = std::fs::File::create(root.join("target/test-venv.lock")).unwrap();
    lock.lock().unwrap();
    if std::fs::read(&stamp).ok().as_ref() != Some(&wanted) {
        let _ = std::fs::remove_dir_all(&venv);
        let made = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .output()
            .expect("python3 runs (scripts/test installs it)");
        assert!(
            made.status.success(),
            "python3 -m venv failed (scripts/test installs python3-venv): {}",
            String::from_utf8_lossy(&made.stderr)
        );
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(&requirements)
            .output()
            .unwrap();
        assert!(
            pip.status.success(),
            "pip install -r {} failed: {}",
            requirements.display(),
            String::from_utf8_lossy(&pip.stderr)
        );
        std::fs::write(&stamp, &wanted).unwrap();
    }
    venv.join("bin/python")
}

/// What the addressee may move a request to, from `state`.
pub fn addressee_moves(state: &str) -> &'static [&'static str] {
    match state {
        "submitted" => &[
            "working",
            "input-required",
            "completed",
            "failed",
            "rejected",
        ],
        "working" => &["working", "input-required", "completed", "failed"],
        "input-required" => &["working", "completed", "failed"],
        _ => &[],
    }
}

/// Block until `done` holds, looking again at once (`yield_now`) until it does; panic after
/// `timeout`. For what another process does that makes no event in the folder (a file held
/// open, a lock waited for), where [`Bridge::wait_for`] could sleep through it: the kernel
/// tells of an open before the descriptor is in the process's table, and a lock's wait that
/// follows makes no event.
#[track_caller]
pub fn wait_in_proc(timeout: std::time::Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::yield_now();
    }
}

/// Whether process `pid` has a file open whose path ends with `name`.
pub fn has_open(pid: u32, name: &str) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
            .any(|target| target.to_string_lossy().ends_with(name))
    })
}

/// Send the signal `name` (`TERM`, `STOP`, `CONT`, ...) to `pid`, a child of the tests. A
/// SIGSTOP stops a process's threads one by one, each as it next enters the kernel: a line
/// appended just after `kill -STOP` returned could still be judged or printed. So a `STOP`
/// returns once the parent is told the whole process has stopped (`waitid` with `WSTOPPED`;
/// `WNOWAIT` leaves the child to `wait` as before).
#[track_caller]
pub fn signal(pid: u32, name: &str) {
    use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name} {pid}");
    if name == "STOP" {
        let child = Pid::from_raw(i32::try_from(pid).expect("a pid")).expect("a pid");
        let status = waitid(
            WaitId::Pid(child),
            WaitIdOptions::STOPPED | WaitIdOptions::NOWAIT,
        )
        .expect("waitid on a child of the tests");
        assert!(
            status.is_some_and(|s| s.stopped()),
            "{pid} did not stop: {status:?}"
        );
    }
}
