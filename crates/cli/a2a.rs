//! `doorbell a2a serve`: the A2A gateway on its own, beside a daemon or without one (then it
//! judges what arrives, as a waiting command would).

use std::net::SocketAddr;

use tokio::signal::unix::{signal, SignalKind};

use crate::exit::OK;
use crate::session::Session;

/// Where the gateway listens when neither `--listen` nor the config says.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7717";

pub fn serve(session: &Session, listen: Option<SocketAddr>) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let listen = listen
        .or(session.config.a2a_listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("a valid address"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (listener, gateway) = doorbell_a2a::bind(bridge, listen).await?;
        eprintln!(
            "doorbell: serving A2A on http://{}/a2a/<station>",
            gateway.addr()
        );
        doorbell_a2a::serve(listener, gateway, shutdown()?).await?;
        anyhow::Ok(())
    })?;
    Ok(OK)
}

/// Completes at SIGTERM or SIGINT.
pub fn shutdown() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}
