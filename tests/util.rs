//! The one helper every end-to-end test uses: a temporary bridge folder and a way to run the
//! real binary or the shell sender against it with a clean environment.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

    fn env(&self, command: &mut Command) {
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
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

    /// Run `doorbell ARGS` with no stdin.
    pub fn doorbell(&self, args: &[&str]) -> Run {
        run(self.command(args), None)
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

    /// The journal's records.
    pub fn journal(&self) -> Vec<serde_json::Value> {
        let text =
            std::fs::read_to_string(self.dir().join(".doorbell/journal.jsonl")).unwrap_or_default();
        text.lines()
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
        pipe.write_all(bytes).unwrap();
    }
    Run::from(&child.wait_with_output().unwrap())
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
