#include "store/http_download.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "store/gguf_extent.h"
#include "store/sha256.h"
#include "store/store.h"

namespace m40::store {

namespace {

void ensure_curl_initialized() {
  struct Global {
    Global() { curl_global_init(CURL_GLOBAL_DEFAULT); }
    ~Global() { curl_global_cleanup(); }
  };
  static Global global;
}

std::string host_of(const std::string& url);

class Easy {
 public:
  Easy() {
    ensure_curl_initialized();
    handle_ = curl_easy_init();
    if (handle_ == nullptr) throw Error("cannot start libcurl");
  }
  ~Easy() {
    curl_easy_cleanup(handle_);
    curl_slist_free_all(headers_);
  }
  Easy(const Easy&) = delete;
  Easy& operator=(const Easy&) = delete;
  CURL* get() const { return handle_; }

  // Options every request shares: redirects, HTTP(S) only, timeouts, and
  // the caller's headers.
  void setup(const std::string& url, const std::map<std::string, std::string>& headers) {
    curl_easy_setopt(handle_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(handle_, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(handle_, CURLOPT_MAXREDIRS, 10L);
    limit_protocols();
    curl_easy_setopt(handle_, CURLOPT_USERAGENT, kUserAgent);
    curl_easy_setopt(handle_, CURLOPT_CONNECTTIMEOUT, 30L);
    // A transfer that moves nothing for a minute is dead: resume it.
    curl_easy_setopt(handle_, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(handle_, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(handle_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(handle_, CURLOPT_ERRORBUFFER, error_);
    for (const auto& [key, value] : headers) headers_ = curl_slist_append(headers_, (key + ": " + value).c_str());
    if (headers_ != nullptr) curl_easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_);
  }

  // One more request header, after setup().
  void add_header(const std::string& line) {
    headers_ = curl_slist_append(headers_, line.c_str());
    curl_easy_setopt(handle_, CURLOPT_HTTPHEADER, headers_);
  }

  std::string message(CURLcode code) const { return error_[0] != '\0' ? error_ : curl_easy_strerror(code); }
  long status() const {
    long status = 0;
    curl_easy_getinfo(handle_, CURLINFO_RESPONSE_CODE, &status);
    return status;
  }

  // Every connection of this request (redirects included) goes to an
  // address `check` allows, or is not made. Proxies are off: a proxy would
  // connect to the target on our behalf, where no check sees the address.
  void check_addresses(const AddressCheck& check) {
    if (!check) return;
    check_ = &check;
    curl_easy_setopt(handle_, CURLOPT_OPENSOCKETFUNCTION, open_checked_socket);
    curl_easy_setopt(handle_, CURLOPT_OPENSOCKETDATA, this);
    curl_easy_setopt(handle_, CURLOPT_PROXY, "");
  }

  // After a transfer: AddressRefusedError when a connection was refused.
  void throw_if_refused() const {
    if (refused_.empty()) return;
    char* url = nullptr;
    curl_easy_getinfo(handle_, CURLINFO_EFFECTIVE_URL, &url);
    throw AddressRefusedError("refusing to connect to " + host_of(url != nullptr ? url : "") + " at " + refused_ +
                              ": not a public internet address (loopback, private, link-local or reserved)");
  }

 private:
  // Only http and https, for the URL and for every redirect: a Location
  // of file://, ftp://, gopher://, dict://... is not followed.
  void limit_protocols() {
    bool limited = curl_easy_setopt(handle_, CURLOPT_PROTOCOLS_STR, "http,https") == CURLE_OK &&
                   curl_easy_setopt(handle_, CURLOPT_REDIR_PROTOCOLS_STR, "http,https") == CURLE_OK;
    if (!limited) {
      // A libcurl older than 7.85 (run against newer headers) knows only the bitmasks.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
      const long http = CURLPROTO_HTTP | CURLPROTO_HTTPS;
      limited = curl_easy_setopt(handle_, CURLOPT_PROTOCOLS, http) == CURLE_OK &&
                curl_easy_setopt(handle_, CURLOPT_REDIR_PROTOCOLS, http) == CURLE_OK;
#pragma GCC diagnostic pop
    }
    if (!limited) throw Error("this libcurl cannot be limited to HTTP and HTTPS");
  }

  static curl_socket_t open_checked_socket(void* user, curlsocktype purpose, curl_sockaddr* address) {
    auto& easy = *static_cast<Easy*>(user);
    bool allowed = false;
    try {
      allowed = purpose == CURLSOCKTYPE_IPCXN && (*easy.check_)(address->addr);
    } catch (...) {
      allowed = false;
    }
    if (!allowed) {
      if (easy.refused_.empty()) easy.refused_ = address_text(address->addr);
      if (easy.refused_.empty()) easy.refused_ = "an address of family " + std::to_string(address->family);
      return CURL_SOCKET_BAD;
    }
    return ::socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
  }

  CURL* handle_ = nullptr;
  curl_slist* headers_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {};
  const AddressCheck* check_ = nullptr;
  std::string refused_;  // the first address refused
};

// The interruption of a small request (http_get_text), polled by libcurl
// about once a second.
int poll_interrupted(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto& interrupted = *static_cast<const std::function<bool()>*>(user);
  return interrupted() ? 1 : 0;
}

bool public_ipv4(const uint8_t* a) {
  const uint32_t v = (uint32_t{a[0]} << 24) | (uint32_t{a[1]} << 16) | (uint32_t{a[2]} << 8) | a[3];
  const auto in = [v](uint32_t network, int bits) { return (v >> (32 - bits)) == (network >> (32 - bits)); };
  return !(in(0x00000000, 8) ||   // "this network"
           in(0x0A000000, 8) ||   // private
           in(0x64400000, 10) ||  // carrier-grade NAT
           in(0x7F000000, 8) ||   // loopback
           in(0xA9FE0000, 16) ||  // link-local (cloud metadata services)
           in(0xAC100000, 12) ||  // private
           in(0xC0000000, 24) ||  // IETF protocol assignments
           in(0xC0A80000, 16) ||  // private
           in(0xC6120000, 15) ||  // benchmarking
           in(0xE0000000, 4) ||   // multicast
           in(0xF0000000, 4));    // reserved, broadcast
}

bool public_ipv6(const uint8_t* b) {
  const auto zeros = [b](int from, int to) {
    for (int i = from; i < to; ++i) {
      if (b[i] != 0) return false;
    }
    return true;
  };
  if (zeros(0, 10) && b[10] == 0xff && b[11] == 0xff) return public_ipv4(b + 12);  // ::ffff:a.b.c.d
  if (zeros(0, 12)) return !zeros(12, 15) && public_ipv4(b + 12);  // ::, ::1, ::a.b.c.d (IPv4-compatible)
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b) {
    if (zeros(4, 12)) return public_ipv4(b + 12);  // 64:ff9b::a.b.c.d, NAT64
    return false;                                  // 64:ff9b:1::/48, local NAT64
  }
  if (b[0] == 0x20 && b[1] == 0x02) return public_ipv4(b + 2);           // 2002:AABB:CCDD::/48, 6to4
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) return false;  // Teredo: the IPv4 inside is hidden
  if ((b[0] & 0xfe) == 0xfc) return false;                  // fc00::/7, unique local
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0x80) return false;  // fe80::/10, link-local
  if (b[0] == 0xfe && (b[1] & 0xc0) == 0xc0) return false;  // fec0::/10, site-local
  if (b[0] == 0xff) return false;                           // multicast
  return true;
}

bool is_connect_error(CURLcode code) {
  return code == CURLE_COULDNT_RESOLVE_HOST || code == CURLE_COULDNT_RESOLVE_PROXY || code == CURLE_COULDNT_CONNECT;
}

// Failures after which the same request, resumed, may well succeed.
bool is_transient(CURLcode code) {
  switch (code) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return is_connect_error(code);
  }
}

std::string host_of(const std::string& url) {
  size_t start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  const size_t end = url.find_first_of("/?#", start);
  return url.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// A transfer that failed: the network's fault, or (a redirect to file://,
// ftp://...) the source's, which no retry changes.
[[noreturn]] void throw_transfer_error(const std::string& url, CURLcode code, const std::string& message) {
  if (code == CURLE_UNSUPPORTED_PROTOCOL) {
    throw DownloadRefusedError(host_of(url) + " redirected to a URL whose scheme is not supported: " + message +
                               " (only http and https are pulled)");
  }
  if (is_connect_error(code)) throw NetworkError("cannot reach " + host_of(url) + ": " + message + " (is the network up?)");
  throw NetworkError("request to " + host_of(url) + " failed: " + message);
}

HttpStatusError status_error(const std::string& url, long status) {
  if (status == 404) return HttpStatusError("not found (HTTP 404): " + url, status);
  if (status == 401 || status == 403) {
    return HttpStatusError("access denied (HTTP " + std::to_string(status) + ") for " + url +
                               ": the repository may be gated or private; set HF_TOKEN to a token that may read it",
                           status);
  }
  return HttpStatusError("HTTP " + std::to_string(status) + " from " + url, status);
}

size_t append_to_string(char* data, size_t size, size_t count, void* user) {
  auto* out = static_cast<std::string*>(user);
  const size_t bytes = size * count;
  if (out->size() + bytes > (size_t{64} << 20)) return 0;  // no listing is this big
  out->append(data, bytes);
  return bytes;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// If-Range needs a strong ETag; a weak one never matches, so the date is
// the fallback. Empty: nothing the server could check a resume against.
std::string if_range_value(const PartialRecord& r) {
  if (!r.etag.empty() && r.etag.rfind("W/", 0) != 0) return r.etag;
  return r.last_modified;
}

// The state of one download across its attempts.
struct Transfer {
  const DownloadRequest* request = nullptr;
  Easy* easy = nullptr;
  int fd = -1;
  Sha256* hash = nullptr;
  uint64_t offset = 0;  // bytes in the partial file, all of them hashed
  std::optional<uint64_t> total;
  std::optional<std::string> linked_sha256;
  // Which file the bytes in the partial file are: written beside it when a
  // response starts the file from zero, checked before any resume.
  PartialRecord record;
  // The GGUF header's word on the file's size, once it has arrived; the
  // header is read again when the file reaches next_probe bytes.
  std::optional<GgufExtent> extent;
  uint64_t next_probe = 0;
  std::string refusal;  // why the download stops (DownloadRefusedError)

  // Per attempt.
  bool started = false;
  long status = 0;
  bool length_known = false;  // the response said how long the file is
  bool bad_range = false;
  int write_errno = 0;
  std::optional<uint64_t> range_start;
  std::optional<uint64_t> range_total;
  std::string etag;           // of this attempt's (final) response
  std::string last_modified;
  long header_status = 0;     // of the response whose header is being read
  std::optional<uint64_t> content_length;

  void begin_attempt() {
    started = false;
    status = 0;
    length_known = false;
    bad_range = false;
    write_errno = 0;
    range_start.reset();
    range_total.reset();
    etag.clear();
    last_modified.clear();
    header_status = 0;
    content_length.reset();
  }

  bool restart_from_zero() {
    if (::ftruncate(fd, 0) != 0 || ::lseek(fd, 0, SEEK_SET) != 0) {
      write_errno = errno;
      return false;
    }
    hash->reset();
    offset = 0;
    extent.reset();
    next_probe = 0;
    return true;
  }

  // The declared length of the file (this response's), when the response
  // gave one.
  std::optional<uint64_t> declared() const { return length_known ? total : std::nullopt; }

  // Whether what is known of the file's size is acceptable; sets `refusal`
  // when it is not.
  bool size_acceptable() {
    const auto& cap = request->max_size;
    const auto length = declared();
    if (cap && length && *length > cap->bytes) {
      refusal = "it is " + human_size(*length) + " (as the server declares), more than " + cap->what;
    } else if (extent && cap && extent->min_size > cap->bytes) {
      refusal = "its GGUF header declares tensors that make the file " + human_size(extent->min_size) +
                ", more than " + cap->what;
    } else if (extent && length && (*length < extent->min_size || *length > extent->max_size)) {
      refusal = "its GGUF header makes the file " + std::to_string(extent->min_size) +
                (extent->max_size != extent->min_size ? " to " + std::to_string(extent->max_size) : std::string()) +
                " bytes long, but the server declares " + std::to_string(*length);
    } else if (extent && offset > extent->max_size) {
      refusal = "it runs past the " + std::to_string(extent->max_size) + " bytes its GGUF header gives";
    } else if (cap && offset > cap->bytes) {
      refusal = "it grew past " + cap->what;
    }
    return refusal.empty();
  }

  // Reads the GGUF header from the partial file when enough of it has
  // arrived; false (and `refusal`) when the file cannot be what it should.
  bool probe_header() {
    if (!request->gguf || extent || offset < next_probe || offset == 0) return true;
    const int file = fd;
    const GgufProbe probe = probe_gguf(
        [file](uint64_t at, void* out, size_t size) {
          const ssize_t n = ::pread(file, out, size, static_cast<off_t>(at));
          return n > 0 ? static_cast<size_t>(n) : size_t{0};
        },
        offset);
    switch (probe.status) {
      case GgufProbe::Status::Invalid:
        refusal = "it is not a valid GGUF file (" + probe.problem + ")";
        return false;
      case GgufProbe::Status::NeedMore: {
        // Read again once the file has doubled (or reached what the header
        // needs), so that the header is read O(its size) bytes in all.
        next_probe = std::max(probe.need, offset > UINT64_MAX / 2 ? UINT64_MAX : offset * 2);
        const auto& cap = request->max_size;
        if (cap && probe.need > cap->bytes) {
          refusal = "its GGUF header alone runs past " + cap->what;
          return false;
        }
        if (const auto length = declared(); length && probe.need > *length) {
          refusal = "its GGUF header runs past the " + std::to_string(*length) + " bytes the server declares";
          return false;
        }
        return true;
      }
      case GgufProbe::Status::Done:
        extent = probe.extent;
        return size_acceptable();
    }
    return true;
  }
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  const std::string line(data, bytes);
  if (line.rfind("HTTP/", 0) == 0) {  // a new response (after a redirect)
    t.range_start.reset();
    t.range_total.reset();
    t.etag.clear();
    t.last_modified.clear();
    t.content_length.reset();
    t.header_status = 0;
    std::sscanf(line.c_str(), "%*s %ld", &t.header_status);
    return bytes;
  }
  if (trim(line).empty()) {
    // The end of a response's header. The file's own answer (not a
    // redirect's) that declares more than the cap is refused before any of
    // its body arrives: a server may hold a connection open a long time
    // before sending the first byte.
    const auto& cap = t.request->max_size;
    std::optional<uint64_t> length;
    if (t.header_status == 206 && t.range_total) length = t.range_total;
    if (t.header_status == 200) length = t.content_length;
    if (cap && length && *length > cap->bytes) {
      t.refusal = "it is " + human_size(*length) + " (as the server declares), more than " + cap->what;
      return 0;
    }
    return bytes;
  }
  const size_t colon = line.find(':');
  if (colon == std::string::npos) return bytes;
  const std::string key = lower(trim(line.substr(0, colon)));
  std::string value = trim(line.substr(colon + 1));
  if (key == "x-linked-etag") {
    value.erase(std::remove(value.begin(), value.end(), '"'), value.end());
    if (value.rfind("W/", 0) == 0) value.erase(0, 2);
    if (is_sha256_hex(value)) t.linked_sha256 = lower(value);
  } else if (key == "etag") {
    t.etag = value;
  } else if (key == "last-modified") {
    t.last_modified = value;
  } else if (key == "content-length") {
    unsigned long long length = 0;
    if (std::sscanf(value.c_str(), "%llu", &length) == 1) t.content_length = length;
  } else if (key == "content-range") {
    // "bytes START-END/TOTAL"
    unsigned long long start = 0, end = 0, total = 0;
    if (std::sscanf(value.c_str(), "bytes %llu-%llu/%llu", &start, &end, &total) == 3) {
      t.range_start = start;
      t.range_total = total;
    }
  }
  return bytes;
}

// Keeps the Link header of the last response (a redirect's does not count).
size_t keep_link_header(char* data, size_t size, size_t count, void* user) {
  auto& link = *static_cast<std::string*>(user);
  const size_t bytes = size * count;
  const std::string line(data, bytes);
  if (line.rfind("HTTP/", 0) == 0) {
    link.clear();
    return bytes;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos && lower(trim(line.substr(0, colon))) == "link") {
    link += (link.empty() ? "" : ", ") + trim(line.substr(colon + 1));
  }
  return bytes;
}

size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * count;
  if (!t.started) {
    t.started = true;
    t.status = t.easy->status();
    if (t.status >= 400) return 0;
    if (t.offset > 0) {
      if (t.status == 206) {
        // Another slice than asked, or a slice of a file of another size:
        // not the rest of what the partial file holds.
        if (t.range_start != t.offset || (t.range_total && t.record.size && *t.range_total != *t.record.size)) {
          t.bad_range = true;
          return 0;
        }
      } else {
        // The server sent the whole file: it cannot resume, or the file
        // changed since the partial one was started (If-Range).
        if (t.request->on_notice) {
          t.request->on_notice("the server sent the whole file (it changed, or it cannot resume); starting the download over");
        }
        if (!t.restart_from_zero()) return 0;
      }
    }
    if (t.status == 206 && t.range_total) {
      t.total = *t.range_total;
      t.length_known = true;
    } else {
      curl_off_t length = -1;
      curl_easy_getinfo(t.easy->get(), CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
      if (length >= 0) t.total = t.offset + static_cast<uint64_t>(length);
      t.length_known = length >= 0;
    }
    if (!t.total) t.total = t.request->expected_size;
    if (!t.size_acceptable()) return 0;
    if (t.offset == 0) {
      // This response starts the file: record what it is, for a resume.
      t.record = {t.request->url, t.etag, t.last_modified, t.total};
      if (!write_partial_record(partial_record_path(t.request->partial), t.record)) {
        t.write_errno = errno != 0 ? errno : EIO;
        return 0;
      }
    }
  }
  // Nothing past the end the GGUF header gives, or past the cap, is written.
  if (t.extent && t.offset + bytes > t.extent->max_size) {
    t.refusal = "it runs past the " + std::to_string(t.extent->max_size) + " bytes its GGUF header gives";
    return 0;
  }
  if (const auto& cap = t.request->max_size; cap && t.offset + bytes > cap->bytes) {
    t.refusal = "it grew past " + cap->what;
    return 0;
  }
  size_t written = 0;
  while (written < bytes) {
    const ssize_t n = ::write(t.fd, data + written, bytes - written);
    if (n < 0) {
      if (errno == EINTR) continue;
      t.write_errno = errno;
      // What did reach the file is still hashed, so that the offset and the
      // hash agree.
      t.hash->update(data, written);
      t.offset += written;
      return 0;
    }
    written += static_cast<size_t>(n);
  }
  t.hash->update(data, bytes);
  t.offset += bytes;
  if (!t.probe_header()) return 0;
  if (t.request->on_progress) t.request->on_progress(t.offset, t.total);
  return bytes;
}

std::string size_text(uint64_t n) { return std::to_string(n) + " bytes"; }

// libcurl calls this about once a second even while no bytes arrive, so a
// stalled transfer still notices an interruption.
int on_transfer_info(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto& t = *static_cast<Transfer*>(user);
  return t.request->interrupted && t.request->interrupted() ? 1 : 0;
}

}  // namespace

bool is_public_address(const sockaddr& address) {
  if (address.sa_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    return public_ipv4(reinterpret_cast<const uint8_t*>(&in.sin_addr.s_addr));
  }
  if (address.sa_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
    return public_ipv6(in6.sin6_addr.s6_addr);
  }
  return false;
}

std::string address_text(const sockaddr& address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, text, sizeof text);
  } else if (address.sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(address).sin6_addr, text, sizeof text);
  }
  return text;
}

