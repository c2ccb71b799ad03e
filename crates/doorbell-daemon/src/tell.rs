//! Telling watchers directly. The daemon listens on `.doorbell/watch.sock`; a watcher
//! (`doorbell watch`, `read --wait`) that connects is handed, after every step of the judge,
//! the bytes the judge just appended to its journal. It reads them as if from the journal
//! file, so the journal stays the only truth, but nothing waits for a file event on it and
//! nothing reads it again.
//!
//! It is only a shortcut. A watcher that connects late, is dropped for not reading, sees a
//! roll, or loses the daemon reads the journal file from where it stands, as it always could;
//! bytes it already has are skipped by their place in the file. The judge never waits for a
//! watcher: a watcher whose socket is full is let go.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use doorbell_store::journal::Appended;

/// The socket's name in `.doorbell/`.
pub const SOCKET: &str = "watch.sock";
/// What the daemon says first: from the moment it is said, every append is told.
const GREETING: &str = "doorbell watchers 1\n";
/// At most this many watchers are told; the next ones follow the journal file.
const MAX_WATCHERS: usize = 64;
/// How long a watcher waits for the greeting before it follows the file instead.
const GREETING_WAIT: Duration = Duration::from_secs(2);
/// The most bytes one frame may carry (the journal's copy lets go well before).
const MAX_FRAME: u64 = 8 << 20;

/// The daemon's side: the socket and the watchers connected to it.
#[derive(Debug)]
pub struct Watchers {
    streams: Arc<Mutex<Vec<UnixStream>>>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Watchers {
    /// Listen in `state` (the bridge's `.doorbell/`). The judge holds the bridge lock, so a
    /// socket already there is a dead daemon's: it is replaced.
    pub fn listen(state: &Path) -> std::io::Result<Watchers> {
        let path = state.join(SOCKET);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let streams = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (list, stopping) = (Arc::clone(&streams), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("watchers".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopping.load(Ordering::Relaxed) {
                        return;
                    }
                    match stream {
                        Ok(stream) => welcome(&list, stream),
                        Err(error) => {
                            // Watchers still follow the journal file; only the shortcut is lost.
                            tracing::warn!(%error, "no longer accepting watchers on the socket");
                            return;
                        }
                    }
                }
            })?;
        Ok(Watchers {
            streams,
            path,
            stop,
        })
    }

