//! One bfkv-raft node as a process, serving the TCP protocol on a loopback address.
//!
//! ```text
//! bfkv-raft-node --id <u64> --dir <node directory> --listen <127.0.0.1:port>
//! ```
//!
//! It prints `listening <id> <address>` on stdout once it serves (port 0 picks a free
//! port), and runs until its stdin closes, then shuts down cleanly. A parent that dies
//! closes the pipe, so no node outlives the test or script that started it. Initialize a
//! cluster with [`Client::initialize`](bfkv_raft::tcp::Client::initialize).

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use bfkv_raft::node::{self, Node};
use bfkv_raft::tcp::{Server, TcpNetwork};
use bfkv_raft::NodeId;

/// The command line.
struct Args {
    id: NodeId,
    dir: PathBuf,
    listen: String,
}

const USAGE: &str = "usage: bfkv-raft-node --id <u64> --dir <path> --listen <127.0.0.1:port>";

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut id, mut dir, mut listen) = (None, None, None);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--id" => id = Some(value.parse().map_err(|_| format!("bad --id {value:?}"))?),
            "--dir" => dir = Some(PathBuf::from(value)),
            "--listen" => listen = Some(value),
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(Args {
        id: id.ok_or("--id is required")?,
        dir: dir.ok_or("--dir is required")?,
        listen: listen.ok_or("--listen is required")?,
    })
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bfkv-raft-node: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let listener = Server::bind(&args.listen).await?;
    let network = TcpNetwork::new(args.id);
    let node = Node::start(args.id, &args.dir, node::config(), network).await?;
    let server = Server::start(listener, node.clone())?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "listening {} {}", args.id, server.addr())?;
        stdout.flush()?;
    }
    // Blocks a pool thread until stdin reaches its end (or fails).
    tokio::task::spawn_blocking(|| {
        let stdin = std::io::stdin().lock();
        for line in stdin.lines() {
            if line.is_err() {
                break;
            }
        }
    })
    .await?;
    server.stop();
    node.shutdown().await?;
    Ok(())
}
