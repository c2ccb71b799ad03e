//! `doorbell export --a2a`: the ledger's requests as A2A Tasks, each with its messages and
//! artifacts, one JSON line per task in id order, as A2A 1.0 `ProtoJSON` or as 0.3 JSON.

use chrono::{DateTime, Utc};
use doorbell_a2a::proto::{self, Shape};

use crate::args::ExportArgs;
use crate::exit::OK;
use crate::session::{view, Session};

pub fn run(session: &Session, args: &ExportArgs) -> anyhow::Result<i32> {
    let bridge = session.bridge()?;
    let since = match &args.since {
        Some(text) => crate::report::time_back("--since", text, Utc::now())?,
        None => DateTime::<Utc>::UNIX_EPOCH,
    };
    let mut view = view(&bridge)?;
    let mut requests = view.report_requests(since)?;
    requests.sort_by(|a, b| a.id.cmp(&b.id));
    for request in &requests {
        let conversation = view.conversation(request)?;
        let task = proto::task_json(request, &conversation, Shape::FULL);
        let task = if args.version == "0.3" {
            proto::v03_task(&task)
        } else {
            task
        };
        out!("{task}")?;
    }
    Ok(OK)
}
