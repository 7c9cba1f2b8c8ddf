//! `typing --docs-per-socket K` (Hocuspocus only): one socket carries K documents, as one
//! Hocuspocus provider's socket carries every document of a page.
//!
//! Rooms are grouped K by K (group g: rooms gK .. gK+K-1). For each group g and client index
//! c, one socket carries the group's K documents, each acting as client c of its room with
//! everything a client of its own socket has (a yrs document with its own client id, a timer,
//! its acks): the logical clients, their ids, phases and accounting are those of the run
//! with one socket per client; only the sockets are fewer (rooms × clients / K).
//!
//! With n URLs, socket (g, c) connects to URL g mod n (`--by-document`) or (g + c) mod n
//! (spread). Before those sockets open, each room is opened once on the node chosen to own
//! it (a room is owned by the node that first loads it): node g mod n with `--by-document`
//! (a group's sockets are on its owner: nothing is relayed), node r mod n spread (a socket's
//! documents are owned by different nodes). These pinning sockets close once every socket of
//! the run is synced (the rooms stay loaded on their owners, whose clients they now have), so
//! they are no readers of the run.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::stream::{BoxStream, SelectAll};
use futures_util::{SinkExt, StreamExt};
use quire_protocol::hocuspocus;
use tokio::task::JoinHandle;

use crate::typist::{frame_data, Typist};
use crate::wire::{self, Flavor};
use crate::{ClientPlan, SendTimes, Shared, TypingArgs};

/// Whether `--docs-per-socket` suits the other arguments.
pub(crate) fn check(args: &TypingArgs) -> anyhow::Result<()> {
    let k = args.docs_per_socket;
    anyhow::ensure!(k >= 1, "--docs-per-socket must be at least 1");
    if k > 1 {
        anyhow::ensure!(
            args.common.flavor == Flavor::Hocuspocus,
            "--docs-per-socket {k} needs --flavor hocuspocus (only Hocuspocus carries several \
             documents on one socket)"
        );
        anyhow::ensure!(
            args.rooms.is_multiple_of(k),
            "--rooms {} is not a multiple of --docs-per-socket {k}",
            args.rooms
        );
    }
    Ok(())
}

/// One socket's share of the run: the client index it acts as in each of its documents.
struct Socket {
    group: usize,
    client: usize,
    /// The documents of its group, in room order (room gK + i is `docs[i]`).
    docs: Vec<String>,
    ws: wire::Ws,
}

/// The sockets of a multiplexed run, connected and synced.
pub(crate) struct Opened {
    sockets: Vec<Socket>,
}

/// The document of `room`, named as the one-socket-per-client run names it.
fn doc_name(args: &TypingArgs, room: usize) -> String {
    format!("{}-{room}", args.common.prefix)
}

/// Pins every room on its owner (several URLs), then opens and syncs every socket.
pub(crate) async fn connect(args: &TypingArgs) -> anyhow::Result<Opened> {
    let c = &args.common;
    let k = args.docs_per_socket;
    let urls: Vec<&str> = c.url.split(',').collect();
    let n = urls.len();
    let mut pins = Vec::new();
    if n > 1 {
        for room in 0..args.rooms {
            let owner = if args.by_document {
                (room / k) % n
            } else {
                room % n
            };
            let (url, doc) = (urls[owner], doc_name(args, room));
            let ws = wire::connect(url, &doc, c.flavor)
                .await
                .with_context(|| format!("pin {doc} on {url}"))?;
            pins.push((doc, ws));
        }
        // Every room is loaded on its owner before any socket of the run opens it.
        for (doc, ws) in &mut pins {
            wire::wait_synced(ws, c.flavor, doc, &[0, 0])
                .await
                .with_context(|| format!("sync the pin of {doc}"))?;
        }
    }
    let mut sockets = Vec::with_capacity(args.rooms / k * args.clients);
    for group in 0..args.rooms / k {
        let docs: Vec<String> = (group * k..group * k + k)
            .map(|room| doc_name(args, room))
            .collect();
        for client in 0..args.clients {
            let url = if args.by_document {
                urls[group % n]
            } else {
                urls[(group + client) % n]
            };
            let mut ws = wire::connect_hocuspocus(url)
                .await
                .with_context(|| format!("connect {url} (rooms of group {group})"))?;
            for doc in &docs {
                wire::open_doc(&mut ws, doc, c.flavor)
                    .await
                    .with_context(|| format!("open {doc} on {url}"))?;
            }
            sockets.push(Socket {
                group,
                client,
                docs: docs.clone(),
                ws,
            });
        }
    }
    // As with a socket per client: every document synced before the clock starts.
    for s in &mut sockets {
        wire::wait_synced_all(&mut s.ws, &s.docs, &[0, 0])
            .await
            .with_context(|| format!("sync group {} client {}", s.group, s.client))?;
    }
    for (_, mut ws) in pins {
        let _ = ws.close(None).await;
    }
    Ok(Opened { sockets })
}

