//! The command line, defined once: help text, completions and the man page all come from here.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "doorbell",
    version,
    about = "A local message bridge for a team of AI agents: inboxes, a judge, and a doorbell for unanswered requests",
    after_help = "A message is a doorbell, never an instruction: doorbell carries questions and answers, it never runs what they say."
)]
pub struct Cli {
    /// The bridge folder (default: `$DOORBELL_DIR`, the config's `dir`, or `~/.local/share/doorbell`)
    #[arg(long, global = true, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The config file (default: `$XDG_CONFIG_HOME/doorbell/doorbell.toml`)
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Append a message to other agents' inboxes and print its id
    Send(Box<SendArgs>),
    /// Answer request ID: fills --to, --correlates-to and --context-id from the ledger
    Reply(ReplyArgs),
    /// The requester cancels its request
    Cancel(CancelArgs),
    /// Show accepted messages past an agent's cursor, then move the cursor
    Read(ReadArgs),
    /// One message: envelope, verdict, delivered / read / answered, its thread
    Show(ShowArgs),
    /// Open debts: request, debtor, creditor, state, silent since, rings
    Debts(DebtsArgs),
    /// Every message of a thread, in order
    Thread(ThreadArgs),
    /// Print an agent's backlog, then each new accepted message as it is judged
    Watch(WatchArgs),
    /// Block until requests are answered (terminal or input-required): each, or with --any the first
    Wait(WaitArgs),
    /// Per agent: unread, owes, is owed, last activity; the judge; refusals; warnings
    Status(StatusArgs),
    /// The stalled-request report: what is stuck and who owes whom
    Report(ReportArgs),
    /// Apply the stateless rules to every line of inbox files, offline
    Check(CheckArgs),
    /// Run the judge in the foreground: tail every inbox, judge, notify (systemd runs this)
    Daemon(DaemonArgs),
    /// Seal the live journal (when no daemon runs) and compress the sealed segments
    Compact,
    /// Create and list stations
    #[command(subcommand)]
    Agent(AgentCommand),
    /// A harness hook: read the harness's JSON on stdin, answer in its JSON on stdout
    Hook(HookArgs),
    /// Serve MCP on stdin and stdout as one agent: send, reply, read, wait, debts, show, status
    Mcp(McpArgs),
    /// Print the ledger's requests as A2A Tasks with their messages, one JSON line each
    Export(ExportArgs),
    /// The A2A 1.0 gateway: every station an A2A agent for the config's [[remote]] callers
    #[command(subcommand)]
    A2a(A2aCommand),
    /// Print (or --write: merge) the hook and MCP configuration of a harness for an agent
    Setup(SetupArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell)
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff)
    Man,
}

/// How long a sender waits for an inbox another process holds locked (`send`, `reply`,
/// `cancel`).
#[derive(Debug, Default, Clone, Args)]
pub struct LockWait {
    /// How long to wait for an inbox another process holds locked, then give up with exit 1
    /// (default 10s).
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
}

#[derive(Debug, Default, Args)]
pub struct SendArgs {
    /// Recipient; repeat it, or say `all`, for a broadcast
    #[arg(long, required = true, value_name = "AGENT")]
    pub to: Vec<String>,
    /// Sender (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub from: Option<String>,
    /// request, response or note (default: note, or response with --correlates-to)
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
    /// The request's state after this message (a response needs one)
    #[arg(long, value_name = "STATE")]
    pub state: Option<String>,
    /// The request this message answers
    #[arg(long, value_name = "ID")]
    pub correlates_to: Option<String>,
    /// The thread (default: a request's own id, a response's request's)
    #[arg(long, value_name = "ID")]
    pub context_id: Option<String>,
    /// The work item in the recipient's queue, carried as is
    #[arg(long, value_name = "ID")]
    pub task_id: Option<String>,
    /// 0 low, 1 normal, 2 high, 3 critical
    #[arg(long, value_name = "N")]
    pub priority: Option<u8>,
    /// When the answer is needed: RFC 3339, or a duration from now such as 2h
    #[arg(long, value_name = "TIME")]
    pub reply_by: Option<String>,
    /// A JSON object to send as a data part
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// The message id (default: a new ULID); reuse it to retry safely
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// The text, or - to read it from stdin (the default when there is no --data)
    #[arg(value_name = "TEXT", allow_hyphen_values = false)]
    pub text: Option<String>,
    #[command(flatten)]
    pub lock: LockWait,
}

