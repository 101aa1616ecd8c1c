#include "server/http_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.h"

namespace m40::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// After an answer that leaves a request body unread, the client may still be
// sending it: reading (and dropping) it a little while before closing keeps
// the kernel from resetting the connection, which could destroy the answer
// before the client reads it.
constexpr auto kLingerTime = std::chrono::seconds(1);
constexpr size_t kLingerBytes = 256u << 10;

// Threads that run handlers. Tasks left when it stops are dropped.
class WorkerPool {
 public:
  void start(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { work(); });
  }
  void post(std::function<void()> task) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }
  void stop() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      dropped.swap(tasks_);
    }
    cv_.notify_all();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    threads_.clear();
  }

 private:
  void work() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (stopping_) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The status line and header of an answer. `chunked`: the body follows in
// chunks; else `body_size` bytes follow (none for 1xx and 204).
std::string serialize_head(const HttpResponse& res, bool keep_alive, bool chunked, size_t body_size) {
  std::string out = "HTTP/1.1 " + std::to_string(res.status) + " " + status_reason(res.status) + "\r\n";
  auto clean = [](std::string s) {  // a header value never ends the line early
    std::erase_if(s, [](char c) { return c == '\r' || c == '\n'; });
    return s;
  };
  for (const auto& [name, value] : res.headers) out += clean(name) + ": " + clean(value) + "\r\n";
  const bool bodiless = res.status == 204 || res.status < 200;
  if (chunked) {
    out += "Transfer-Encoding: chunked\r\n";
  } else if (!bodiless) {
    out += "Content-Length: " + std::to_string(body_size) + "\r\n";
  }
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  return out;
}

// The status for an error of Beast's parser.
HttpError parse_error(const beast::error_code& ec, const RequestLimits& limits) {
  if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
    return {431, "the request header is larger than " + std::to_string(limits.max_header_bytes) + " bytes"};
  }
  if (ec == http::error::body_limit) {
    return {413, "the request body is too large: at most " + std::to_string(limits.max_body_bytes) + " bytes are read"};
  }
  if (ec == http::error::bad_content_length) return {400, "the request's Content-Length is not valid"};
  if (ec == http::error::bad_transfer_encoding) return {400, "the request's Transfer-Encoding is not valid"};
  if (ec == http::error::bad_version) return {505, "only HTTP/1.0 and HTTP/1.1 are served"};
  return {400, "the request is not valid HTTP: " + ec.message()};
}

bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
         ec == net::error::operation_aborted || ec == net::error::bad_descriptor || ec == net::error::broken_pipe ||
         ec == net::error::not_connected;
}

}  // namespace

class Connection;

struct HttpTransport::Impl {
  Impl(HttpService& s, TransportOptions o) : service(s), options(std::move(o)) {}

  HttpService& service;
  TransportOptions options;

  // The connections open now, by address (under mutex).
  std::mutex mutex;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> live;
  std::unordered_map<std::string, int> per_client;
  int open = 0;

  // Bytes of request bodies held now (RequestLimits::max_bodies_bytes).
  std::atomic<size_t> bodies_bytes{0};
  bool reserve_body(size_t bytes) {
    size_t held = bodies_bytes.load();
    do {
      if (held + bytes > options.limits.max_bodies_bytes) return false;
    } while (!bodies_bytes.compare_exchange_weak(held, held + bytes));
    return true;
  }

  // Requests handed to workers whose answers have not ended.
  std::mutex answering_mutex;
  std::condition_variable answering_cv;
  int answering = 0;

  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  bool stopped = false;

