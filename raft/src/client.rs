//! What a client of the replicated map sees: [`ClientError`], the [`Forward`] seam through
//! which a node hands a request to another node, and the loop that follows leader hints.
//!
//! Only the leader proposes writes and serves linearizable reads. A node asked by a client
//! tries itself first; a follower answers [`ClientError::NotLeader`] naming the leader it
//! knows, and the request goes there next, until one answers or the deadline passes. Each
//! hop asks its target to act *as leader only* (never to forward again), so a request is
//! proposed at most once per hop and a stale hint costs one round trip, not a loop.
//!
//! Retrying is safe only where nothing was proposed: after `NotLeader`, `Unreachable`
//! (nothing sent) and `NoQuorum` (reads). An answer that may have been lost after the
//! request was proposed ([`ClientError::may_have_taken_effect`]) ends the loop: sending a
//! write again could apply it twice.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use openraft::BasicNode;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::{NodeId, Request, Response};

/// How long to wait before asking again when no leader is known (an election is likely
/// under way; with the test timeouts it takes 150–300 ms).
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// Why a client request failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientError {
    /// The node asked is not the leader and did not propose the request.
    NotLeader {
        /// The leader it knows of, if any.
        leader: Option<NodeId>,
        /// That leader's address.
        node: Option<BasicNode>,
    },
    /// The node could not be reached: the request was not sent.
    Unreachable {
        /// The node.
        node: NodeId,
        /// What failed (connecting, the handshake, or the node is isolated or gone).
        reason: String,
    },
    /// A linearizable read could not confirm the leadership with a quorum; nothing was read.
    NoQuorum {
        /// openraft's explanation.
        reason: String,
    },
    /// No answer came before the deadline: a write may or may not take effect.
    Timeout {
        /// The deadline that passed.
        after: Duration,
    },
    /// The request was sent or proposed and then its answer was lost (a connection reset, a
    /// node that stopped): a write may or may not take effect.
    Unknown {
        /// What was lost.
        reason: String,
    },
    /// The node is shut down; it did nothing.
    Stopped,
    /// Reading the node's state machine failed.
    Storage {
        /// The storage error.
        reason: String,
    },
    /// The node refused the request for good (for instance, initializing a node that is
    /// already part of a cluster).
    Rejected {
        /// Why.
        reason: String,
    },
    /// The peer sent something this protocol does not allow (a malformed or oversized frame,
    /// a wrong handshake, another node than the one asked for): a write may or may not
    /// take effect.
    Protocol {
        /// Which check failed.
        reason: String,
    },
}

impl ClientError {
    /// Whether a write that failed with this error may still have been (or still be)
    /// applied: the client must treat its outcome as unknown and must not resend it blindly.
    ///
    /// ```
    /// use bfkv_raft::client::ClientError;
    /// assert!(!ClientError::NotLeader { leader: None, node: None }.may_have_taken_effect());
    /// assert!(ClientError::Unknown { reason: "reset".into() }.may_have_taken_effect());
    /// ```
    pub fn may_have_taken_effect(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout { .. }
                | ClientError::Unknown { .. }
                | ClientError::Protocol { .. }
        )
    }

    /// Whether asking again (the leader it names, or after a pause) may succeed and cannot
    /// apply a write twice.
    fn is_retryable(&self) -> bool {
        matches!(
            self,
            ClientError::NotLeader { .. }
                | ClientError::Unreachable { .. }
                | ClientError::NoQuorum { .. }
        )
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NotLeader {
                leader: Some(id), ..
            } => write!(f, "not the leader; node {id} is"),
            ClientError::NotLeader { leader: None, .. } => {
                write!(f, "not the leader, and no leader is known")
            }
            ClientError::Unreachable { node, reason } => {
                write!(f, "node {node} is unreachable: {reason}")
            }
            ClientError::NoQuorum { reason } => {
                write!(f, "leadership not confirmed by a quorum: {reason}")
            }
            ClientError::Timeout { after } => {
                write!(f, "no answer within {after:?}; the outcome is unknown")
            }
            ClientError::Unknown { reason } => {
                write!(f, "answer lost ({reason}); the outcome is unknown")
            }
            ClientError::Stopped => write!(f, "the node is shut down"),
            ClientError::Storage { reason } => write!(f, "state machine read failed: {reason}"),
            ClientError::Rejected { reason } => write!(f, "rejected: {reason}"),
            ClientError::Protocol { reason } => write!(f, "protocol violation: {reason}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// How a node reaches another node's client operations: the in-process
/// [`Router`](crate::router::Router) and the [`tcp`](crate::tcp) transport implement it.
///
/// Both methods ask `to` to act as leader only: to propose (or read) itself, or answer
/// [`ClientError::NotLeader`], never to forward the request again.
pub trait Forward: Send + Sync {
    /// Has node `to` (at `node`) propose `request` and returns what applying it gave.
    ///
    /// # Errors
    /// [`ClientError`]: `NotLeader` from a follower, `Unreachable` if nothing was sent,
    /// `Unknown`, `Timeout` or `Protocol` if the answer was lost.
    fn write(
        &self,
        to: NodeId,
        node: &BasicNode,
        request: Request,
    ) -> impl Future<Output = Result<Response, ClientError>> + Send;

    /// Has node `to` (at `node`) read `key` linearizably.
    ///
    /// # Errors
    /// As [`write`](Self::write); `NoQuorum` if the leader could not confirm itself.
    fn get(
        &self,
        to: NodeId,
        node: &BasicNode,
        key: Vec<u8>,
    ) -> impl Future<Output = Result<Option<Vec<u8>>, ClientError>> + Send;
}

/// Runs `attempt` against `first`, then against each leader a failed attempt names (or
/// `fallback()` when none is named), until one succeeds, fails for good, or `timeout` passes.
///
/// When the deadline passes between attempts the last retryable error is returned (nothing
/// was proposed); when it passes during one, [`ClientError::Timeout`].
pub(crate) async fn follow_leader<T, A, Fut, F>(
    first: (NodeId, Option<BasicNode>),
    timeout: Duration,
    mut fallback: F,
    mut attempt: A,
) -> Result<T, ClientError>
where
    A: FnMut(NodeId, Option<BasicNode>) -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
    F: FnMut() -> (NodeId, Option<BasicNode>),
{
    let deadline = Instant::now() + timeout;
    let mut target = first;
    let mut hops = 0u32;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let Ok(result) = tokio::time::timeout(remaining, attempt(target.0, target.1.clone())).await
        else {
            return Err(ClientError::Timeout { after: timeout });
        };
        let error = match result {
            Err(e) if e.is_retryable() => e,
            done => return done,
        };
        hops += 1;
        target = match &error {
            ClientError::NotLeader {
                leader: Some(id),
                node,
            } => (*id, node.clone()),
            _ => fallback(),
        };
        // A hint is followed at once the first time; after that (hints going round while
        // an election settles, or no leader at all) each hop waits a little.
        let named = matches!(
            error,
            ClientError::NotLeader {
                leader: Some(_),
                ..
            }
        );
        if hops > 1 || !named {
            if Instant::now() + RETRY_PAUSE >= deadline {
                return Err(error);
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }
}