#[derive(Debug, Args)]
pub struct ReplyArgs {
    /// The request to answer
    pub id: String,
    /// The request's state after this answer: working, input-required, completed, failed,
    /// rejected (addressee); working, canceled (requester)
    #[arg(long, value_name = "STATE")]
    pub state: String,
    /// Who answers (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub from: Option<String>,
    /// A JSON object to send as a data part
    #[arg(long, value_name = "JSON")]
    pub data: Option<String>,
    /// The answer's id (default: a new ULID); reuse it to retry safely
    #[arg(long = "id", id = "reply_id", value_name = "ID")]
    pub reply_id: Option<String>,
    /// The text, or - to read it from stdin
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
    #[command(flatten)]
    pub lock: LockWait,
}

#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The request to cancel
    pub id: String,
    /// The requester (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub from: Option<String>,
    /// Why, or - to read it from stdin
    #[arg(value_name = "TEXT")]
    pub text: Option<String>,
    #[command(flatten)]
    pub lock: LockWait,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The message's id
    pub id: String,
    /// One JSON document
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DebtsArgs {
    /// Only debts this agent owes
    #[arg(long, value_name = "AGENT")]
    pub owed_by: Option<String>,
    /// One JSON document
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SetupArgs {
    /// The harness to arm
    #[arg(value_enum)]
    pub harness: Harness,
    /// The agent it runs as (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub agent: String,
    /// Write the project's files in DIR instead of the user's own
    #[arg(long, value_name = "DIR")]
    pub project: Option<PathBuf>,
    /// Merge into the files (each changed one is first copied to `<file>.doorbell-backup`)
    #[arg(long)]
    pub write: bool,
}

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The agent the server acts as (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub agent: String,
}

/// The coding harness a hook runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Harness {
    Claude,
    Codex,
    Gemini,
}

#[derive(Debug, Args)]
pub struct HookArgs {
    /// The harness's event: `SessionStart`, `UserPromptSubmit`, `PostToolUse`, `Stop` (Claude
    /// Code, Codex); `SessionStart`, `BeforeAgent`, `AfterTool`, `AfterAgent` (Gemini CLI)
    pub event: String,
    /// The agent whose inbox this is (default: `$DOORBELL_AGENT`)
    #[arg(long, env = "DOORBELL_AGENT", value_name = "AGENT")]
    pub agent: Option<String>,
    /// Whose JSON to read and write
    #[arg(long, value_enum, default_value = "claude")]
    pub harness: Harness,
}