std::filesystem::path partial_record_path(const std::filesystem::path& partial) {
  return partial.string() + ".json";
}

std::optional<PartialRecord> read_partial_record(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const auto j = nlohmann::json::parse(in);
    PartialRecord r;
    r.url = j.at("url").get<std::string>();
    r.etag = j.value("etag", "");
    r.last_modified = j.value("last_modified", "");
    if (j.contains("size") && j["size"].is_number_unsigned()) r.size = j["size"].get<uint64_t>();
    return r;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool write_partial_record(const std::filesystem::path& path, const PartialRecord& r) {
  nlohmann::ordered_json j;
  j["url"] = r.url;
  if (!r.etag.empty()) j["etag"] = r.etag;
  if (!r.last_modified.empty()) j["last_modified"] = r.last_modified;
  if (r.size) j["size"] = *r.size;
  errno = 0;
  std::ofstream out(path, std::ios::trunc);
  out << j.dump(2) << '\n';
  out.flush();
  return static_cast<bool>(out);
}

std::string http_get_text(const std::string& url, const std::map<std::string, std::string>& headers,
                          std::string* link_header, const RequestPolicy& policy) {
  Easy easy;
  easy.setup(url, headers);
  easy.check_addresses(policy.address_allowed);
  if (policy.interrupted) {
    curl_easy_setopt(easy.get(), CURLOPT_XFERINFOFUNCTION, poll_interrupted);
    curl_easy_setopt(easy.get(), CURLOPT_XFERINFODATA, &policy.interrupted);
    curl_easy_setopt(easy.get(), CURLOPT_NOPROGRESS, 0L);
  }
  std::string body;
  curl_easy_setopt(easy.get(), CURLOPT_WRITEFUNCTION, append_to_string);
  curl_easy_setopt(easy.get(), CURLOPT_WRITEDATA, &body);
  std::string link;
  if (link_header != nullptr) {
    curl_easy_setopt(easy.get(), CURLOPT_HEADERFUNCTION, keep_link_header);
    curl_easy_setopt(easy.get(), CURLOPT_HEADERDATA, &link);
  }
  const CURLcode code = curl_easy_perform(easy.get());
  if (policy.interrupted && policy.interrupted()) throw InterruptedError("interrupted");
  easy.throw_if_refused();
  if (code != CURLE_OK) throw_transfer_error(url, code, easy.message(code));
  if (easy.status() >= 400) throw status_error(url, easy.status());
  if (link_header != nullptr) *link_header = link;
  return body;
}

LockedPartial::LockedPartial(const std::filesystem::path& path)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
  if (fd_ < 0) throw DiskError("cannot create " + path.string() + ": " + std::strerror(errno), errno);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    throw BusyError("another pull is already writing " + path.string() + "; wait for it to finish");
  }
}

