// SHA-256 through OpenSSL's EVP interface: streaming, and of whole files.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

namespace m40::store {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void reset();
  void update(const void* data, size_t size);
  // Lower-case hex of the digest; the object is reset afterwards.
  std::string hex_digest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hashes a file; throws m40::Error if it cannot be read.
std::string sha256_file(const std::filesystem::path& path);
// Feeds a file's bytes into `hash`; returns the number of bytes read.
uint64_t hash_file_into(Sha256& hash, const std::filesystem::path& path);

bool is_sha256_hex(const std::string& text);

}  // namespace m40::store
