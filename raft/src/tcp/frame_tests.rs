//! The wire format and the server's handling of bad input: every malformed frame gets an
//! error (and the connection closes), nothing panics, and the server keeps serving.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;
use crate::node::{self, Node};

fn put() -> Message {
    Message::Write(Request::Put {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
    })
}

#[tokio::test]
async fn frames_round_trip() {
    let frame = encode_frame(&put()).unwrap();
    let body = read_frame(&mut frame.as_slice()).await.unwrap().unwrap();
    assert_eq!(body.len() + 4, frame.len());
    match decode::<Message>(&body).unwrap() {
        Message::Write(Request::Put { key, value }) => {
            assert_eq!((key, value), (b"k".to_vec(), b"v".to_vec()));
        }
        other => panic!("decoded {other:?}"),
    }
}

#[tokio::test]
async fn bad_frames_are_errors() {
    // A claimed length over the limit is refused before anything is read or allocated.
    let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
    let read = read_frame(&mut huge.as_slice()).await;
    assert!(matches!(read, Err(FrameError::TooLarge(len)) if len == MAX_FRAME + 1));
    // Closed between frames: the end of the stream; inside one: truncated.
    assert!(matches!(read_frame(&mut [].as_slice()).await, Ok(None)));
    assert!(matches!(
        read_frame(&mut [1, 0].as_slice()).await,
        Err(FrameError::Truncated)
    ));
    let short = [8, 0, 0, 0, 1, 2, 3];
    assert!(matches!(
        read_frame(&mut short.as_slice()).await,
        Err(FrameError::Truncated)
    ));
    // A body that is not a message, or has bytes left over.
    assert!(matches!(
        decode::<Message>(&[200, 0, 0, 0]),
        Err(FrameError::Codec(_))
    ));
    let mut body = encode_frame(&put()).unwrap().split_off(4);
    body.push(0);
    assert!(matches!(
        decode::<Message>(&body),
        Err(FrameError::Codec(_))
    ));
    // A vector claiming 2^60 bytes: refused by the codec's limit, not allocated.
    let mut bomb = vec![3, 0, 0, 0]; // Message::Write
    bomb.extend_from_slice(&[0, 0, 0, 0]); // Request::Put
    bomb.extend_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        decode::<Message>(&bomb),
        Err(FrameError::Codec(_))
    ));
}

#[tokio::test]
async fn hellos_are_checked() {
    let mut hello = Vec::new();
    write_hello(&mut hello, 7).await.unwrap();
    assert_eq!(read_hello(&mut hello.as_slice()).await.unwrap(), 7);
    let mut wrong_magic = hello.clone();
    wrong_magic[0] = b'X';
    assert!(matches!(
        read_hello(&mut wrong_magic.as_slice()).await,
        Err(FrameError::BadHello(_))
    ));
    let mut wrong_version = hello.clone();
    wrong_version[8] = 9;
    assert!(matches!(
        read_hello(&mut wrong_version.as_slice()).await,
        Err(FrameError::BadHello(_))
    ));
    assert!(matches!(
        read_hello(&mut &hello[..5]).await,
        Err(FrameError::Truncated)
    ));
}

#[tokio::test]
async fn only_loopback_addresses() {
    assert!(Server::bind("0.0.0.0:0").await.is_err());
    assert!(Server::bind("example.com:80").await.is_err());
    let client = Client::new([(1, "192.0.2.1:9")]);
    let status = client.status(1).await;
    assert!(
        matches!(status, Err(ClientError::Unreachable { node: 1, .. })),
        "{status:?}"
    );
}

/// A connection to `addr` that has exchanged hellos with node `id`.
async fn connect(addr: std::net::SocketAddr, id: NodeId) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    write_hello(&mut stream, id).await.unwrap();
    assert_eq!(read_hello(&mut stream).await.unwrap(), id);
    stream
}

/// Reads what the server sends until it closes: one `Malformed` answer, then nothing.
async fn expect_malformed_then_close(stream: &mut TcpStream) -> String {
    let body = read_frame(stream).await.unwrap().expect("an answer");
    let Answer::Malformed(why) = decode::<Answer>(&body).unwrap() else {
        panic!("expected a malformed answer");
    };
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest));
    closed.await.expect("server closes").unwrap();
    assert!(rest.is_empty());
    why
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_survives_malformed_frames() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(1, dir.path(), node::config(), TcpNetwork::new(1))
        .await
        .unwrap();
    let server = Server::start(Server::bind("127.0.0.1:0").await.unwrap(), node.clone()).unwrap();
    let addr = server.addr();

    // A body that is no message.
    let mut stream = connect(addr, 1).await;
    stream
        .write_all(&[3, 0, 0, 0, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    let why = expect_malformed_then_close(&mut stream).await;
    assert!(why.contains("malformed"), "{why}");

    // A length over the limit.
    let mut stream = connect(addr, 1).await;
    stream.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
    let why = expect_malformed_then_close(&mut stream).await;
    assert!(why.contains("exceeds the limit"), "{why}");

    // Not this protocol at all: closed without an answer.
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\n\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest));
    closed.await.expect("server closes").unwrap();
    assert!(rest.is_empty());

    // Asking for another node: the server names itself and closes.
    let client = Client::new([(2, addr.to_string())]);
    let status = client.status(2).await;
    assert!(
        matches!(status, Err(ClientError::Unreachable { node: 2, .. })),
        "{status:?}"
    );

    // The server still serves well-formed requests.
    let client = Client::new([(1, addr.to_string())]);
    client.initialize(1).await.unwrap();
    let put = Request::Put {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
    };
    assert_eq!(
        client.write(put).await.unwrap(),
        Response::Put { previous: None }
    );
    assert_eq!(client.get(b"k").await.unwrap(), Some(b"v".to_vec()));
    assert!(client.status(1).await.unwrap().is_leader);
    assert!(matches!(
        client.initialize(1).await,
        Err(ClientError::Rejected { .. })
    ));

    server.stop();
    node.shutdown().await.unwrap();
}
