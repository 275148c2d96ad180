//! Who is on the other end of a loopback TCP connection, and how many connections each local
//! user holds.
//!
//! The loopback port is every local user's: one of them holding thousands of idle connections
//! must not lock the others (or the daemon's own user) out of the proxy. TCP has no
//! SO_PEERCRED, but the kernel knows which user owns the client's end of a loopback
//! connection: one sock_diag netlink query (what `ss -e` asks) by the connection's four
//! addresses returns it. Each user other than the daemon's own may then hold at most a share
//! of the listener's connections. If the kernel will not say (no netlink in a sandbox), no
//! share is enforced and the total limit alone applies.

use std::collections::HashMap;
use std::mem::size_of;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The uid owning the client end of a loopback connection from `peer` to `local`.
pub(super) fn peer_uid(local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    // The client's socket: its source is our peer, its destination us.
    let request = DiagRequest::new(peer, local)?;
    // SAFETY: a plain socket(2) call; the descriptor is owned (and closed) by `OwnedFd`.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just returned by socket(2) and is not owned elsewhere.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 200_000,
    };
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: the pointers are to live values of the sizes given.
    let sent = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            size_of::<libc::timeval>() as u32,
        );
        libc::sendto(
            fd.as_raw_fd(),
            (&request as *const DiagRequest).cast(),
            size_of::<DiagRequest>(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent != size_of::<DiagRequest>() as isize {
        return None;
    }
    let mut answer = [0u8; 1024];
    // SAFETY: `answer` is a live buffer of the length given.
    let n = unsafe { libc::recv(fd.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), 0) };
    parse_answer(answer.get(..usize::try_from(n).ok()?)?)
}

/// SOCK_DIAG_BY_FAMILY, from linux/sock_diag.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// No socket cookie: match by addresses.
const NO_COOKIE: [u32; 2] = [!0, !0];

/// `struct nlmsghdr` and `struct inet_diag_req_v2`, as the kernel reads them.
#[repr(C)]
struct DiagRequest {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// `struct inet_diag_sockid`: ports and addresses in network byte order.
#[repr(C)]
#[derive(Clone, Copy)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    interface: u32,
    cookie: [u32; 2],
}

impl DiagRequest {
    fn new(src: SocketAddr, dst: SocketAddr) -> Option<DiagRequest> {
        let family = match (src.ip(), dst.ip()) {
            (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
            (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
            _ => return None,
        };
        Some(DiagRequest {
            len: size_of::<DiagRequest>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: libc::NLM_F_REQUEST as u16,
            seq: 1,
            pid: 0,
            family: family as u8,
            protocol: libc::IPPROTO_TCP as u8,
            ext: 0,
            pad: 0,
            states: !0,
            id: SockId {
                sport: src.port().to_be(),
                dport: dst.port().to_be(),
                src: words(src.ip()),
                dst: words(dst.ip()),
                interface: 0,
                cookie: NO_COOKIE,
            },
        })
    }
}

/// An address as the kernel's four 32-bit words (bytes in network order).
fn words(ip: IpAddr) -> [u32; 4] {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes.copy_from_slice(&v6.octets()),
    }
    std::array::from_fn(|i| u32::from_ne_bytes(bytes[i * 4..i * 4 + 4].try_into().unwrap()))
}

/// The uid in the kernel's answer: a `struct inet_diag_msg` after the 16-byte netlink header
/// (`idiag_uid` is at offset 64 of it); an error answer has none.
fn parse_answer(answer: &[u8]) -> Option<u32> {
    const HEADER: usize = 16;
    const UID_AT: usize = HEADER + 4 + size_of::<SockId>() + 12;
    let kind = u16::from_ne_bytes(answer.get(4..6)?.try_into().ok()?);
    if kind != SOCK_DIAG_BY_FAMILY {
        return None;
    }
    Some(u32::from_ne_bytes(
        answer.get(UID_AT..UID_AT + 4)?.try_into().ok()?,
    ))
}

/// Connections held per local user, each counted while its [`Held`] lives.
#[derive(Default)]
pub(super) struct PerUser {
    held: Mutex<HashMap<u32, usize>>,
}

/// One connection counted against its user; uncounted when dropped.
pub(super) struct Held {
    users: Arc<PerUser>,
    uid: u32,
}

impl PerUser {
    /// Counts a connection of `uid`, unless it holds `share` already.
    pub(super) fn take(users: &Arc<PerUser>, uid: u32, share: usize) -> Option<Held> {
        let mut held = users.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(uid).or_insert(0);
        if *count >= share {
            return None;
        }
        *count += 1;
        Some(Held {
            users: users.clone(),
            uid,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.users.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_names_the_user_of_a_loopback_connection() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, peer) = listener.accept().unwrap();
        assert_eq!(peer, client.local_addr().unwrap());
        match peer_uid(server.local_addr().unwrap(), peer) {
            Some(uid) => assert_eq!(uid, compactd_store::private_dir::current_uid()),
            None => eprintln!("SKIP: this kernel (or sandbox) answers no sock_diag query"),
        }
    }

    #[test]
    fn a_user_holds_at_most_its_share_and_gives_it_back() {
        let users = Arc::new(PerUser::default());
        let held: Vec<Held> = (0..3).filter_map(|_| PerUser::take(&users, 7, 3)).collect();
        assert_eq!(held.len(), 3);
        assert!(PerUser::take(&users, 7, 3).is_none());
        assert!(
            PerUser::take(&users, 8, 3).is_some(),
            "another user has room"
        );
        drop(held);
        assert!(PerUser::take(&users, 7, 3).is_some());
    }
}
