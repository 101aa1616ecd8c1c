// Owning device allocations and the arena the weights live in. Every
// allocation is checked; an arena is sized from the memory plan up front so a
// model that does not fit is refused before anything is uploaded.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "backends/cuda/cuda_check.h"

namespace m40::cuda {

// One cudaMalloc'd block of `bytes`, freed with the object.
class DeviceAllocation {
 public:
  DeviceAllocation() = default;
  explicit DeviceAllocation(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) M40_CUDA_CHECK(cudaMalloc(&data_, bytes));
  }
  ~DeviceAllocation() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceAllocation(DeviceAllocation&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  DeviceAllocation& operator=(DeviceAllocation&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T> T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory: the staging area for uploads and the landing place
// of logits, so copies are true DMA transfers that can be asynchronous.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) M40_CUDA_CHECK(cudaMallocHost(&data_, bytes));
  }
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), bytes_(o.bytes_) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <class T> T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Hands out aligned slices of one allocation, in order.
class Arena {
 public:
  static constexpr size_t kAlignment = 256;
  static size_t aligned(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  Arena() = default;
  explicit Arena(size_t bytes) : memory_(bytes) {}
  void* take(size_t bytes);
  size_t used() const { return used_; }
  size_t capacity() const { return memory_.bytes(); }

 private:
  DeviceAllocation memory_;
  size_t used_ = 0;
};

}  // namespace m40::cuda
