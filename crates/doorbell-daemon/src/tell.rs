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
//!
//! A watch whose output the daemon prints to ([`crate::deliver`]) is printed to by whoever
//! holds the printing: the judge, once it has judged all there was, when its last tell was
//! [`BURST_GAP`] ago or more and nobody else prints (a message's way stays on the thread it
//! woke); the socket's thread while the judge has more lines to judge, tells again within
//! the gap (a burst), or finds a print under way. What the judge appends is queued first,
//! so every watch takes it in the order it was appended, whoever prints it.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};

use doorbell_store::journal::Appended;
use doorbell_store::Bridge;

use std::os::fd::AsFd;

use crate::deliver::{Delivery, Outcome, Record, Request, BACK, CLOSED, DELIVERING};

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
/// The most bytes queued for the watches printed to; past it the queue is let go and they
/// read the journal file instead.
const MAX_QUEUED: usize = 8 << 20;
/// A tell this soon after the last one is a burst's: its lines are printed on the socket's
/// thread while the judge judges the next.
const BURST_GAP: Duration = Duration::from_millis(2);

/// Who is connected: watchers told every append, how many watchers the daemon prints to
/// (their deliveries are in [`Printing`]), and what the judge appended that those have not
/// taken.
#[derive(Debug, Default)]
struct Connected {
    streams: Vec<Arc<UnixStream>>,
    printing: usize,
    queued: Vec<Arc<Appended>>,
    queued_bytes: usize,
    /// The queue was let go: the watches printed to read the journal file.
    missed: bool,
    /// When the judge last told: a tell soon after it is a burst's.
    told_at: Option<Instant>,
}

impl Connected {
    fn len(&self) -> usize {
        self.streams.len() + self.printing
    }

    /// One watch printed to fewer; with none left, nothing stays queued.
    fn printed_one_fewer(&mut self) {
        self.printing -= 1;
        if self.printing == 0 {
            self.queued = Vec::new();
            self.queued_bytes = 0;
            self.missed = false;
        }
    }

    /// Queue `appended` for the watches printed to; false when none is.
    fn queue(&mut self, appended: &Arc<Appended>) -> bool {
        if self.printing == 0 {
            return false;
        }
        if self.missed {
            return true;
        }
        let size = appended.held_bytes();
        if self.queued_bytes + size > MAX_QUEUED {
            self.queued.clear();
            self.queued_bytes = 0;
            self.missed = true;
        } else {
            self.queued_bytes += size;
            self.queued.push(Arc::clone(appended));
        }
        true
    }
}

/// The watches the daemon prints to. Whoever holds the lock prints; the judge only tries it.
type Printing = Arc<Mutex<Vec<Delivery>>>;

/// The daemon's side: the socket and the watchers connected to it.
#[derive(Debug)]
pub struct Watchers {
    connected: Arc<Mutex<Connected>>,
    printing: Printing,
    bridge: Option<Bridge>,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    /// Wakes the socket's thread: to stop, or to print what was queued.
    wake: UnixStream,
    serving: Option<std::thread::JoinHandle<()>>,
}

impl Watchers {
    /// Listen in `state` (the bridge's `.doorbell/`). The judge holds the bridge lock, so a
    /// socket already there is a dead daemon's: it is replaced. With `bridge`, a watcher may
    /// hand the daemon its output ([`crate::deliver`]).
    pub fn listen(state: &Path, bridge: Option<Bridge>) -> std::io::Result<Watchers> {
        let path = state.join(SOCKET);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let connected = Arc::new(Mutex::new(Connected::default()));
        let printing = Printing::default();
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Serving {
            listener,
            woken,
            connected: Arc::clone(&connected),
            printing: Arc::clone(&printing),
            stop: Arc::clone(&stop),
            bridge: bridge.clone(),
        };
        let serving = std::thread::Builder::new()
            .name("watchers".into())
            .spawn(move || serving.serve())?;
        Ok(Watchers {
            connected,
            printing,
            bridge,
            path,
            stop,
            wake,
            serving: Some(serving),
        })
    }

    /// Hand `appended` to every watcher; one that cannot take it now is let go. Watchers
    /// whose output is here get their lines printed on this thread when `more` is false (the
    /// judge has judged all there was), the last tell was [`BURST_GAP`] ago or more, and
    /// nobody prints now; else on the socket's thread.
    pub fn tell(&self, appended: Appended, more: bool) {
        let appended = Arc::new(appended);
        let (queued, burst) = {
            let mut connected = self
                .connected
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let burst = connected
                .told_at
                .replace(now)
                .is_some_and(|at| now.duration_since(at) < BURST_GAP);
            (connected.queue(&appended), burst)
        };
        if queued && (more || burst || !self.print_here()) {
            let _ = (&self.wake).write(&[1]);
        }
        self.tell_streams(&appended);
    }

