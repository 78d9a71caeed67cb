//! When a request reached its host, before its server span began.
//!
//! A server span starts when the server's code takes the request up. An
//! event loop busy with another request, or a pool whose workers are all
//! busy, leaves a request waiting in its socket or in a queue first, and
//! the span shows none of that wait; the client sees it, as a gap that
//! reads as network time. The kernel saw the request arrive.
//!
//! For a span that names its connection (the client's port, `client.port`
//! or `net.peer.port`, with the server's, `network.local.port`,
//! `server.port` or `net.host.port`), the arrival is the earliest of these, on that
//! connection since the previous exchange on it:
//! - the client's send, when the client is on a traced host: the
//!   socket-call capture names the client's socket by its ports, the
//!   mirror of the server's (local port = the span's client port). On
//!   loopback the bytes are in the server's socket when that send returns;
//!   from another host they arrive a network delay later, which the queue
//!   then includes;
//! - the server's first receive of it (an acceptor or an event loop that
//!   reads the request before a pool thread takes it up).
//!
//! The server's port of a span is often not the one it answered on: HTTP
//! instrumentations read it from the `Host` header, which names no port
//! for a client that sent none, and a proxy's port behind one. When the
//! trace shows no socket of that port talking to the span's client port,
//! the connection is the one socket with the client's port at its remote
//! end that the server used during the span (it sent the answer there);
//! with none or several such sockets the span gets no arrival.
//!
//! The previous exchange ends at the server's last send on the connection
//! before the span (its previous answer), or at the end of the previous
//! span on the connection, whichever is later: a send or receive before
//! that is an earlier request's. A span that names no connection, or a
//! trace without the socket-call capture, gets no arrival: a receive of an
//! unnamed socket may be any request's.
//!
//! The time from the arrival to the span's start is the request's queue:
//! [`crate::analyze_requests`] gives it a critical path of its own
//! ([`crate::RequestPath::queue`]), attributed like the span's, so that
//! an event loop running another request meanwhile reads as "queued behind"
//! that request.

use rustc_hash::FxHashMap;

use crate::placement::PlacementSpan;
use crate::state::KernelModel;

/// When a request reached its host, and what says so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Kernel clock (CLOCK_MONOTONIC ns), before the span's start.
    pub ts: u64,
    pub by: ArrivalBy,
}

/// What an [`Arrival`] was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArrivalBy {
    /// The client's send on the connection (the client is on a traced host).
    ClientSend,
    /// The server's first receive on the connection.
    ServerReceive,
}

impl ArrivalBy {
    /// `client_send` or `server_receive`.
    pub fn name(self) -> &'static str {
        match self {
            ArrivalBy::ClientSend => "client_send",
            ArrivalBy::ServerReceive => "server_receive",
        }
    }
}

/// A socket call of the capture: when, and whether it sent or received
/// data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SocketIo {
    ts: u64,
    sent: bool,
}

/// A socket's (local port, remote port), or a span's (client port, server
/// port): the same connection seen from its other end.
type Ports = (u16, u16);

/// Every socket call of the trace that names its ports, by the socket's
/// ports, each list in time order.
fn socket_io(model: &KernelModel) -> FxHashMap<Ports, Vec<SocketIo>> {
    let mut by_ports: FxHashMap<Ports, Vec<SocketIo>> = FxHashMap::default();
    for th in model.threads() {
        for call in th.syscalls() {
            let Some(socket) = call.socket() else {
                continue;
            };
            if socket.local_port == 0 || socket.remote_port == 0 {
                continue;
            }
            let sent = call.socket_sent();
            // A receive that returned nothing (the peer closed) brought no
            // request.
            if !sent && call.ret <= 0 {
                continue;
            }
            by_ports
                .entry((socket.local_port, socket.remote_port))
                .or_default()
                .push(SocketIo { ts: call.end, sent });
        }
    }
    for calls in by_ports.values_mut() {
        calls.sort_unstable();
    }
    by_ports
}

