//! What every command starts from: the config, the bridge folder, and a view of the journal
//! that is caught up with the inboxes.

use doorbell_core::report::{plural, printable};
use std::path::{Path, PathBuf};

use anyhow::Context;
use doorbell_store::{Bridge, Config, View};

/// The resolved config and bridge folder of one invocation.
pub struct Session {
    pub config: Config,
    pub dir: PathBuf,
}

impl Session {
    pub fn new(dir: Option<&Path>, config: Option<&Path>) -> anyhow::Result<Session> {
        let config = Config::load(config)?;
        let dir = doorbell_store::bridge::resolve_dir(dir, &config);
        Ok(Session { config, dir })
    }

    /// How a shell in this environment runs doorbell on this bridge, for the commands a hook
    /// or a tool suggests: `doorbell` when `PATH` finds this very binary, else its full path;
    /// and `--dir` when the environment alone would pick another folder (a hook `setup` armed
    /// with `--dir`, in a harness without `DOORBELL_DIR`).
    pub fn program(&self) -> String {
        let exe = std::env::current_exe().and_then(std::fs::canonicalize).ok();
        // The `doorbell` a shell finds first: another one earlier on PATH is not this one.
        let found = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("doorbell"))
                .find(|candidate| candidate.is_file())
        });
        let on_path = found.and_then(|found| std::fs::canonicalize(found).ok()) == exe;
        let mut program = match &exe {
            Some(exe) if !on_path => shell_word(&exe.to_string_lossy()),
            _ => "doorbell".to_owned(),
        };
        if let Some(path) = self.config_file() {
            program.push_str(" --config ");
            program.push_str(&shell_word(&path.to_string_lossy()));
        }
        if doorbell_store::bridge::resolve_dir(None, &self.config) != self.dir {
            program.push_str(" --dir ");
            program.push_str(&shell_word(&absolute(&self.dir).to_string_lossy()));
        }
        program
    }

    /// The config file this session was given, by its absolute path, when it is not the
    /// default one: a command suggested or written for later must name it, or it would run
    /// with the default file's settings.
    pub fn config_file(&self) -> Option<PathBuf> {
        let path = self.config.path.as_deref()?;
        (Some(path) != doorbell_store::config::default_path().as_deref()).then(|| absolute(path))
    }

    /// The existing bridge folder.
    pub fn bridge(&self) -> anyhow::Result<Bridge> {
        Ok(Bridge::open(&self.dir, self.config.clone())?)
    }

    /// The bridge folder, created when missing.
    pub fn bridge_or_create(&self) -> anyhow::Result<Bridge> {
        Ok(Bridge::create(&self.dir, self.config.clone())?)
    }
}

/// The bridge, caught up when no other judge runs; when one does, its index and journal
/// are read as they stand: a command never judges behind a judge's back.
pub fn view(bridge: &Bridge) -> anyhow::Result<View> {
    View::open(bridge).context("catching up with the inboxes")
}

/// Log to stderr, with the level from `DOORBELL_LOG` (default: warnings). A log line names
/// files of the folder and quotes what came in, which anyone who can write there chooses:
/// each line is made safe for a terminal as a whole ([`SafeStderr`]), so it has no colours.
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DOORBELL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(|| SafeStderr)
        .try_init();
}

/// Standard error, through [`printable`]: a log event comes as one write of its whole text.
struct SafeStderr;

impl std::io::Write for SafeStderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let text = printable(&String::from_utf8_lossy(bytes));
        std::io::stderr().lock().write_all(text.as_bytes())?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `doorbell daemon --once`: become the judge, judge everything waiting, exit.
pub fn daemon_once(session: &Session) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let lock = crate::daemon::acquire(&bridge, "doorbell daemon --once")?;
    let stats = doorbell_store::judge::once(bridge.clone(), lock)?;
    // A bridge judged only now and then (a timer, a cron job) keeps its board as current as
    // its judging.
    if bridge.config.board {
        if let Err(error) = doorbell_store::board::write_no_judge(&bridge, "`daemon --once` judged")
        {
            tracing::warn!(%error, "could not write the board (STATUS.md)");
        }
    }
    eprintln!(
        "judged {}: {} accepted, {} duplicate, {} refused; {} written",
        plural(stats.judged(), "line", "lines"),
        stats.accepted,
        stats.duplicate,
        stats.refused,
        plural(stats.notices, "notice", "notices")
    );
    Ok(crate::exit::OK)
}

/// `doorbell compact`: seal the live journal when no judge runs, then compress every sealed
/// segment. A running daemon seals the live journal itself once it is large.
pub fn compact(session: &Session) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let done = doorbell_store::judge::compact(&bridge).context("compacting the journal")?;
    match done.sealed {
        Some(segment) => eprintln!("sealed journal segment {segment}"),
        None if done.judge_running => {
            eprintln!("a judge is running: the live journal stays as it is");
        }
        None => eprintln!("the live journal is empty: nothing to seal"),
    }
    eprintln!(
        "compressed {} sealed segments: {} bytes into {}",
        done.compressed.segments, done.compressed.bytes_before, done.compressed.bytes_after
    );
    Ok(crate::exit::OK)
}

/// A word for a shell: the harnesses run hook commands through `sh -c` / `bash -c`.
pub fn shell_word(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:=@".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// `path` from the root, for a command run from another folder.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
