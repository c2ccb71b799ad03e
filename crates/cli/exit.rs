//! Exit codes and how failures reach a person: 0 ok, 1 runtime failure, 2 usage error or
//! refused input, 3 another process holds what the command needs (another judge the bridge,
//! or another reader the agent's inbox for longer than a reader waits).

use std::fmt;

pub const OK: i32 = 0;
pub const FAILURE: i32 = 1;
pub const REFUSED: i32 = 2;
pub const LOCKED: i32 = 3;

/// A failure with a chosen exit code; anything else is a runtime failure (exit 1).
#[derive(Debug)]
pub struct Exit {
    pub code: i32,
    pub message: String,
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Exit {}

/// Refused input or a usage error: exit 2.
pub fn refused(message: impl Into<String>) -> anyhow::Error {
    Exit {
        code: REFUSED,
        message: message.into(),
    }
    .into()
}

/// Print an error chain for a person and choose the exit code. A reader of our output that
/// went away is not an error: the command ends quietly, as it would have.
pub fn report(error: &anyhow::Error) -> i32 {
    let closed_pipe = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
    });
    if closed_pipe {
        return OK;
    }
    let code = if let Some(exit) = error.downcast_ref::<Exit>() {
        exit.code
    } else {
        match error.downcast_ref::<doorbell_store::Error>() {
            Some(
                doorbell_store::Error::Locked { .. } | doorbell_store::Error::ReaderBusy { .. },
            ) => LOCKED,
            Some(
                doorbell_store::Error::NoSuchAgent { .. }
                | doorbell_store::Error::BadAgentName { .. }
                | doorbell_store::Error::NotRegularFile { .. }
                | doorbell_store::Error::StateNotFolder { .. }
                | doorbell_store::Error::AgentExists { .. }
                | doorbell_store::Error::NameTaken { .. }
                | doorbell_store::Error::Config { .. }
                | doorbell_store::Error::Refused { .. },
            ) => REFUSED,
            _ => FAILURE,
        }
    };
    let mut message = error.to_string();
    for cause in error.chain().skip(1) {
        // Store errors already end with their cause ("open lock PATH: Read-only file
        // system"): say each thing once.
        let cause = cause.to_string();
        if !message.ends_with(&cause) {
            message.push_str(": ");
            message.push_str(&cause);
        }
    }
    // It may quote a file's name or an argument: safe for a terminal.
    eprintln!("doorbell: {}", doorbell_core::report::printable(&message));
    code
}

/// Write `bytes` to stdout; a reader that went away early is not an error.
pub fn print_bytes(bytes: &[u8]) -> anyhow::Result<i32> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(OK),
    }
}