  WorkerPool workers;
  // Declared last, destroyed first: handlers still queued in the context
  // destroy their connections, which unregister themselves above.
  net::io_context io{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> keep_running{net::make_work_guard(io)};
  tcp::acceptor acceptor{io};
  net::steady_timer accept_retry{io};

  void accept();
  void admit(tcp::socket socket);
  void add_answering(int delta) {
    {
      std::lock_guard lock(answering_mutex);
      answering += delta;
    }
    answering_cv.notify_all();
  }
  bool wait_answers(std::chrono::milliseconds timeout) {
    std::unique_lock lock(answering_mutex);
    return answering_cv.wait_for(lock, timeout, [&] { return answering == 0; });
  }
  std::vector<std::shared_ptr<Connection>> connections() {
    std::vector<std::shared_ptr<Connection>> out;
    std::lock_guard lock(mutex);
    for (auto& [_, weak] : live) {
      if (auto c = weak.lock()) out.push_back(std::move(c));
    }
    return out;
  }
};

// One client connection. Everything but the answer runs on the I/O thread;
// while a worker answers, the connection does nothing else (the socket is
// the worker's), and the next request is read when it hands it back.
class Connection : public std::enable_shared_from_this<Connection>, private ResponseWriter {
 public:
  Connection(HttpTransport::Impl& t, tcp::socket socket, std::string client, bool admitted)
      : t_(t), socket_(std::move(socket)), deadline_(t.io), client_(std::move(client)), admitted_(admitted) {
    // The descriptor stays open until the connection is destroyed (close()
    // only shuts it down), so a worker or stop() never touches another socket.
    fd_ = socket_.native_handle();
    beast::error_code ec;
    socket_.non_blocking(true, ec);  // workers write with poll() and a deadline
    // Each streamed token is a small write: without TCP_NODELAY, Nagle's
    // algorithm holds it until the client's (delayed) ACK of the previous one.
    socket_.set_option(tcp::no_delay(true), ec);
  }

  ~Connection() override {
    release_body();
    std::lock_guard lock(t_.mutex);
    t_.live.erase(this);
    if (admitted_) {
      --t_.open;
      if (--t_.per_client[client_] <= 0) t_.per_client.erase(client_);
    }
  }

  void register_live() {
    std::lock_guard lock(t_.mutex);
    t_.live[this] = weak_from_this();
  }

  void start() { read_header(); }

  // Over the connection caps: answer 503 without reading a request.
  void refuse_connection(const std::string& why) { refuse(HttpError{503, why, "server_busy"}, nullptr); }

  // stop_accepting(): a connection waiting for a request closes; one being
  // answered finishes its answer first (then after_answer() closes it).
  void close_if_waiting() {
    if (!answering_) close();
  }

  // The last step of stop(): whatever it is doing ends now; a worker
  // writing to it fails at once.
  void abort() { ::shutdown(fd_, SHUT_RDWR); }

 private:
  // The deadline of the operations that follow: when it passes, they end
  // (operation_aborted) with timed_out_ set. The generation tells a stale
  // expiry, already queued when the deadline was moved, from a real one.
  void arm(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    const uint64_t generation = ++deadline_generation_;
    deadline_.expires_after(timeout);
    deadline_.async_wait([weak = weak_from_this(), generation](beast::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || generation != self->deadline_generation_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->socket_.cancel(ignored);
    });
  }
  void disarm() {
    ++deadline_generation_;
    deadline_.cancel();
  }

  // ---- reading a request (I/O thread) --------------------------------------