    /// Print what is queued on this thread, when nobody prints now. False when somebody
    /// does (what is queued is theirs to print), or this daemon prints for no watch.
    fn print_here(&self) -> bool {
        let mut deliveries = match self.printing.try_lock() {
            Ok(deliveries) => deliveries,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return false,
        };
        let Some(bridge) = &self.bridge else {
            return false;
        };
        if print_queued(&mut deliveries, &self.connected, bridge) {
            // A pipe took no more: the socket's thread waits for it to take more.
            let _ = (&self.wake).write(&[1]);
        }
        true
    }

    /// Frame `appended` for the watchers told every append.
    fn tell_streams(&self, appended: &Appended) {
        let mut connected = self
            .connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if connected.streams.is_empty() {
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
        connected.streams.retain(|stream| match (&**stream).write_all(&frame) {
            Ok(()) => true,
            Err(error) => {
                tracing::info!(%error, "a watcher that does not keep up is let go: it reads the journal file");
                // Closed now, though the socket's thread may hold it a while yet.
                let _ = stream.shutdown(std::net::Shutdown::Both);
                false
            }
        });
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = (&self.wake).write(&[1]);
        let _ = std::fs::remove_file(&self.path);
        // The socket's thread prints what is queued, then each watch whose output is here
        // prints again itself, from where that stopped.
        if let Some(serving) = self.serving.take() {
            let _ = serving.join();
        }
        // A thread that ended without its stop (a panic) left them here.
        let mut deliveries = self.printing.lock().unwrap_or_else(PoisonError::into_inner);
        hand_back_all(&mut deliveries, &self.connected);
    }
}

/// The socket's thread: it takes new watchers, hears what they say (a request to print
/// for them, or that they hung up), prints for the watches whose output is here, and waits
/// for full pipes to take more.
struct Serving {
    listener: UnixListener,
    woken: UnixStream,
    connected: Arc<Mutex<Connected>>,
    printing: Printing,
    stop: Arc<AtomicBool>,
    bridge: Option<Bridge>,
}

impl Serving {
    fn serve(self) {
        use rustix::event::{poll, PollFd, PollFlags};
        loop {
            let (conns, pipes) = {
                let mut deliveries = self.deliveries();
                if let Some(bridge) = &self.bridge {
                    print_queued(&mut deliveries, &self.connected, bridge);
                }
                let connected = self.lock();
                let conns: Vec<Arc<UnixStream>> = connected
                    .streams
                    .iter()
                    .cloned()
                    .chain(deliveries.iter().map(|d| Arc::clone(&d.conn)))
                    .collect();
                // Every output printed to: a full one until it takes more, and any one for
                // its reader going away (a pipe's POLLERR, a socket's or terminal's POLLHUP,
                // reported unasked), though nothing more is written to it: left in the set,
                // either would wake this loop again at once.
                let pipes: Vec<(Arc<std::fs::File>, bool)> = deliveries
                    .iter()
                    .map(|d| (Arc::clone(&d.out), d.stalled))
                    .collect();
                (conns, pipes)
            };
            let mut fds = Vec::with_capacity(2 + conns.len() + pipes.len());
            fds.push(PollFd::new(&self.listener, PollFlags::IN));
            fds.push(PollFd::new(&self.woken, PollFlags::IN));
            fds.extend(conns.iter().map(|c| PollFd::new(&**c, PollFlags::IN)));
            fds.extend(pipes.iter().map(|(pipe, stalled)| {
                let wanted = if *stalled {
                    PollFlags::OUT
                } else {
                    PollFlags::empty()
                };
                PollFd::new(&**pipe, wanted)
            }));
            match poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(error) => {
                    // Watchers still follow the journal file; only the shortcut is lost.
                    tracing::warn!(%error, "no longer hearing watchers on the socket");
                    self.stopped();
                    return;
                }
            }
            let revents: Vec<PollFlags> = fds.iter().map(PollFd::revents).collect();
            let events: Vec<bool> = revents.iter().map(|r| !r.is_empty()).collect();
            drop(fds);
            if events[1] {
                let mut drained = [0; 64];
                while matches!((&self.woken).read(&mut drained), Ok(n) if n > 0) {}
            }
            // After the wake-ups are read: the stop is set before its wake-up is written, so
            // one read here is seen here, and one written after wakes the next poll.
            if self.stop.load(Ordering::Relaxed) {
                self.stopped();
                return;
            }
            if events[0] {
                while let Ok((stream, _)) = self.listener.accept() {
                    welcome(&self.connected, stream);
                }
            }
            for (conn, _) in conns.iter().zip(&events[2..]).filter(|(_, e)| **e) {
                self.heard(conn);
            }
            let pipes_events = &revents[2 + conns.len()..];
            for ((pipe, _), revents) in pipes.iter().zip(pipes_events) {
                if revents.intersects(PollFlags::ERR | PollFlags::HUP) {
                    self.reader_gone(pipe);
                } else if revents.contains(PollFlags::OUT) {
                    self.drained(pipe);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connected> {
        self.connected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn deliveries(&self) -> std::sync::MutexGuard<'_, Vec<Delivery>> {
        self.printing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The daemon stops: what is queued is printed, then each watch whose output is here
    /// prints again itself, from where this stopped.
    fn stopped(&self) {
        let mut deliveries = self.deliveries();
        if let Some(bridge) = &self.bridge {
            print_queued(&mut deliveries, &self.connected, bridge);
        }
        hand_back_all(&mut deliveries, &self.connected);
    }

    /// A watcher said something, or hung up.
    fn heard(&self, conn: &Arc<UnixStream>) {
        {
            let mut deliveries = self.deliveries();
            if let Some(at) = deliveries.iter().position(|d| Arc::ptr_eq(&d.conn, conn)) {
                // A watch says nothing while its output is here: it went away. Its pipe is
                // closed with it, so that the pipe's reader sees the end.
                drop(deliveries.swap_remove(at));
                self.lock().printed_one_fewer();
                return;
            }
        }
        let mut connected = self.lock();
        let Some(at) = connected.streams.iter().position(|s| Arc::ptr_eq(s, conn)) else {
            return;
        };
        let said = hear(conn);
        if matches!(said, Said::Nothing) {
            return;
        }
        connected.streams.swap_remove(at);
        let Said::Request(request, out, record) = said else {
            return;
        };
        let Some(bridge) = &self.bridge else {
            refuse(conn, "this daemon prints for no watcher");
            connected.streams.push(Arc::clone(conn));
            return;
        };
        // From here what the judge appends is queued for it. What it appended before, and
        // what others print from the queue before this delivery is among them, is in the
        // journal file, which the view and its catch-up read; bytes read both ways are taken
        // once, by their place in the file.
        connected.printing += 1;
        drop(connected);
        let started = Delivery::start(bridge, Arc::clone(conn), &request, out, record);
        let mut delivery = match started {
            Ok(delivery) => delivery,
            Err(why) => {
                // It goes on being told; what was journaled meanwhile it reads from the file.
                refuse(conn, &why);
                let mut connected = self.lock();
                connected.printed_one_fewer();
                connected.streams.push(Arc::clone(conn));
                return;
            }
        };
        if (&**conn).write_all(DELIVERING.as_bytes()).is_err() {
            self.lock().printed_one_fewer();
            return;
        }
        // Held from the catch-up until it is among them: what is queued meanwhile waits.
        let mut deliveries = self.deliveries();
        match delivery.catch_up(bridge) {
            Outcome::Going => {
                tracing::info!(agent = %request.agent, "the daemon prints for a watch of the agent");
                deliveries.push(delivery);
            }
            outcome => {
                delivery.end(&outcome);
                self.lock().printed_one_fewer();
            }
        }
    }

    /// A pipe's last reader went away, whether or not anything was written since: the
    /// watch is told, and ends as it would at its next write.
    fn reader_gone(&self, pipe: &Arc<std::fs::File>) {
        let mut deliveries = self.deliveries();
        if let Some(at) = deliveries.iter().position(|d| Arc::ptr_eq(&d.out, pipe)) {
            let_go(&mut deliveries, &self.connected, at, &Outcome::Closed);
        }
    }

    /// A full pipe takes more.
    fn drained(&self, pipe: &Arc<std::fs::File>) {
        let Some(bridge) = &self.bridge else {
            return;
        };
        let mut deliveries = self.deliveries();
        let Some(at) = deliveries.iter().position(|d| Arc::ptr_eq(&d.out, pipe)) else {
            return;
        };
        match deliveries[at].resume(bridge) {
            Outcome::Going => {}
            outcome => let_go(&mut deliveries, &self.connected, at, &outcome),
        }
    }
}

/// Print what the judge queued for `deliveries`: each takes all of it, then prints in one
/// step (a queue let go: each reads the journal file). True when a pipe takes no more: the
/// socket's thread is to wait for it (it may be waiting already).
fn print_queued(
    deliveries: &mut Vec<Delivery>,
    connected: &Mutex<Connected>,
    bridge: &Bridge,
) -> bool {
    let (queued, missed) = {
        let mut connected = connected.lock().unwrap_or_else(PoisonError::into_inner);
        connected.queued_bytes = 0;
        (
            std::mem::take(&mut connected.queued),
            std::mem::take(&mut connected.missed),
        )
    };
    if queued.is_empty() && !missed {
        return false;
    }
    let mut at = 0;
    while at < deliveries.len() {
        let delivery = &mut deliveries[at];
        let outcome = if missed {
            delivery.catch_up(bridge)
        } else {
            delivery.take(bridge, &queued)
        };
        match outcome {
            Outcome::Going => at += 1,
            outcome => let_go(deliveries, connected, at, &outcome),
        }
    }
    deliveries.iter().any(|d| d.stalled)
}

/// Let go of the `at`th of `deliveries`, telling its watch how this ended.
fn let_go(
    deliveries: &mut Vec<Delivery>,
    connected: &Mutex<Connected>,
    at: usize,
    outcome: &Outcome,
) {
    deliveries.swap_remove(at).end(outcome);
    connected
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .printed_one_fewer();
}

/// The daemon stops: each watch whose output is in `deliveries` prints again itself.
fn hand_back_all(deliveries: &mut Vec<Delivery>, connected: &Mutex<Connected>) {
    while !deliveries.is_empty() {
        let_go(
            deliveries,
            connected,
            0,
            &Outcome::Back("the daemon stops".into()),
        );
    }
}

/// What a watcher said.
enum Said {
    /// Nothing yet.
    Nothing,
    /// Print for it: the request, the output, the record.
    Request(Request, std::os::fd::OwnedFd, std::os::fd::OwnedFd),
    /// It hung up, or said what is no request.
    Gone,
}

/// Read what a watcher says: one request, sent with its output and its record, in one
/// message.
fn hear(conn: &UnixStream) -> Said {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut bytes = [0u8; 512];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        conn,
        &mut [std::io::IoSliceMut::new(&mut bytes)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
    );
    let mut fds = Vec::new();
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    let n = match got {
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return Said::Nothing,
        Err(_) | Ok(rustix::net::RecvMsg { bytes: 0, .. }) => return Said::Gone,
        Ok(got) => got.bytes,
    };
    let request = std::str::from_utf8(&bytes[..n])
        .ok()
        .and_then(Request::parse);
    match (request, fds.len()) {
        (Some(request), 2) => {
            let record = fds.remove(1);
            Said::Request(request, fds.remove(0), record)
        }
        _ => Said::Gone,
    }
}

fn refuse(conn: &UnixStream, why: &str) {
    let why = why.replace('\n', " ");
    let _ = (&*conn).write_all(format!("refused {why}\n").as_bytes());
}

/// Greet a watcher and start telling it. The greeting is written with the list locked, so
/// no frame comes before it, and every append told after it reaches this watcher.
fn welcome(connected: &Mutex<Connected>, stream: UnixStream) {
    let mut connected = connected.lock().unwrap_or_else(PoisonError::into_inner);
    if connected.len() >= MAX_WATCHERS {
        return;
    }
    if stream.set_nonblocking(true).is_err() || (&stream).write_all(GREETING.as_bytes()).is_err() {
        return;
    }
    connected.streams.push(Arc::new(stream));
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

/// A piece of what the daemon says to a watcher.
#[derive(Debug)]
enum Piece {
    Appended(Appended),
    Delivering,
    Refused(String),
    Returned(Returned),
}

/// How handing the output over went.
#[derive(Debug)]
pub enum Handed {
    /// The daemon prints now: wait for [`Told::wait_return`].
    Delivering,
    /// It does not, and why; with what it told before it said so.
    Refused(String, Vec<Appended>),
    /// It stopped: follow the journal file.
    Gone,
}

/// How the daemon stopped printing for a watch.
#[derive(Debug, PartialEq, Eq)]
pub enum Returned {
    /// It gave the output back: the watch's record says how far it printed.
    Back,
    /// The pipe's reader went away.
    Closed,
    /// The daemon stopped.
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
        match self.piece()? {
            None => Ok(None),
            Some(Piece::Appended(appended)) => Ok(Some(appended)),
            Some(_) => Err(()),
        }
    }

    /// A whole piece of what the daemon says, if one was read; `Err` for bytes that are none.
    fn piece(&mut self) -> Result<Option<Piece>, ()> {
        let pending = &self.buf[self.start..];
        let Some(end) = pending.iter().position(|b| *b == b'\n') else {
            // A header is short: this much without one is not a frame.
            return if pending.len() > 512 {
                Err(())
            } else {
                Ok(None)
            };
        };
        let header = std::str::from_utf8(&pending[..=end]).map_err(|_| ())?;
        let (piece, len) = if header.starts_with("appended ") {
            let (dev, ino, from, len) = parse_header(header).ok_or(())?;
            let appended = Appended {
                dev,
                ino,
                from,
                ..Appended::default()
            };
            (Piece::Appended(appended), len)
        } else if header == BACK {
            (Piece::Returned(Returned::Back), 0)
        } else if header == CLOSED {
            (Piece::Returned(Returned::Closed), 0)
        } else if header == DELIVERING {
            (Piece::Delivering, 0)
        } else if let Some(why) = header.strip_prefix("refused ") {
            (Piece::Refused(why.trim_end().to_owned()), 0)
        } else {
            return Err(());
        };
        let len = usize::try_from(len).map_err(|_| ())?;
        let Some(bytes) = pending.get(end + 1..end + 1 + len) else {
            return Ok(None);
        };
        let piece = match piece {
            Piece::Appended(appended) => Piece::Appended(Appended {
                bytes: bytes.to_vec(),
                ..appended
            }),
            other => other,
        };
        self.start += end + 1 + len;
        Ok(Some(piece))
    }

    /// Hand the daemon `out` (this watch's output, a pipe) to print `request`'s lines to,
    /// keeping `record`. What it told before it answered comes back with the answer, to be
    /// taken as told.
    pub fn hand_over(
        &mut self,
        request: &Request,
        out: std::os::fd::BorrowedFd<'_>,
        record: &Record,
    ) -> Handed {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        let line = request.to_line();
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut ancillary = SendAncillaryBuffer::new(&mut space);
        let fds = [out, record.as_fd()];
        if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Handed::Refused("no room to send a file descriptor".into(), Vec::new());
        }
        match rustix::net::sendmsg(
            &self.stream,
            &[std::io::IoSlice::new(line.as_bytes())],
            &mut ancillary,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) if n == line.len() => {}
            _ => return Handed::Gone,
        }
        let mut told = Vec::new();
        loop {
            match self.piece() {
                Ok(Some(Piece::Appended(appended))) => told.push(appended),
                Ok(Some(Piece::Delivering)) => return Handed::Delivering,
                Ok(Some(Piece::Refused(why))) => return Handed::Refused(why, told),
                Err(()) | Ok(Some(Piece::Returned(_))) => return Handed::Gone,
                Ok(None) if self.closed => return Handed::Gone,
                Ok(None) => {
                    if self.fill(None).is_err() {
                        return Handed::Gone;
                    }
                }
            }
        }
    }

    /// Once handed over: wait until the daemon gives the output back, says the pipe's
    /// reader went away, or is gone.
    pub fn wait_return(&mut self) -> Returned {
        loop {
            match self.piece() {
                Ok(Some(Piece::Returned(returned))) => return returned,
                Err(()) | Ok(Some(_)) => return Returned::Gone,
                Ok(None) if self.closed => return Returned::Gone,
                Ok(None) => {
                    if self.fill(None).is_err() {
                        return Returned::Gone;
                    }
                }
            }
        }
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
            lines: Vec::new(),
        }
    }

    #[test]
    fn a_watcher_is_told_every_append_after_the_greeting_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let watchers = Watchers::listen(dir.path(), None).unwrap();
        let mut told = Told::connect(dir.path()).expect("the daemon greets");
        watchers.tell(appended(0, b"{\"a\":1}\n"), false);
        watchers.tell(appended(8, b"{\"b\":2}\n{\"c\":3}\n"), false);
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
        let watchers = Watchers::listen(dir.path(), None).unwrap();
        let mut stalled = Told::connect(dir.path()).unwrap();
        let big = appended(0, &vec![b'x'; 64 << 10]);
        // Far more than a socket holds: each tell returns at once.
        for _ in 0..64 {
            watchers.tell(big.clone(), false);
        }
        assert!(watchers.connected.lock().unwrap().streams.is_empty());
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
        let _watchers = Watchers::listen(dir.path(), None).unwrap();
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
