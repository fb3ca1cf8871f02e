//! Three bfkv-raft nodes over TCP on loopback, in one process: a failover and a throughput
//! measurement.
//!
//! ```text
//! cargo run --release -p bfkv-raft --example cluster
//! ```
//!
//! It starts three nodes (each a node directory, an openraft `Raft` and a TCP server),
//! initializes them as one cluster, writes keys, kills the leader (its server drops every
//! connection at once and its Raft stops), waits for a new leader, reads every key back,
//! restarts the killed node from its directory, and then measures sequential and
//! concurrent client writes. The log trees use bfkv's `Durability::Sync`, so every append
//! of entries is durable (one `fdatasync`) before it is acknowledged.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bfkv_raft::node::{self, Node};
use bfkv_raft::tcp::{Client, Server, TcpNetwork};
use bfkv_raft::{LogStats, NodeId, Request};

/// Keys written before the failover.
const KEYS: usize = 200;
/// Writes of the sequential measurement.
const SEQUENTIAL: usize = 300;
/// Writes in flight in the concurrent measurement, and writes per writer.
const IN_FLIGHT: usize = 16;
const PER_WRITER: usize = 150;
/// The longest any condition is waited for.
const WAIT: Duration = Duration::from_secs(10);

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// A running node and its server.
struct Running {
    node: Node,
    server: Server,
}

/// Starts node `id` in `dir`, serving on `addr` (port 0: any).
async fn start(id: NodeId, dir: &std::path::Path, addr: &str) -> Result<Running> {
    let listener = Server::bind(addr).await?;
    let dir = dir.join(format!("node-{id}"));
    let node = Node::start(id, dir, node::config(), TcpNetwork::new(id)).await?;
    let server = Server::start(listener, node.clone())?;
    Ok(Running { node, server })
}