  void read_header() {
    release_body();
    if (t_.stopping.load()) return close();
    const auto& limits = t_.options.limits;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits.max_header_bytes));
    parser_->body_limit(limits.max_body_bytes);
    head_ = HttpRequest{};
    // One deadline for the whole header (and the wait for it on a kept-alive
    // connection): a client sending a byte a second gains nothing.
    arm(limits.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (ec && timed_out_) {
      // Silence on a kept-alive connection is no error; a header begun and
      // not finished is.
      if (buffer_.size() == 0) return close();
      return refuse({408, "the request header did not arrive in time"}, nullptr);
    }
    if (is_disconnect(ec)) return close();
    if (ec) return refuse(parse_error(ec, t_.options.limits), nullptr);

    const auto& msg = parser_->get();
    head_.method = std::string(msg.method_string());
    head_.target = std::string(msg.target());
    head_.path = head_.target.substr(0, head_.target.find('?'));
    head_.version = static_cast<int>(msg.version());
    for (const auto& field : msg) head_.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    head_.remote_addr = client_;
    std::weak_ptr<Connection> weak = weak_from_this();
    head_.client_gone = [weak] {
      auto self = weak.lock();
      return !self || self->client_gone();
    };

    if (auto refusal = check_request_head(head_, t_.options.limits)) return refuse(*refusal, &head_);
    if (auto answer = t_.service.screen(head_)) return answer_at_once(std::move(*answer));
    if (parser_->is_done()) return dispatch();
    // The body's share of the memory all bodies may hold, before it is read.
    const size_t body_bytes = parser_->chunked() ? t_.options.limits.max_body_bytes
                                                 : static_cast<size_t>(parser_->content_length().value_or(0));
    if (!t_.reserve_body(body_bytes)) {
      return refuse({503, "the server is receiving too many request bodies at once; retry shortly", "server_busy"}, &head_);
    }
    body_reserved_ = body_bytes;
    if (iequals(head_.header("Expect"), "100-continue")) {
      out_ = "HTTP/1.1 100 Continue\r\n\r\n";
      arm(t_.options.limits.write_timeout);
      net::async_write(socket_, net::buffer(out_), [self = shared_from_this()](beast::error_code wec, size_t) {
        if (wec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    arm(t_.options.limits.body_timeout);
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec && self->timed_out_) return self->refuse({408, "the request body did not arrive in time"}, &self->head_);
      if (is_disconnect(ec)) return self->close();
      if (ec) return self->refuse(parse_error(ec, self->t_.options.limits), &self->head_);
      self->dispatch();
    });
  }

  // ---- answering -------------------------------------------------------------

  void dispatch() {
    disarm();
    head_.body = std::move(parser_->get().body());
    keep_alive_ = parser_->get().keep_alive();
    if (t_.service.answers_at_once(head_)) return answer_at_once(handle());
    answering_ = true;
    t_.add_answering(1);
    // The count drops when the task ends or is dropped unrun (stop).
    auto done = std::shared_ptr<void>(nullptr, [&t = t_](void*) { t.add_answering(-1); });
    t_.workers.post([self = shared_from_this(), done] {
      const bool keep = self->answer_on_worker();
      net::post(self->t_.io, [self, keep] { self->after_answer(keep); });
    });
  }

  // The handler's answer; an exception it let through is a 500 (it must
  // not end the I/O thread or a worker).
  HttpResponse handle() {
    HttpResponse res;
    try {
      t_.service.handle(head_, res);
    } catch (const std::exception& e) {
      res = t_.service.error_answer(&head_, HttpError{500, e.what(), "server_error"});
    }
    return res;
  }

  // A worker: the handler, then its answer written on this thread. Returns
  // whether the connection may serve another request.
  bool answer_on_worker() {
    HttpResponse res = handle();
    const bool head_only = head_.method == "HEAD";
    if (!res.stream || head_only) {
      if (head_only) res.stream = nullptr;  // frees what the stream held
      const std::string head = serialize_head(res, keep_alive_, false, res.body.size());
      return send_all(head + (head_only ? std::string() : res.body)) && keep_alive_;
    }
    // HTTP/1.0 has no chunks: the body runs until the connection closes.
    const bool chunked = head_.version >= 11;
    chunked_ = chunked;
    writes_ok_ = send_all(serialize_head(res, keep_alive_ && chunked, chunked, 0));
    auto producer = std::move(res.stream);
    if (writes_ok_) producer(*this);
    producer = nullptr;  // frees the request's slot and model lease now
    if (writes_ok_ && chunked) writes_ok_ = send_all("0\r\n\r\n");
    return writes_ok_ && chunked && keep_alive_;
  }

  // ResponseWriter: one chunk of a streamed answer.
  bool write(std::string_view data) override {
    if (!writes_ok_) return false;
    if (data.empty()) return true;  // an empty chunk would end the body
    if (!chunked_) return writes_ok_ = send_all(data);
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    std::string chunk = size;
    chunk.append(data).append("\r\n");
    return writes_ok_ = send_all(chunk);
  }

  bool client_gone() override {
    pollfd p{fd_, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
  }

  // Writes all of `data` (a worker owns the socket now), waiting at most the
  // write timeout for a client that does not read.
  bool send_all(std::string_view data) {
    const auto deadline = Clock::now() + t_.options.limits.write_timeout;
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return false;
        pollfd p{fd_, POLLOUT, 0};
        ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
        continue;
      }
      return false;
    }
    return true;
  }