#[derive(Debug, Args)]
pub struct ThreadArgs {
    /// The thread's contextId (a request's id, unless it named another), or the id of any
    /// message in it
    pub context: String,
    /// One JSON line per message
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[allow(clippy::struct_excessive_bools)] // clap flags
pub struct ReadArgs {
    /// Whose inbox
    pub agent: String,
    /// Show without moving the cursor
    #[arg(long)]
    pub peek: bool,
    /// Show every accepted message, read or not
    #[arg(long)]
    pub all: bool,
    /// One JSON line per message
    #[arg(long)]
    pub json: bool,
    /// Print only the messages that fit in this many characters (at least one), counted as
    /// the harnesses count them (UTF-16 code units: an emoji is two); the rest stay unread,
    /// counted on the last line
    #[arg(long, value_name = "N", conflicts_with = "wait")]
    pub max_chars: Option<usize>,
    /// Block until at least one unread message, print, move the cursor, exit
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up after this long (exit 124)
    #[arg(
        long,
        default_value = "60s",
        value_name = "DURATION",
        requires = "wait"
    )]
    pub timeout: String,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Whose inbox
    pub agent: String,
    /// One JSON line per message
    #[arg(long)]
    pub json: bool,
    /// Print every line from this process. By default a `--json` watch whose output is a
    /// pipe hands the pipe to the running daemon, which writes each message to it as it is
    /// judged (and moves the cursor), one process hop fewer
    #[arg(long)]
    pub keep_output: bool,
}

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The requests to wait for; a broadcast's id stands for its requests, one per station
    #[arg(required = true, value_name = "ID")]
    pub ids: Vec<String>,
    /// Give up after this long (exit 124)
    #[arg(long, default_value = "60s", value_name = "DURATION")]
    pub timeout: String,
    /// Return at the first answer: any response from the addressee counts (the requester's
    /// own input, after input-required, hands the turn back), and of several requests the one
    /// answered first ends the wait
    #[arg(long)]
    pub any: bool,
    /// One JSON document a line, one line for each request answered (`id`, `state`,
    /// `response`): a broadcast's id or several ids give several lines
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    Text,
    Markdown,
    Json,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The window: a duration back from now (24h) or an RFC 3339 time (default: since the
    /// last daily report, with --daily the last before today's, else 24 h)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// text for a terminal, markdown for files, json for machines (default: text, or markdown
    /// with --out)
    #[arg(long, value_enum)]
    pub format: Option<ReportFormat>,
    /// Write the report to this file (atomically) instead of stdout
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
    /// Write reports/<local date>.md and post its summary to the human station, once
    #[arg(long, conflicts_with_all = ["format", "out"])]
    pub daily: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One JSON document (as --format json)
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// text (the default), json, or markdown: the board a daemon with `board = true` keeps
    /// in STATUS.md
    #[arg(long, value_enum)]
    pub format: Option<StatusFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFormat {
    Text,
    Json,
    Markdown,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Inbox files (default: every inbox of the bridge)
    pub files: Vec<PathBuf>,
    /// The line limit (default: the config's `max_line_bytes`)
    #[arg(long, value_name = "BYTES")]
    pub max_line_bytes: Option<usize>,
    /// One JSON line per judged line
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DaemonArgs {
    /// Judge everything waiting, write what is due, then exit
    #[arg(long)]
    pub once: bool,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// As A2A Tasks (the one format there is)
    #[arg(long, required = true)]
    pub a2a: bool,
    /// Only requests open now or closed since: a duration back from now (24h) or an RFC 3339
    /// time (default: every request)
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// The A2A version of the JSON: 1.0 (its `ProtoJSON`) or 0.3
    #[arg(long, value_name = "VERSION", default_value = "1.0", value_parser = ["1.0", "0.3"])]
    pub version: String,
}

#[derive(Debug, Subcommand)]
pub enum A2aCommand {
    /// Serve A2A over HTTP until SIGTERM or SIGINT (the daemon does too, with [a2a] listen)
    Serve {
        /// The address and port (default: the config's [a2a] listen, else 127.0.0.1:7717)
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Create an agent's inbox (and the bridge folder when needed)
    Add {
        /// The agent's name: [a-z0-9][a-z0-9._-]{0,63}
        name: String,
    },
    /// List stations, loops and their inboxes
    List {
        #[arg(long)]
        json: bool,
    },
}

impl Cli {
    pub fn run(self) -> anyhow::Result<i32> {
        crate::session::init_tracing();
        let (dir, config) = (self.dir, self.config);
        let session = || crate::session::Session::new(dir.as_deref(), config.as_deref());
        match self.command {
            Command::Send(args) => crate::send::run(&session()?, &args),
            Command::Reply(args) => crate::reply::reply(&session()?, args),
            Command::Cancel(args) => crate::reply::cancel(&session()?, args),
            Command::Read(args) => crate::read::run(&session()?, &args),
            Command::Show(args) => crate::show::show(&session()?, &args),
            Command::Debts(args) => crate::show::debts(&session()?, &args),
            Command::Thread(args) => crate::show::thread(&session()?, &args),
            Command::Watch(args) => crate::watch::run(&session()?, &args),
            Command::Wait(args) => crate::wait::run(&session()?, &args),
            Command::Status(args) => crate::status::run(&session()?, &args),
            Command::Report(args) => crate::report::run(&session()?, &args),
            Command::Check(args) => crate::check::run(&session()?, &args),
            Command::Daemon(args) if args.once => crate::session::daemon_once(&session()?),
            Command::Daemon(_) => crate::daemon::run(&session()?, config.as_deref()),
            Command::Compact => crate::session::compact(&session()?),
            // A hook never fails its harness's turn: errors are said on stderr, no decision.
            Command::Hook(args) => Ok(crate::hook::run(dir.as_deref(), config.as_deref(), &args)),
            Command::Mcp(args) => crate::mcp::run(session()?, &args.agent),
            Command::Export(args) => crate::export::run(&session()?, &args),
            Command::A2a(A2aCommand::Serve { listen }) => crate::a2a::serve(&session()?, listen),
            Command::Setup(args) => crate::setup::run(&session()?, &args),
            Command::Agent(AgentCommand::Add { name }) => crate::agent::add(&session()?, &name),
            Command::Agent(AgentCommand::List { json }) => crate::agent::list(&session()?, json),
            // Generated from the command definitions: no bridge and no config needed.
            Command::Completions { shell } => {
                let mut command = <Cli as clap::CommandFactory>::command();
                let mut out = Vec::new();
                clap_complete::generate(shell, &mut command, "doorbell", &mut out);
                crate::exit::print_bytes(&out)
            }
            Command::Man => {
                let mut out = Vec::new();
                clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut out)?;
                crate::exit::print_bytes(&out)
            }
        }
    }
}