/// The arrival of each entry span's request that names its connection
/// (module doc); `None` for the other spans, and where the trace shows
/// nothing of the request before its span started.
pub fn arrivals(model: &KernelModel, spans: &[PlacementSpan]) -> Vec<Option<Arrival>> {
    let mut out = vec![None; spans.len()];
    if !spans
        .iter()
        .any(|s| s.entry && s.times.is_some() && s.client_port.is_some())
    {
        return out;
    }
    let io = socket_io(model);
    // The local ports of the sockets whose remote end had each port.
    let mut locals_of: FxHashMap<u16, Vec<u16>> = FxHashMap::default();
    for &(local, remote) in io.keys() {
        locals_of.entry(remote).or_default().push(local);
    }
    // The entry spans of each connection: (start, end, index).
    let mut by_connection: FxHashMap<Ports, Vec<(u64, u64, usize)>> = FxHashMap::default();
    for (i, span) in spans.iter().enumerate() {
        let (true, Some((start, end)), Some(client)) = (span.entry, span.times, span.client_port)
        else {
            continue;
        };
        let server = span
            .port
            .filter(|&server| io.contains_key(&(server, client)))
            .or_else(|| answered_on(&io, locals_of.get(&client), client, (start, end)));
        if let Some(server) = server {
            by_connection
                .entry((client, server))
                .or_default()
                .push((start, end, i));
        }
    }
    let none: Vec<SocketIo> = Vec::new();
    for ((client, server), mut exchanges) in by_connection {
        exchanges.sort_unstable();
        let server_side = io.get(&(server, client)).unwrap_or(&none);
        let client_side = io.get(&(client, server)).unwrap_or(&none);
        let mut previous_end = 0;
        for (start, end, i) in exchanges {
            let before = |calls: &[SocketIo]| calls.partition_point(|c| c.ts < start);
            let answered = server_side[..before(server_side)]
                .iter()
                .rev()
                .find(|c| c.sent)
                .map_or(0, |c| c.ts);
            let since = answered.max(previous_end);
            previous_end = previous_end.max(end);
            let first = |calls: &[SocketIo], sent: bool| {
                let from = calls.partition_point(|c| c.ts <= since);
                calls[from..before(calls)]
                    .iter()
                    .find(|c| c.sent == sent)
                    .map(|c| c.ts)
            };
            let client_send = first(client_side, true).map(|ts| Arrival {
                ts,
                by: ArrivalBy::ClientSend,
            });
            let server_receive = first(server_side, false).map(|ts| Arrival {
                ts,
                by: ArrivalBy::ServerReceive,
            });
            out[i] = [client_send, server_receive]
                .into_iter()
                .flatten()
                .filter(|a| a.ts < start)
                .min_by_key(|a| a.ts);
        }
    }
    out
}

