// Whether the client of a request still holds its connection, for handlers
// that wait without writing (non-streaming answers). cpp-httplib 0.11 gives
// handlers no socket, so the socket is found by its two addresses, which
// are unique while the handler runs (httplib keeps it open until then).
#pragma once

#include <httplib.h>

namespace m40::server {

class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  // True once the client has closed the connection or reset it. False when
  // the socket could not be found (then nothing is cancelled).
  bool closed();

 private:
  int find_socket() const;

  std::string local_addr_;
  int local_port_;
  std::string remote_addr_;
  int remote_port_;
  int fd_ = -2;  // -2: not looked up yet; -1: not found
};

}  // namespace m40::server
