// HTTP(S) through libcurl: small GETs (API listings) and resumable downloads
// of large files into a partial file, hashed with SHA-256 as they arrive.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "common/error.h"

struct sockaddr;

namespace m40::store {

// An HTTP error status (404, 401, ...) from the server.
class HttpStatusError : public Error {
 public:
  HttpStatusError(const std::string& what, long status) : Error(what), status_(status) {}
  long status() const { return status_; }

 private:
  long status_;
};

// The network failed (no route, DNS, refused, dropped too often).
class NetworkError : public Error {
 public:
  using Error::Error;
};

// The local disk refused a write (full, read-only, permission, file size limit).
class DiskError : public Error {
 public:
  explicit DiskError(const std::string& what, int error_number = 0) : Error(what), error_number_(error_number) {}
  int error_number() const { return error_number_; }  // errno, when known

 private:
  int error_number_;
};

// Another process holds the partial file's lock and is writing it: nothing
// of it, or of its folder, is this pull's to touch.
class BusyError : public Error {
 public:
  using Error::Error;
};

// A partial file opened for writing under the lock that keeps two pulls of
// the same model apart, a download and a local copy alike (flock, released
// when this closes the file). Nothing is truncated or written before it is
// held.
class LockedPartial {
 public:
  // Creates the file when missing; throws BusyError when another pull holds
  // the lock, DiskError when the file cannot be opened.
  explicit LockedPartial(const std::filesystem::path& path);
  ~LockedPartial();
  LockedPartial(const LockedPartial&) = delete;
  LockedPartial& operator=(const LockedPartial&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// The user stopped the pull (Ctrl-C, SIGTERM); what arrived is kept.
class InterruptedError : public Error {
 public:
  using Error::Error;
};

// A connection the request's AddressCheck refused (a server's pull of a
// loopback or private address). Nothing was sent to that address.
class AddressRefusedError : public Error {
 public:
  using Error::Error;
};

// A download stopped for what it is, not for how it went: larger than its
// size cap, no GGUF file, or longer or shorter than its own GGUF header
// says. What arrived is worth nothing: the caller deletes it.
class DownloadRefusedError : public Error {
 public:
  using Error::Error;
};

// Whether a connection to `address` (AF_INET or AF_INET6) may be made.
// libcurl asks with the address it resolved, just before it connects to it,
// for every connection of a request, redirects included: a name that
// resolves to another address between a check and the connection (DNS
// rebinding) is checked at the address actually used.
using AddressCheck = std::function<bool(const sockaddr& address)>;

// False for addresses that reach this machine or its networks rather than
// the internet: IPv4 0/8, 10/8, 100.64/10, 127/8, 169.254/16, 172.16/12,
// 192.0.0/24, 192.168/16, 198.18/15, 224/4 and 240/4; IPv6 ::, ::1,
// fc00::/7, fe80::/10, fec0::/10, ff00::/8, Teredo 2001::/32, and the IPv4
// forms inside ::ffff:0:0/96, ::/96, 64:ff9b::/96 and 2002::/16 judged as
// IPv4. Any other family is refused.
bool is_public_address(const sockaddr& address);

// "203.0.113.5", "2001:db8::1"; "" for another family.
std::string address_text(const sockaddr& address);

// What every request of one pull shares.
struct RequestPolicy {
  AddressCheck address_allowed;       // empty: any address
  std::function<bool()> interrupted;  // polled about once a second: true stops it with InterruptedError
};

// A size a download may not exceed, and what it is, for the message:
// "the 12.3 GB free on the store's disk".
struct SizeCap {
  uint64_t bytes = 0;
  std::string what;
};

// GET a URL into memory (redirects followed); throws HttpStatusError for
// status >= 400 and NetworkError when the server cannot be reached. When
// `link_header` is given it receives the final response's Link header ("" if
// none), which paginated APIs use to point at the next page.
// With a policy, every connection is checked (AddressRefusedError) and an
// interruption stops it (InterruptedError). Proxies from the environment are
// not used while addresses are checked: a proxy would connect on our behalf
// to an address this process never sees.
std::string http_get_text(const std::string& url, const std::map<std::string, std::string>& headers = {},
                          std::string* link_header = nullptr, const RequestPolicy& policy = {});

struct DownloadRequest {
  std::string url;
  std::filesystem::path partial;         // appended to when it exists (resume)
  // The partial file, already opened and locked by the caller, who holds the
  // lock past the download until the file is verified and installed; null:
  // download_file locks it itself, for the transfer only.
  const LockedPartial* locked = nullptr;
  std::optional<uint64_t> expected_size;  // when known: done at this size
  std::map<std::string, std::string> headers;
  int max_attempts = 6;                  // a dropped connection resumes this many times
  double retry_delay_s = 0.5;            // grows with each attempt
  // Called with (bytes in the partial file, total when known).
  std::function<void(uint64_t, std::optional<uint64_t>)> on_progress;
  // Called when a dropped transfer is about to resume.
  std::function<void(const std::string&)> on_notice;
  // Polled while the transfer runs (at least once a second, even when no
  // bytes arrive); true stops it with InterruptedError, the partial file kept.
  std::function<bool()> interrupted;
  // Checked for every connection, redirects included (AddressRefusedError);
  // empty: any address.
  AddressCheck address_allowed;
  // The most bytes the file may have: a response that declares more
  // (Content-Length, Content-Range), a stream that grows past it, or a GGUF
  // header whose tensors need more stops with DownloadRefusedError.
  std::optional<SizeCap> max_size;
  // The file must be GGUF: its header is read as soon as it has arrived
  // (probe_gguf), and a download that is no GGUF file, whose declared length
  // is not the one its header gives, or that runs past the end its header
  // gives, stops with DownloadRefusedError.
  bool gguf = false;
};

struct DownloadResult {
  uint64_t size = 0;
  std::string sha256;                    // of the whole partial file
  std::optional<std::string> linked_sha256;  // from X-Linked-Etag (Hugging Face)
  uint64_t resumed_from = 0;             // bytes already there at the start
};

// Resumes a partial file only when the record beside it (PATH.json, see
// partial_record_path) names the same URL and an ETag or Last-Modified, sent
// as If-Range; otherwise, or when the server's file changed, it starts over.
DownloadResult download_file(const DownloadRequest& request);

// What the bytes of a partial download are: the URL and the validators of
// the response that started it.
struct PartialRecord {
  std::string url;
  std::string etag;           // as the server sent it, quotes and all
  std::string last_modified;
  std::optional<uint64_t> size;  // the whole file, when known
};

// "model.gguf.partial" -> "model.gguf.partial.json"
std::filesystem::path partial_record_path(const std::filesystem::path& partial);
std::optional<PartialRecord> read_partial_record(const std::filesystem::path& path);
bool write_partial_record(const std::filesystem::path& path, const PartialRecord& record);

// User-Agent sent with every request.
inline constexpr const char* kUserAgent = "m40-llm/0.1";

}  // namespace m40::store