LockedPartial::~LockedPartial() { ::close(fd_); }

DownloadResult download_file(const DownloadRequest& request) {
  std::optional<LockedPartial> own_lock;
  const int fd = request.locked != nullptr ? request.locked->fd() : own_lock.emplace(request.partial).fd();

  Sha256 hash;
  Transfer t;
  t.request = &request;
  t.fd = fd;
  t.hash = &hash;
  // What an earlier, interrupted pull left is kept and hashed: the download
  // resumes after it, but only when the record beside it says it is the
  // start of this URL's file and names a validator the server can check
  // (If-Range): otherwise the bytes may be another file's, and it starts over.
  const auto record = read_partial_record(partial_record_path(request.partial));
  const bool resumable = record && record->url == request.url && !if_range_value(*record).empty();
  if (resumable) t.record = *record;
  t.offset = hash_file_into(hash, request.partial);
  if (::lseek(fd, static_cast<off_t>(t.offset), SEEK_SET) < 0) {
    throw DiskError("cannot seek in " + request.partial.string() + ": " + std::strerror(errno), errno);
  }
  const bool too_long = (request.expected_size && t.offset > *request.expected_size) ||
                        (t.record.size && t.offset > *t.record.size);
  if (t.offset > 0 && (!resumable || too_long)) {
    if (request.on_notice && !resumable) {
      request.on_notice("the partial download is not known to be this file; starting it over");
    }
    if (!t.restart_from_zero()) {
      throw DiskError("cannot truncate " + request.partial.string() + ": " + std::strerror(t.write_errno), t.write_errno);
    }
  }
  DownloadResult result;
  result.resumed_from = t.offset;
  t.total = request.expected_size;

  const bool complete_already = request.expected_size && t.offset == *request.expected_size && t.offset > 0;
  bool received_any = false;
  for (int attempt = 1; !complete_already; ++attempt) {
    Easy easy;
    t.easy = &easy;
    t.begin_attempt();
    easy.setup(request.url, request.headers);
    easy.check_addresses(request.address_allowed);
    curl_easy_setopt(easy.get(), CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(easy.get(), CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(easy.get(), CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(easy.get(), CURLOPT_WRITEDATA, &t);
    if (request.interrupted) {
      curl_easy_setopt(easy.get(), CURLOPT_XFERINFOFUNCTION, on_transfer_info);
      curl_easy_setopt(easy.get(), CURLOPT_XFERINFODATA, &t);
      curl_easy_setopt(easy.get(), CURLOPT_NOPROGRESS, 0L);
    }
    const std::string range = std::to_string(t.offset) + "-";
    if (t.offset > 0) {
      curl_easy_setopt(easy.get(), CURLOPT_RANGE, range.c_str());
      // A file that changed since the partial one began comes back whole.
      const std::string validator = if_range_value(t.record);
      if (!validator.empty()) easy.add_header("If-Range: " + validator);
    }
    const uint64_t offset_before = t.offset;
    const CURLcode code = curl_easy_perform(easy.get());
    if (t.offset > offset_before) received_any = true;
    if (request.interrupted && request.interrupted()) {
      throw InterruptedError("interrupted; " + size_text(t.offset) + " kept in " + request.partial.string() +
                             ", pull again to resume");
    }
    easy.throw_if_refused();
    if (!t.refusal.empty()) throw DownloadRefusedError("refusing the download of " + request.url + ": " + t.refusal);
    if (t.write_errno != 0) {
      throw DiskError("cannot write " + request.partial.string() + ": " + std::strerror(t.write_errno), t.write_errno);
    }
    const long status = t.started ? t.status : easy.status();
    if (t.bad_range || (status == 416 && t.offset > 0 && !(request.expected_size && t.offset == *request.expected_size))) {
      // The server answered another range than asked, or none fits what we
      // hold: start over.
      if (!t.restart_from_zero()) {
        throw DiskError("cannot truncate " + request.partial.string() + ": " + std::strerror(t.write_errno), t.write_errno);
      }
      if (attempt >= request.max_attempts) throw NetworkError("the server at " + host_of(request.url) + " cannot resume downloads correctly");
      continue;
    }
    if (status == 416) break;  // we hold the whole file already
    if (status >= 400) throw status_error(request.url, status);
    if (code == CURLE_OK) {
      // A response that arrived whole by its own length is all the server
      // has: a size unlike the expected one is the caller's to refuse as
      // corrupt, not a reason to ask for bytes past its end.
      if (t.length_known && t.total && t.offset >= *t.total) break;
      const std::optional<uint64_t> want = request.expected_size ? request.expected_size : t.total;
      if (!want || t.offset >= *want) break;
      // The server ended the response early without an error: resume.
    } else if (!is_transient(code) || (is_connect_error(code) && !received_any)) {
      throw_transfer_error(request.url, code, easy.message(code));
    }
    const std::string why = code == CURLE_OK ? std::string("the connection closed early") : easy.message(code);
    if (attempt >= request.max_attempts) {
      throw NetworkError("download from " + host_of(request.url) + " failed after " + std::to_string(attempt) +
                         " attempts: " + why + "; " + size_text(t.offset) + " kept in " + request.partial.string() +
                         ", pull again to resume");
    }
    if (request.on_notice) {
      request.on_notice("connection lost at " + size_text(t.offset) + " (" + why + "); resuming, attempt " +
                        std::to_string(attempt + 1) + " of " + std::to_string(request.max_attempts));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(request.retry_delay_s * attempt));
  }
  if (::fsync(fd) != 0 && errno != EINVAL) {
    throw DiskError("cannot write " + request.partial.string() + ": " + std::strerror(errno), errno);
  }
  result.size = t.offset;
  result.sha256 = hash.hex_digest();
  result.linked_sha256 = t.linked_sha256;
  return result;
}

}  // namespace m40::store