/// The server's port of a span whose own names no socket of the trace: the
/// one local port, of those whose remote end was the span's client port,
/// that the server used between the span's `start` and `end` (module doc).
fn answered_on(
    io: &FxHashMap<Ports, Vec<SocketIo>>,
    locals: Option<&Vec<u16>>,
    client: u16,
    (start, end): (u64, u64),
) -> Option<u16> {
    let mut used = locals?.iter().copied().filter(|&local| {
        let calls = &io[&(local, client)];
        let from = calls.partition_point(|c| c.ts < start);
        calls.get(from).is_some_and(|c| c.ts <= end)
    });
    let server = used.next()?;
    used.next().is_none().then_some(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::StateBuilder;
    use deepspan_model::Socket;

    const SERVER: u16 = 8080;

    fn span(client: u16, start: u64, end: u64) -> PlacementSpan {
        PlacementSpan {
            entry: true,
            times: Some((start, end)),
            port: Some(SERVER),
            client_port: Some(client),
            ..PlacementSpan::default()
        }
    }

    /// A model of socket calls `(ts, tid, sent, local port, remote port)`.
    fn model(calls: &[(u64, i32, bool, u16, u16)]) -> KernelModel {
        let mut b = StateBuilder::new();
        for &(ts, tid, sent, local_port, remote_port) in calls {
            let socket = Socket {
                cookie: u64::from(local_port) << 16 | u64::from(remote_port),
                local_port,
                remote_port,
            };
            b.socket_call(ts, tid, sent, 100, Some(socket));
        }
        b.finish()
    }

    #[test]
    fn the_clients_send_on_the_mirrored_socket_is_the_arrival() {
        // Client 7 (port 40000) sends at 100; the server reads it at 900 and
        // its span starts at 1000. Then the answer, and a second request on
        // the same connection.
        let m = model(&[
            (100, 7, true, 40000, SERVER),
            (900, 3, false, SERVER, 40000),
            (1500, 3, true, SERVER, 40000),
            (1600, 7, true, 40000, SERVER),
            (1700, 3, false, SERVER, 40000),
        ]);
        let spans = [span(40000, 1000, 1400), span(40000, 1750, 1800)];
        let got = arrivals(&m, &spans);
        assert_eq!(
            got,
            vec![
                Some(Arrival {
                    ts: 100,
                    by: ArrivalBy::ClientSend
                }),
                Some(Arrival {
                    ts: 1600,
                    by: ArrivalBy::ClientSend
                }),
            ]
        );
    }

    #[test]
    fn without_the_client_the_servers_first_receive_is_the_arrival() {
        // An acceptor (thread 2) reads the request at 300; worker 3's span
        // starts at 1000. Another connection's calls are not this one's.
        let m = model(&[
            (200, 2, false, SERVER, 40001),
            (300, 2, false, SERVER, 40000),
            (400, 2, false, SERVER, 40000),
        ]);
        let got = arrivals(&m, &[span(40000, 1000, 1400)]);
        assert_eq!(
            got,
            vec![Some(Arrival {
                ts: 300,
                by: ArrivalBy::ServerReceive
            })]
        );
    }

    #[test]
    fn nothing_before_the_previous_exchange_or_after_the_start_counts() {
        // The previous span on the connection ended at 1400; the send at
        // 1200 was its request's body. The next request's bytes come after
        // its span's start (a clock error): no arrival.
        let m = model(&[
            (1200, 7, true, 40000, SERVER),
            (2100, 7, true, 40000, SERVER),
        ]);
        let spans = [span(40000, 1000, 1400), span(40000, 2000, 2200)];
        let got = arrivals(&m, &spans);
        assert_eq!(got[1], None);
        // A span that names no connection gets none either.
        let mut unnamed = span(40000, 1300, 1400);
        unnamed.client_port = None;
        assert_eq!(arrivals(&m, &[unnamed]), vec![None]);
    }

    #[test]
    fn a_server_port_the_trace_never_saw_is_the_one_the_span_answered_on() {
        // The span says port 80 (a Host header without a port); the server
        // listened on SERVER, read the request at 300 and answered at 1200,
        // within its span. Another server talked to a client of the same
        // port number earlier, not during the span.
        let m = model(&[
            (50, 5, true, 9000, 40000),
            (300, 3, false, SERVER, 40000),
            (1200, 3, true, SERVER, 40000),
        ]);
        let mut proxied = span(40000, 1000, 1400);
        proxied.port = Some(80);
        let unnamed_server = PlacementSpan {
            port: None,
            ..proxied.clone()
        };
        let expected = Some(Arrival {
            ts: 300,
            by: ArrivalBy::ServerReceive,
        });
        assert_eq!(arrivals(&m, &[proxied.clone()]), vec![expected]);
        assert_eq!(arrivals(&m, &[unnamed_server]), vec![expected]);
        // Two sockets of the client's port used during the span: which one
        // was its connection is not known, so no arrival.
        let ambiguous = model(&[
            (300, 3, false, SERVER, 40000),
            (1100, 5, true, 9000, 40000),
            (1200, 3, true, SERVER, 40000),
        ]);
        assert_eq!(arrivals(&ambiguous, &[proxied]), vec![None]);
    }
}
