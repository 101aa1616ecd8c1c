// The GPUs this process can see: what each one is, and which one is current.
// Plain C++ (no CUDA headers), so that the CLI can print it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace m40::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  int multiprocessor_count = 0;
  int memory_bus_width_bits = 0;  // 0 where the driver does not say
  int memory_clock_khz = 0;       // 0 where the driver does not say

  std::string compute_capability() const;  // "5.2"
  // Theoretical DRAM bandwidth: two transfers per memory clock over the bus
  // (the Tesla M40: 3.0 GHz x 384 bits -> 288 GB/s); 0 when unknown.
  double peak_memory_bandwidth_gb_per_s() const;
};

// How many CUDA devices there are; 0 when there is no GPU or no usable driver.
// Never throws, so callers can fall back to the CPU.
int device_count();

// Every device, in CUDA's order. Creates a context on each to read its free
// memory.
std::vector<DeviceInfo> list_devices();

// One device; throws m40::Error for an index that does not exist.
DeviceInfo device_info(int index);

// Makes `index` the current device of the calling thread; throws m40::Error
// for an index that does not exist.
void select_device(int index);

// The multiprocessor count of the calling thread's current device, asked
// once per device (kernel launchers size their grids by it on every call).
int current_multiprocessor_count();

// From this many SMs on (an H100 or H200: 132; an M40 has 24) a product of
// a few dozen tokens leaves most SMs idle in the prefill tiles, and the
// kernel choices that fill them (matmul, the MoE work items) differ.
inline constexpr int kManyMultiprocessors = 64;

// A positive value of the calling thread's current device that `ask()`
// gives, asked once per device and kept in `known` (one slot per device
// index below 64, 0 while not asked; devices past 64 are asked every time).
int once_per_device(std::atomic<int> (&known)[64], int (*ask)(int device));

}  // namespace m40::cuda
