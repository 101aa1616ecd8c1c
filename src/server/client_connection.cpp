#include "server/client_connection.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <string>

namespace m40::server {

namespace {

// host and port of a socket address, written as httplib writes them.
bool numeric_address(const sockaddr_storage& addr, socklen_t len, std::string& host, int& port) {
  char h[NI_MAXHOST];
  char p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  host = h;
  port = std::atoi(p);
  return true;
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req)
    : local_addr_(req.local_addr), local_port_(req.local_port), remote_addr_(req.remote_addr),
      remote_port_(req.remote_port) {}

int ClientConnection::find_socket() const {
  if (remote_port_ <= 0 || local_port_ <= 0) return -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const int fd = std::atoi(entry.path().filename().c_str());
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{};
    socklen_t peer_len = sizeof peer;
    sockaddr_storage self{};
    socklen_t self_len = sizeof self;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) != 0) continue;
    std::string peer_host, self_host;
    int peer_port = 0, self_port = 0;
    if (!numeric_address(peer, peer_len, peer_host, peer_port) || !numeric_address(self, self_len, self_host, self_port)) {
      continue;
    }
    if (peer_port == remote_port_ && self_port == local_port_ && peer_host == remote_addr_ && self_host == local_addr_) {
      return fd;
    }
  }
  return -1;
}

bool ClientConnection::closed() {
  if (fd_ == -2) fd_ = find_socket();
  if (fd_ < 0) return false;
  char byte;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // orderly close
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  return false;  // the client sent more (a pipelined request): still there
}

}  // namespace m40::server
