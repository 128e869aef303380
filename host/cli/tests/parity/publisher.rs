//! A KV event publisher shaped like vLLM 0.33's: a PUB socket sending
//! `[topic, seq (u64 BE), msgpack batch]` and a ROUTER replay socket
//! answering `[b"", start]` with every message from `start` on
//! (`[b"", topic, seq, payload]`, then `[b"", b"", 0xff…ff, b""]`), as
//! vLLM's `ZmqEventPublisher` does. Both indexers subscribe to the same
//! publisher, so they receive the same stream.

use std::time::Duration;

use bytes::Bytes;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use zeromq::{Socket as _, SocketRecv as _, SocketSend as _};

use super::stream::{Batch, Event};

const TOPIC: &[u8] = b"kv-events";
const END_SEQ: [u8; 8] = [0xff; 8];

enum Command {
    /// The next seq: sent live, or (a forced gap) only kept for replay.
    Publish { payload: Bytes, live: bool },
    /// Send the last message again: a subscriber that has it skips it as
    /// a duplicate; one that joined late (nothing seen yet) takes it as a
    /// gap from 0 and asks for the replay of everything.
    Nudge,
}

/// A publisher on 127.0.0.1, its sockets owned by a task on `runtime`;
/// dropping it closes them.
pub struct Publisher {
    pub endpoint: String,
    pub replay_endpoint: String,
    commands: mpsc::UnboundedSender<Command>,
}

fn tcp(endpoint: zeromq::Endpoint) -> String {
    match endpoint {
        zeromq::Endpoint::Tcp(host, port) => format!("tcp://{host}:{port}"),
        other => panic!("not a TCP endpoint: {other}"),
    }
}

impl Publisher {
    /// Bind on fresh ports.
    pub fn start(runtime: &Runtime) -> Publisher {
        Publisher::start_at(runtime, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
    }

    /// Bind on these endpoints: a restarted engine's publisher, counting
    /// from seq 0 again on the same ports.
    pub fn start_at(runtime: &Runtime, endpoint: &str, replay_endpoint: &str) -> Publisher {
        let (publisher, router, endpoint, replay_endpoint) = runtime.block_on(async {
            let mut publisher = zeromq::PubSocket::new();
            let mut router = zeromq::RouterSocket::new();
            // The ports of a publisher just dropped may take a moment to be
            // released by its task.
            let mut attempts = 0;
            let bound = loop {
                match publisher.bind(endpoint).await {
                    Ok(bound) => break bound,
                    Err(_) if attempts < 200 => {
                        attempts += 1;
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                    Err(e) => panic!("bind {endpoint}: {e}"),
                }
            };
            let mut attempts = 0;
            let replay_bound = loop {
                match router.bind(replay_endpoint).await {
                    Ok(bound) => break bound,
                    Err(_) if attempts < 200 => {
                        attempts += 1;
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    }
                    Err(e) => panic!("bind {replay_endpoint}: {e}"),
                }
            };
            (publisher, router, tcp(bound), tcp(replay_bound))
        });
        let (commands, receiver) = mpsc::unbounded_channel();
        runtime.spawn(serve(publisher, router, receiver));
        Publisher {
            endpoint,
            replay_endpoint,
            commands,
        }
    }

    /// Publish `batch` as the next seq; `live: false` keeps it for replay
    /// only (a gap the subscribers must detect and fill).
    pub fn publish(&self, batch: &Batch, live: bool) {
        self.commands
            .send(Command::Publish {
                payload: encode(batch).into(),
                live,
            })
            .expect("the publisher's task runs");
    }

    pub fn nudge(&self) {
        self.commands
            .send(Command::Nudge)
            .expect("the publisher's task runs");
    }
}

fn message(frames: Vec<Bytes>) -> zeromq::ZmqMessage {
    frames.try_into().expect("at least one frame")
}

async fn serve(
    mut publisher: zeromq::PubSocket,
    mut router: zeromq::RouterSocket,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut history: Vec<Bytes> = Vec::new();
    let live_message = |seq: usize, payload: &Bytes| {
        message(vec![
            Bytes::from_static(TOPIC),
            Bytes::copy_from_slice(&(seq as u64).to_be_bytes()),
            payload.clone(),
        ])
    };
    loop {
        tokio::select! {
            command = commands.recv() => match command {
                Some(Command::Publish { payload, live }) => {
                    history.push(payload);
                    if live {
                        let seq = history.len() - 1;
                        let _ = publisher.send(live_message(seq, &history[seq])).await;
                    }
                }
                Some(Command::Nudge) => {
                    if let Some(last) = history.len().checked_sub(1) {
                        let _ = publisher.send(live_message(last, &history[last])).await;
                    }
                }
                None => return,
            },
            request = router.recv() => {
                let Ok(request) = request else { continue };
                let frames = request.into_vec();
                let (Some(identity), Some(start)) = (frames.first(), frames.last()) else {
                    continue;
                };
                let Ok(start) = <[u8; 8]>::try_from(&start[..]) else { continue };
                let start = u64::from_be_bytes(start) as usize;
                for (seq, payload) in history.iter().enumerate().skip(start) {
                    let reply = message(vec![
                        identity.clone(),
                        Bytes::new(),
                        Bytes::from_static(TOPIC),
                        Bytes::copy_from_slice(&(seq as u64).to_be_bytes()),
                        payload.clone(),
                    ]);
                    if router.send(reply).await.is_err() {
                        break;
                    }
                }
                let end = message(vec![
                    identity.clone(),
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::copy_from_slice(&END_SEQ),
                    Bytes::new(),
                ]);
                let _ = router.send(end).await;
            }
        }
    }
}

/// vLLM 0.33's batch: `[ts, [tagged map events], data_parallel_rank|nil]`.
pub fn encode(batch: &Batch) -> Vec<u8> {
    use rmpv::Value;
    let hashes = |hashes: &[u64]| Value::Array(hashes.iter().map(|&h| Value::from(h)).collect());
    let events = batch
        .events
        .iter()
        .map(|event| match event {
            Event::Stored {
                hashes: block_hashes,
                parent,
                tokens,
                block_size,
                lora_name,
            } => Value::Map(vec![
                ("type".into(), "BlockStored".into()),
                ("block_hashes".into(), hashes(block_hashes)),
                (
                    "parent_block_hash".into(),
                    parent.map_or(Value::Nil, Value::from),
                ),
                (
                    "token_ids".into(),
                    Value::Array(tokens.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size".into(), Value::from(*block_size)),
                ("lora_id".into(), Value::Nil),
                ("medium".into(), "GPU".into()),
                (
                    "lora_name".into(),
                    lora_name.as_deref().map_or(Value::Nil, Value::from),
                ),
            ]),
            Event::Removed {
                hashes: block_hashes,
            } => Value::Map(vec![
                ("type".into(), "BlockRemoved".into()),
                ("block_hashes".into(), hashes(block_hashes)),
                ("medium".into(), "GPU".into()),
            ]),
            Event::Cleared => Value::Map(vec![("type".into(), "AllBlocksCleared".into())]),
        })
        .collect();
    let batch = Value::Array(vec![
        Value::F64(0.0),
        Value::Array(events),
        batch.rank.map_or(Value::Nil, Value::from),
    ]);
    let mut payload = Vec::new();
    rmpv::encode::write_value(&mut payload, &batch).expect("writing to a Vec cannot fail");
    payload
}
