//! The A2A 1.0 gateway (DESIGN §11): every station of the bridge an A2A agent, over the
//! JSON-RPC binding on HTTP with Server-Sent Events for streams. A caller is a `[[remote]]`
//! of the config, named by its bearer token; what it sends lands in the station's inbox as
//! any sender's line would, and is judged by the same rules.

use std::net::SocketAddr;
use std::path::PathBuf;

pub mod forward;
mod listen;
pub mod proto;
pub mod rpc;
pub mod server;

pub use server::{bind, make_remote_inboxes, serve, Gateway};

/// The station a gateway URL names (`http://host:port/a2a/<station>`), when it names a valid
/// one: a remote's name on its own bridge.
#[must_use]
pub fn station_in_url(url: &str) -> Option<&str> {
    url.split(['?', '#'])
        .next()
        .and_then(|url| url.trim_end_matches('/').rsplit_once("/a2a/"))
        .map(|(_, name)| name)
        .filter(|name| doorbell_core::is_agent_name(name))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] doorbell_store::Error),
    #[error(transparent)]
    Daemon(#[from] doorbell_daemon::Error),
    #[error("the A2A gateway would listen on {addr}, which is not loopback, but no [[remote]] has a token_file: anyone who reaches it could send as anyone; configure a token (docs/A2A.md)")]
    NotLoopback { addr: SocketAddr },
    #[error("the token of [[remote]] '{name}' ({path}): {why}")]
    Token {
        name: String,
        path: PathBuf,
        why: String,
    },
    #[error("serving A2A on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("starting a thread: {0}")]
    Thread(#[source] std::io::Error),
}