  // Back from the worker (I/O thread).
  void after_answer(bool keep_alive) {
    answering_ = false;
    release_body();
    if (!keep_alive || t_.stopping.load()) return close();
    read_header();
  }

  // An answer made on the I/O thread (screen, /health).
  void answer_at_once(HttpResponse res) {
    const bool body_unread = !parser_->is_done();
    const bool keep = keep_alive_of_head() && !body_unread && !t_.stopping.load();
    const bool head_only = head_.method == "HEAD";
    out_ = serialize_head(res, keep, false, res.body.size()) + (head_only ? std::string() : res.body);
    write_then(keep, body_unread);
  }

  // An error the transport answers; the connection closes after it.
  void refuse(const HttpError& error, const HttpRequest* head) {
    disarm();
    HttpResponse res = t_.service.error_answer(head, error);
    out_ = serialize_head(res, false, false, res.body.size()) + res.body;
    write_then(false, true);
  }

  void write_then(bool keep_alive, bool linger) {
    arm(t_.options.limits.write_timeout);
    net::async_write(socket_, net::buffer(out_), [self = shared_from_this(), keep_alive, linger](beast::error_code ec, size_t) {
      self->release_body();  // the answer is out: a closing connection's linger holds no body
      if (ec) return self->close();
      if (keep_alive) return self->read_header();
      if (linger) return self->linger_close();
      self->close();
    });
  }

  bool keep_alive_of_head() const { return parser_ && parser_->is_header_done() && parser_->get().keep_alive(); }

  // Once its answer is out, the request's body (read, or partly read into
  // the parser) is freed and no longer counts.
  void release_body() {
    if (body_reserved_ > 0) t_.bodies_bytes.fetch_sub(body_reserved_);
    body_reserved_ = 0;
    std::string().swap(head_.body);
    parser_.reset();
  }

  // ---- closing ---------------------------------------------------------------

  void linger_close() {
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    lingered_ = 0;
    arm(kLingerTime);
    drain();
  }

  void drain() {
    socket_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->lingered_ += n;
      if (ec || self->lingered_ > kLingerBytes) return self->close();
      self->drain();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    disarm();
    // Pending operations end with operation_aborted; the descriptor is
    // closed when the last handler lets go of the connection.
    socket_.cancel(ec);
  }

  HttpTransport::Impl& t_;
  tcp::socket socket_;
  net::steady_timer deadline_;
  uint64_t deadline_generation_ = 0;
  bool timed_out_ = false;
  int fd_ = -1;
  std::string client_;
  bool admitted_;
  beast::flat_buffer buffer_{64u << 10};
  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest head_;
  bool keep_alive_ = false;
  bool answering_ = false;  // a worker has the socket
  size_t body_reserved_ = 0;  // this request's share of Impl::bodies_bytes
  bool closed_ = false;
  bool chunked_ = true;
  bool writes_ok_ = true;
  std::string out_;
  std::array<char, 16384> drain_{};
  size_t lingered_ = 0;
};

void HttpTransport::Impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors (EMFILE) and the like: try again shortly rather
      // than spin.
      accept_retry.expires_after(std::chrono::milliseconds(50));
      accept_retry.async_wait([this](beast::error_code wec) {
        if (!wec && acceptor.is_open()) accept();
      });
      return;
    }
    admit(std::move(socket));
    accept();
  });
}

