//! Three node processes (`bfkv-raft-node`) over TCP on loopback; clients write under load
//! while the leader process is killed with SIGKILL and restarted from its directory.
//! Every acknowledged write must then be on all three nodes.
//!
//! SIGKILL gives the process no chance to flush or close anything: what survives is what
//! the log store made durable before acknowledging, which is the point.
#![cfg(unix)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bfkv_raft::tcp::Client;
use bfkv_raft::{NodeId, Request};
use tokio::time::{sleep, timeout};

/// The longest any single condition is waited for.
const WAIT: Duration = Duration::from_secs(20);
/// How often a condition is looked at again.
const POLL: Duration = Duration::from_millis(20);

/// The node processes; dropping it kills whatever is left (a failing test leaves none).
#[derive(Default)]
struct Processes(BTreeMap<NodeId, Child>);

impl Processes {
    /// Starts node `id` on `dir`, listening on `listen`; returns the address it serves.
    fn start(&mut self, id: NodeId, dir: &Path, listen: &str) -> String {
        let mut child = Command::new(env!("CARGO_BIN_EXE_bfkv-raft-node"))
            .args(["--id", &id.to_string(), "--listen", listen, "--dir"])
            .arg(dir)
            // Held open by this process: the node exits when it closes.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn bfkv-raft-node");
        let stdout = child.stdout.take().expect("child stdout");
        self.0.insert(id, child);
        // Its first line names the address; read on a thread so the wait is bounded.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(WAIT).expect("node prints its address");
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("listening"), "node {id} said {line:?}");
        assert_eq!(words.next(), Some(id.to_string().as_str()));
        words.next().expect("address").to_string()
    }

    /// SIGKILLs node `id` and reaps it.
    fn kill(&mut self, id: NodeId) {
        let mut child = self.0.remove(&id).expect("node process");
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for child in self.0.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until every node of `ids` names the same leader among them, which says it leads.
async fn wait_leader(client: &Client, ids: &[NodeId]) -> NodeId {
    let agreed = timeout(WAIT, async {
        loop {
            let mut views = Vec::new();
            for &id in ids {
                if let Ok(status) = client.status(id).await {
                    views.push((id, status.leader, status.is_leader));
                }
            }
            if let Some(&(_, Some(leader), _)) = views.first() {
                let agree = views.len() == ids.len()
                    && ids.contains(&leader)
                    && views
                        .iter()
                        .all(|&(id, l, is)| l == Some(leader) && is == (id == leader));
                if agree {
                    return leader;
                }
            }
            sleep(POLL).await;
        }
    });
    agreed
        .await
        .unwrap_or_else(|_| panic!("nodes {ids:?} agreed on no leader within {WAIT:?}"))
}

/// Waits until `done()` holds.
async fn wait_until(what: &str, done: impl Fn() -> bool) {
    let waited = timeout(WAIT, async {
        while !done() {
            sleep(POLL).await;
        }
    });
    waited
        .await
        .unwrap_or_else(|_| panic!("not within {WAIT:?}: {what}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_process_killed_and_restarted_keeps_every_acknowledged_write() {
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let node_dir = |id: NodeId| dir.path().join(format!("node-{id}"));
    let ids = [1, 2, 3];
    let mut processes = Processes::default();
    let mut addrs = BTreeMap::new();
    for id in ids {
        addrs.insert(id, processes.start(id, &node_dir(id), "127.0.0.1:0"));
    }
    let client = Arc::new(Client::new(addrs.clone()));
    client.initialize(1).await.expect("initialize");
    wait_leader(&client, &ids).await;

    // Writers: unique keys, remembered once acknowledged. A write whose answer is lost in
    // the kill is not remembered (it may or may not be applied).
    let acked = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
            tokio::spawn(async move {
                for n in 0..20_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let (key, value) = (format!("w{w}-{n}").into_bytes(), vec![b'v'; 64]);
                    let request = Request::Put {
                        key: key.clone(),
                        value: value.clone(),
                    };
                    if client.write(request).await.is_ok() {
                        acked.lock().unwrap().insert(key, value);
                    }
                }
            })
        })
        .collect();
    let count = || acked.lock().unwrap().len();
    wait_until("200 writes acknowledged", || count() >= 200).await;

    let killed = wait_leader(&client, &ids).await;
    processes.kill(killed);
    let survivors: Vec<NodeId> = ids.iter().copied().filter(|&id| id != killed).collect();
    let new_leader = wait_leader(&client, &survivors).await;
    assert_ne!(new_leader, killed);
    let before = count();
    wait_until("200 writes acknowledged by the new leader", || {
        count() >= before + 200
    })
    .await;

    // Same address, same directory: the killed process's lock died with it.
    let addr = processes.start(killed, &node_dir(killed), &addrs[&killed]);
    assert_eq!(addr, addrs[&killed]);
    wait_leader(&client, &ids).await;
    let before = count();
    wait_until("200 writes acknowledged after the restart", || {
        count() >= before + 200
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        timeout(WAIT, writer).await.expect("writer stops").unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    for id in ids {
        // Each node applies the acknowledged writes in its own time, so wait until it holds
        // them all. (A leader's reported applied index is no bound to wait for: under load
        // it was seen behind the writes the leader had already acknowledged.)
        let holds_all = timeout(WAIT, async {
            loop {
                let mut all = true;
                for (key, value) in &acked {
                    let found = client.read_applied(id, key).await.ok().flatten();
                    if found.as_ref() != Some(value) {
                        all = false;
                        break;
                    }
                }
                if all {
                    return;
                }
                sleep(POLL).await;
            }
        });
        if holds_all.await.is_err() {
            for (key, value) in &acked {
                let found = client.read_applied(id, key).await.unwrap();
                assert_eq!(found.as_ref(), Some(value), "node {id} lacks {key:?}");
            }
        }
    }
    eprintln!(
        "{} acknowledged writes on all 3 nodes after SIGKILL of leader {killed}; {:.1} s",
        acked.len(),
        started.elapsed().as_secs_f64(),
    );
}