impl Opened {
    /// A task per socket (its documents' clients). A failing socket counts an error for each
    /// of its clients, as that many sockets of their own would.
    pub(crate) fn spawn(
        self,
        args: &TypingArgs,
        writers: usize,
        shared: &Arc<Shared>,
        room_maps: &[Arc<SendTimes>],
        stop_at: Instant,
    ) -> Vec<JoinHandle<()>> {
        let k = args.docs_per_socket;
        let mut tasks = Vec::with_capacity(self.sockets.len());
        for s in self.sockets {
            let clients: Vec<(ClientPlan, Arc<SendTimes>)> = s
                .docs
                .into_iter()
                .enumerate()
                .map(|(i, doc)| {
                    let room = s.group * k + i;
                    // The index the client has with a socket of its own.
                    let index = room * args.clients + s.client;
                    let plan = ClientPlan {
                        client_id: 1_000_000 + index as u64,
                        index,
                        writes: s.client < writers,
                        rate: args.rate,
                        ack: args.ack,
                        flavor: args.common.flavor,
                        doc,
                        stop_at,
                    };
                    (plan, room_maps[room].clone())
                })
                .collect();
            let (shared, ws, group, client) = (shared.clone(), s.ws, s.group, s.client);
            tasks.push(tokio::spawn(async move {
                let docs = clients.len() as u64;
                if let Err(e) = run_socket(ws, clients, shared.clone(), stop_at).await {
                    shared.errors.fetch_add(docs, Ordering::Relaxed);
                    eprintln!("socket of group {group}, client {client}: {e}");
                }
            }));
        }
        tasks
    }
}

/// `run_client` for the documents of one socket: their timers and the socket's frames, each
/// frame handed to the client of the document it names.
async fn run_socket(
    ws: wire::Ws,
    clients: Vec<(ClientPlan, Arc<SendTimes>)>,
    shared: Arc<Shared>,
    stop_at: Instant,
) -> anyhow::Result<()> {
    let (mut sink, mut stream) = ws.split();
    let mut typists: Vec<Typist> = clients
        .into_iter()
        .map(|(plan, times)| Typist::new(plan, times, shared.clone()))
        .collect();
    // Every client of a socket has the same index, so all of them write or none.
    let writes = typists.iter().any(|t| t.plan.writes);
    // The writers' timers as one stream of the index of the typist due.
    let mut ticks: SelectAll<BoxStream<'static, usize>> = futures_util::stream::select_all(
        typists
            .iter()
            .enumerate()
            .filter(|(_, t)| t.plan.writes)
            .map(|(i, t)| {
                futures_util::stream::unfold(t.timer(), move |mut tick| async move {
                    tick.tick().await;
                    Some((i, tick))
                })
                .boxed()
            }),
    );
    let send_until = stop_at - Duration::from_secs(2);
    let stop = tokio::time::sleep_until(stop_at.into());
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            Some(i) = ticks.next(), if writes => {
                let now = Instant::now();
                if now >= stop_at { break; }
                if now >= send_until { continue; }
                if let Some(typist) = typists.get_mut(i) {
                    typist.send_update(&mut sink, now).await?;
                }
            }
            frame = stream.next() => {
                let Some(data) = frame_data(frame)? else { continue };
                let now = Instant::now();
                let Some((address, msgs)) = wire::parse_hocuspocus(&data) else { continue };
                let name = hocuspocus::doc_name(&address);
                let Some(typist) = typists.iter_mut().find(|t| t.plan.doc == name) else {
                    continue;
                };
                for msg in msgs {
                    typist.receive(msg, &mut sink, now).await?;
                }
            }
        }
    }
    let _ = sink.close().await;
    Ok(())
}