void HttpTransport::Impl::admit(tcp::socket socket) {
  beast::error_code ec;
  const auto remote = socket.remote_endpoint(ec);
  if (ec) return;  // gone already
  std::string client = remote.address().to_string();
  std::string refused;
  {
    std::lock_guard lock(mutex);
    const auto& limits = options.limits;
    if (open >= limits.max_connections) {
      refused = "the server has " + std::to_string(open) + " connections open, its limit: try again later";
    } else if (per_client[client] >= limits.max_connections_per_client) {
      refused = "this address has " + std::to_string(per_client[client]) +
                " connections open, the limit for one client: close some or try again later";
    } else {
      ++open;
      ++per_client[client];
    }
    if (per_client[client] == 0) per_client.erase(client);
  }
  auto c = std::make_shared<Connection>(*this, std::move(socket), client, refused.empty());
  c->register_live();
  if (refused.empty()) {
    c->start();
  } else {
    c->refuse_connection(refused);
  }
}

HttpTransport::HttpTransport(HttpService& service, TransportOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {
  impl_->workers.start(std::max(1, impl_->options.workers));
}

HttpTransport::~HttpTransport() { stop(std::chrono::milliseconds(0)); }

int HttpTransport::bind(const std::string& host, int port) {
  auto& t = *impl_;
  if (t.acceptor.is_open()) return t.acceptor.local_endpoint().port();
  const std::string where = host + ":" + std::to_string(port);
  beast::error_code ec;
  tcp::resolver resolver(t.io);
  const auto endpoints =
      resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) throw Error("cannot listen on " + where + ": " + ec.message() + "; pick another with --host/--port");
  beast::error_code last = net::error::host_not_found;
  for (const auto& entry : endpoints) {
    t.acceptor.open(entry.endpoint().protocol(), ec);
    if (ec) {
      last = ec;
      continue;
    }
    // SO_REUSEADDR lets a restarted server bind while its old connections
    // linger in TIME_WAIT; on Linux it never lets two sockets listen on one
    // port (SO_REUSEPORT would, and is not set).
    t.acceptor.set_option(net::socket_base::reuse_address(true), ec);
    t.acceptor.bind(entry.endpoint(), ec);
    if (!ec) t.acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (!ec) return t.acceptor.local_endpoint().port();
    last = ec;
    beast::error_code ignored;
    t.acceptor.close(ignored);
  }
  if (last == net::error::address_in_use) {
    throw Error("cannot listen on " + where + ": address in use (another server listens there); pick another with --host/--port");
  }
  throw Error("cannot listen on " + where + ": " + last.message() + "; pick another with --host/--port");
}

void HttpTransport::run() {
  auto& t = *impl_;
  if (t.stopping.load()) return;
  net::post(t.io, [&t] {
    if (t.acceptor.is_open()) t.accept();
  });
  t.io.run();
}

void HttpTransport::stop_accepting() {
  auto& t = *impl_;
  t.stopping.store(true);
  net::post(t.io, [&t] {
    beast::error_code ec;
    t.acceptor.close(ec);
    t.accept_retry.cancel();
    for (auto& c : t.connections()) c->close_if_waiting();
  });
}

void HttpTransport::stop(std::chrono::milliseconds grace) {
  auto& t = *impl_;
  {
    std::lock_guard lock(t.stop_mutex);
    if (t.stopped) return;
    t.stopped = true;
  }
  stop_accepting();
  t.wait_answers(grace);
  // Answers still running write to clients that do not read, or wait on a
  // handler: their sockets fail now, so their writes end.
  for (auto& c : t.connections()) c->abort();
  t.wait_answers(std::chrono::seconds(5));
  t.workers.stop();
  t.keep_running.reset();
  t.io.stop();
}

}  // namespace m40::server