/// Waits until every node of `ids` names the same leader, which says it leads.
async fn wait_leader(client: &Client, ids: &[NodeId]) -> Result<NodeId> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        let mut leaders = Vec::new();
        for &id in ids {
            if let Ok(status) = client.status(id).await {
                leaders.push((status.leader, status.is_leader, id));
            }
        }
        if let Some(&(Some(leader), _, _)) = leaders.first() {
            let agreed = leaders.len() == ids.len()
                && ids.contains(&leader)
                && leaders
                    .iter()
                    .all(|&(l, is, id)| l == Some(leader) && is == (id == leader));
            if agreed {
                return Ok(leader);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(format!("nodes {ids:?} agreed on no leader within {WAIT:?}").into())
}

/// Waits until every node of `ids` has applied at least `index`.
async fn wait_applied(client: &Client, ids: &[NodeId], index: Option<u64>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    for &id in ids {
        loop {
            let applied = client.status(id).await.ok().and_then(|s| s.last_applied);
            if applied >= index {
                break;
            }
            if Instant::now() >= deadline {
                return Err(format!("node {id} did not apply up to {index:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(())
}

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:05}").into_bytes()
}

fn put(key: Vec<u8>, value: Vec<u8>) -> Request {
    Request::Put { key, value }
}

/// Log writes (each at least one `fdatasync`) of each node since `before`.
fn log_writes(
    running: &BTreeMap<NodeId, Running>,
    before: &BTreeMap<NodeId, LogStats>,
) -> BTreeMap<NodeId, (u64, u64)> {
    running
        .iter()
        .map(|(&id, r)| {
            let now = r.node.log_stats();
            let then = before.get(&id).copied().unwrap_or_default();
            let syncs = now.appends + now.other_writes - then.appends - then.other_writes;
            (id, (syncs, now.entries - then.entries))
        })
        .collect()
}

fn stats(running: &BTreeMap<NodeId, Running>) -> BTreeMap<NodeId, LogStats> {
    running
        .iter()
        .map(|(&id, r)| (id, r.node.log_stats()))
        .collect()
}

/// `count / of` for counts far below 2^52, where `f64` is exact.
#[allow(clippy::cast_precision_loss)]
fn ratio(count: u64, of: usize) -> f64 {
    count as f64 / of as f64
}

/// Prints each node's log fdatasyncs per client write since `before`.
fn print_syncs(
    running: &BTreeMap<NodeId, Running>,
    before: &BTreeMap<NodeId, LogStats>,
    writes: usize,
    leader: NodeId,
) {
    for (id, (syncs, entries)) in log_writes(running, before) {
        let role = if id == leader { "leader  " } else { "follower" };
        let per_write = ratio(syncs, writes);
        println!(
            "    node {id} ({role}): {syncs} log fdatasyncs, {entries} entries: \
             {per_write:.2} per write"
        );
    }
}

/// Prints a throughput line.
fn print_rate(what: &str, writes: usize, elapsed: Duration) {
    let per_second = ratio(writes as u64, 1) / elapsed.as_secs_f64();
    let ms_each = elapsed.as_secs_f64() * 1000.0 / ratio(writes as u64, 1);
    let seconds = elapsed.as_secs_f64();
    println!(
        "  {what}: {writes} writes in {seconds:.2} s = {per_second:.0} writes/s \
         ({ms_each:.2} ms each)"
    );
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let ids = [1, 2, 3];
    let mut running = BTreeMap::new();
    let mut addrs = BTreeMap::new();
    for id in ids {
        let node = start(id, dir.path(), "127.0.0.1:0").await?;
        addrs.insert(id, node.server.addr().to_string());
        running.insert(id, node);
    }
    for (id, addr) in &addrs {
        println!("node {id} listening on {addr}");
    }
    let client = Arc::new(Client::new(addrs.clone()));
    client.initialize(1).await?;
    let leader = wait_leader(&client, &ids).await?;
    println!("leader: node {leader}");

    for i in 0..KEYS {
        client.write(put(key(i), value(i))).await?;
    }
    println!("wrote {KEYS} keys");
    let killed = running.remove(&leader).ok_or("leader not running")?;
    failover(&client, &ids, killed).await?;

    // Back on its address, from its own directory; it catches up from the leader.
    running.insert(leader, start(leader, dir.path(), &addrs[&leader]).await?);
    let new_leader = wait_leader(&client, &ids).await?;
    wait_applied(&client, &ids, client.status(new_leader).await?.last_applied).await?;
    println!("node {leader} restarted from its directory and caught up");

    measure(&client, &running, new_leader).await?;
    for (_, r) in std::mem::take(&mut running) {
        r.server.stop();
        r.node.shutdown().await?;
    }
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn value(i: usize) -> Vec<u8> {
    format!("value-{i}").into_bytes()
}

/// Kills the leader `killed` (connections cut mid-request, Raft stopped, directory left as
/// it is), waits for a new leader among `ids`, and checks every key on the survivors.
async fn failover(client: &Client, ids: &[NodeId], killed: Running) -> Result<()> {
    let leader = killed.node.id();
    killed.server.stop();
    killed.node.shutdown().await?;
    let killed_at = Instant::now();
    println!("killed node {leader}");
    let survivors: Vec<NodeId> = ids.iter().copied().filter(|&id| id != leader).collect();
    let new_leader = wait_leader(client, &survivors).await?;
    println!(
        "new leader: node {new_leader}, elected {} ms after the kill",
        killed_at.elapsed().as_millis()
    );

    // Every key, read linearizably through the new leader, and from each survivor's own
    // state machine once it has applied everything.
    let mut intact = 0;
    for i in 0..KEYS {
        if client.get(&key(i)).await? == Some(value(i)) {
            intact += 1;
        }
    }
    println!("linearizable reads: {intact}/{KEYS} keys intact");
    let applied = client.status(new_leader).await?.last_applied;
    wait_applied(client, &survivors, applied).await?;
    let mut lost = intact != KEYS;
    for &id in &survivors {
        let mut held = 0;
        for i in 0..KEYS {
            if client.read_applied(id, &key(i)).await? == Some(value(i)) {
                held += 1;
            }
        }
        println!("node {id} holds {held}/{KEYS} keys");
        lost |= held != KEYS;
    }
    if lost {
        return Err("keys lost in the failover".into());
    }
    println!("data intact after the failover");
    Ok(())
}

/// Measures sequential and concurrent writes through `client`.
async fn measure(
    client: &Arc<Client>,
    running: &BTreeMap<NodeId, Running>,
    leader: NodeId,
) -> Result<()> {
    println!("throughput (3 nodes, 100-byte values, log fdatasync on every append):");
    let before = stats(running);
    let t = Instant::now();
    for i in 0..SEQUENTIAL {
        let key = format!("seq-{i}").into_bytes();
        client.write(put(key, vec![b'x'; 100])).await?;
    }
    print_rate("sequential", SEQUENTIAL, t.elapsed());
    print_syncs(running, &before, SEQUENTIAL, leader);

    let before = stats(running);
    let t = Instant::now();
    let tasks: Vec<_> = (0..IN_FLIGHT)
        .map(|w| {
            let client = client.clone();
            tokio::spawn(async move {
                for i in 0..PER_WRITER {
                    let key = format!("conc-{w}-{i}").into_bytes();
                    client.write(put(key, vec![b'y'; 100])).await?;
                }
                Ok::<_, bfkv_raft::client::ClientError>(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let total = IN_FLIGHT * PER_WRITER;
    print_rate(
        &format!("concurrent, {IN_FLIGHT} in flight"),
        total,
        t.elapsed(),
    );
    print_syncs(running, &before, total, leader);
    println!(
        "  (state machines: bfkv Buffered, synced in the background every 5 ms, not per write)"
    );
    Ok(())
}
