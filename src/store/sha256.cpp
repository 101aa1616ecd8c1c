#include "store/sha256.h"

#include <openssl/evp.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include "common/error.h"

namespace m40::store {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr) throw Error("cannot allocate a SHA-256 context");
  reset();
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::reset() {
  if (EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) throw Error("cannot start SHA-256");
}

void Sha256::update(const void* data, size_t size) {
  if (size > 0 && EVP_DigestUpdate(impl_->ctx, data, size) != 1) throw Error("SHA-256 update failed");
}

std::string Sha256::hex_digest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, digest, &length) != 1) throw Error("SHA-256 final failed");
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  reset();
  return out;
}

uint64_t hash_file_into(Sha256& hash, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path.string() + ": " + std::strerror(errno));
  std::vector<char> buffer(1 << 20);
  uint64_t total = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto got = static_cast<size_t>(in.gcount());
    hash.update(buffer.data(), got);
    total += got;
  }
  if (in.bad()) throw Error("cannot read " + path.string());
  return total;
}

std::string sha256_file(const std::filesystem::path& path) {
  Sha256 hash;
  hash_file_into(hash, path);
  return hash.hex_digest();
}

bool is_sha256_hex(const std::string& text) {
  if (text.size() != 64) return false;
  for (char c : text) {
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

}  // namespace m40::store
