// cpp-httplib 0.11 listens with a backlog of 5 connections: a burst of
// clients connecting at once (64 streams) overflows it and some see their
// connection dropped. Listening again on the same socket raises the backlog.
#pragma once

namespace m40::server {

// Raises the backlog of this process's listening socket on `port` to
// SOMAXCONN. Returns false when no such socket was found.
bool widen_listen_backlog(int port);

}  // namespace m40::server