    /// Hand `appended` to every watcher; one that cannot take it now is let go.
    pub fn tell(&self, appended: &Appended) {
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if streams.is_empty() {
            return;
        }
        let mut frame = format!(
            "appended {} {} {} {}\n",
            appended.dev,
            appended.ino,
            appended.from,
            appended.bytes.len()
        )
        .into_bytes();
        frame.extend_from_slice(&appended.bytes);
        streams.retain_mut(|stream| match stream.write_all(&frame) {
            Ok(()) => true,
            Err(error) => {
                tracing::info!(%error, "a watcher that does not keep up is let go: it reads the journal file");
                false
            }
        });
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the listening thread so that it ends, then take the socket away.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Greet a watcher and start telling it. The greeting is written with the list locked, so
/// no frame comes before it, and every append told after it reaches this watcher.
fn welcome(list: &Mutex<Vec<UnixStream>>, mut stream: UnixStream) {
    let mut streams = list.lock().unwrap_or_else(PoisonError::into_inner);
    if streams.len() >= MAX_WATCHERS {
        return;
    }
    if stream.set_nonblocking(true).is_err() || stream.write_all(GREETING.as_bytes()).is_err() {
        return;
    }
    streams.push(stream);
}

/// A watcher's side: what the daemon tells.
#[derive(Debug)]
pub struct Told {
    stream: UnixStream,
    /// What was read and not yet handed out, from `start`.
    buf: Vec<u8>,
    start: usize,
    /// The daemon closed its end: once `buf` is handed out, it is gone.
    closed: bool,
}

/// What came from the daemon.
#[derive(Debug)]
pub enum Next {
    Appended(Appended),
    /// The deadline passed first.
    TimedOut,
    /// The daemon stopped, or let this watcher go: follow the journal file.
    Gone,
}

/// How much is read from the socket at a time.
const READ_BYTES: usize = 256 << 10;

impl Told {
    /// Connect to the daemon of the bridge whose state folder is `state`. `None` when none
    /// tells (none runs, or it does not answer in time).
    #[must_use]
    pub fn connect(state: &Path) -> Option<Told> {
        let stream = UnixStream::connect(state.join(SOCKET)).ok()?;
        let mut told = Told {
            stream,
            buf: Vec::new(),
            start: 0,
            closed: false,
        };
        let deadline = Instant::now() + GREETING_WAIT;
        loop {
            if let Some(end) = told.buf.iter().position(|b| *b == b'\n') {
                if &told.buf[..=end] != GREETING.as_bytes() {
                    return None;
                }
                told.start = end + 1;
                return Some(told);
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            if told.closed || told.buf.len() > GREETING.len() || !told.fill(Some(left)).ok()? {
                return None;
            }
        }
    }

    /// Wait for the next append the daemon tells, until `deadline` if one is given.
    pub fn next(&mut self, deadline: Option<Instant>) -> Next {
        loop {
            match self.frame() {
                Err(()) => return Next::Gone,
                Ok(Some(appended)) => return Next::Appended(appended),
                Ok(None) if self.closed => return Next::Gone,
                Ok(None) => {}
            }
            let wait = match deadline {
                None => None,
                Some(at) => match at.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Next::TimedOut,
                },
            };
            match self.fill(wait) {
                Ok(true) => {}
                Ok(false) => return Next::TimedOut,
                Err(_) => return Next::Gone,
            }
        }
    }

    /// The next append if it has arrived whole already, without waiting. (That the daemon
    /// is gone is for [`Told::next`] to say.)
    pub fn ready(&mut self) -> Option<Appended> {
        if let Ok(Some(appended)) = self.frame() {
            return Some(appended);
        }
        if !self.closed && self.fill(Some(Duration::ZERO)).ok()? {
            return self.frame().ok().flatten();
        }
        None
    }

    /// A whole frame from what was read, if there is one; `Err` for bytes that are none.
    fn frame(&mut self) -> Result<Option<Appended>, ()> {
        let pending = &self.buf[self.start..];
        let Some(end) = pending.iter().position(|b| *b == b'\n') else {
            // A header is short: this much without one is not a frame.
            return if pending.len() > 128 {
                Err(())
            } else {
                Ok(None)
            };
        };
        let header = std::str::from_utf8(&pending[..=end]).map_err(|_| ())?;
        let (dev, ino, from, len) = parse_header(header).ok_or(())?;
        let len = usize::try_from(len).map_err(|_| ())?;
        let Some(bytes) = pending.get(end + 1..end + 1 + len) else {
            return Ok(None);
        };
        let appended = Appended {
            dev,
            ino,
            from,
            bytes: bytes.to_vec(),
        };
        self.start += end + 1 + len;
        Ok(Some(appended))
    }

    /// Wait up to `wait` (`None`: without end) for bytes, and read what is there. False
    /// when the wait ran out first.
    fn fill(&mut self, wait: Option<Duration>) -> std::io::Result<bool> {
        let timeout = wait.map(|wait| rustix::event::Timespec {
            tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(wait.subsec_nanos()),
        });
        let mut fds = [rustix::event::PollFd::new(
            &self.stream,
            rustix::event::PollFlags::IN,
        )];
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => return Ok(true),
            Err(e) => return Err(e.into()),
        }
        // What was handed out makes room.
        if self.start > 0 && self.start * 2 >= self.buf.len() {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let len = self.buf.len();
        self.buf.resize(len + READ_BYTES, 0);
        let read = self.stream.read(&mut self.buf[len..]);
        self.buf.truncate(len + *read.as_ref().unwrap_or(&0));
        match read {
            Ok(0) => self.closed = true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}

/// `appended DEV INO FROM LEN\n`.
fn parse_header(line: &str) -> Option<(u64, u64, u64, u64)> {
    let mut words = line.strip_suffix('\n')?.split(' ');
    if words.next()? != "appended" {
        return None;
    }
    let mut number = || words.next()?.parse::<u64>().ok();
    let (dev, ino, from, len) = (number()?, number()?, number()?, number()?);
    (words.next().is_none() && len <= MAX_FRAME).then_some((dev, ino, from, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appended(from: u64, bytes: &[u8]) -> Appended {
        Appended {
            dev: 7,
            ino: 9,
            from,
            bytes: bytes.to_vec(),
        }
    }

    #[test]
    fn a_watcher_is_told_every_append_after_the_greeting_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let watchers = Watchers::listen(dir.path()).unwrap();
        let mut told = Told::connect(dir.path()).expect("the daemon greets");
        watchers.tell(&appended(0, b"{\"a\":1}\n"));
        watchers.tell(&appended(8, b"{\"b\":2}\n{\"c\":3}\n"));
        let Next::Appended(first) = told.next(None) else {
            panic!("the first append")
        };
        assert_eq!(first, appended(0, b"{\"a\":1}\n"));
        let Next::Appended(second) = told.next(None) else {
            panic!("the second append")
        };
        assert_eq!(second, appended(8, b"{\"b\":2}\n{\"c\":3}\n"));
        // Nothing more: the deadline ends the wait.
        let soon = Instant::now() + Duration::from_millis(20);
        assert!(matches!(told.next(Some(soon)), Next::TimedOut));
        // The daemon goes: the socket with it, and the watcher is told it is gone.
        drop(watchers);
        assert!(matches!(told.next(None), Next::Gone));
        assert!(!dir.path().join(SOCKET).exists());
        assert!(Told::connect(dir.path()).is_none());
    }

    #[test]
    fn a_watcher_that_does_not_read_is_let_go_and_the_judge_never_waits() {
        let dir = tempfile::tempdir().unwrap();
        let watchers = Watchers::listen(dir.path()).unwrap();
        let mut stalled = Told::connect(dir.path()).unwrap();
        let big = appended(0, &vec![b'x'; 64 << 10]);
        // Far more than a socket holds: each tell returns at once.
        for _ in 0..64 {
            watchers.tell(&big);
        }
        assert!(watchers.streams.lock().unwrap().is_empty());
        // What it was told before it was let go is whole; then it is told it is gone.
        let mut frames = 0;
        loop {
            match stalled.next(None) {
                Next::Appended(frame) => {
                    assert_eq!(frame, big);
                    frames += 1;
                }
                Next::Gone => break,
                Next::TimedOut => unreachable!("no deadline"),
            }
        }
        assert!(frames < 64, "{frames} frames");
    }

    #[test]
    fn a_stale_socket_is_replaced_and_bad_headers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        // A socket left by a killed daemon: nobody listens.
        let stale = UnixListener::bind(dir.path().join(SOCKET)).unwrap();
        drop(stale);
        assert!(Told::connect(dir.path()).is_none());
        let _watchers = Watchers::listen(dir.path()).unwrap();
        assert!(Told::connect(dir.path()).is_some());
        assert_eq!(parse_header("appended 1 2 3 4\n"), Some((1, 2, 3, 4)));
        for bad in [
            "appended 1 2 3\n",
            "appended 1 2 3 4 5\n",
            "appended 1 2 3 -4\n",
            "appended 1 2 3 4",
            "other 1 2 3 4\n",
            "appended 1 2 3 99999999999\n",
        ] {
            assert_eq!(parse_header(bad), None, "{bad:?}");
        }
    }
}
