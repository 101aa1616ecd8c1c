#include "backends/cuda/device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <string>

#include "backends/cuda/cuda_check.h"
#include "common/error.h"

namespace m40::cuda {

namespace {

void require_device(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) {
    throw Error("there is no CUDA device " + std::to_string(index) + ": this machine has " +
                std::to_string(count) + (count == 1 ? " device" : " devices") +
                (count > 0 ? " (0.." + std::to_string(count - 1) + ")" : ""));
  }
}

// An attribute the driver may not report on every GPU (memory clock): 0 then.
int optional_attribute(cudaDeviceAttr attribute, int index) {
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attribute, index) != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the failure for the next check
    return 0;
  }
  return value;
}

}  // namespace

std::string DeviceInfo::compute_capability() const {
  return std::to_string(compute_capability_major) + "." + std::to_string(compute_capability_minor);
}

double DeviceInfo::peak_memory_bandwidth_gb_per_s() const {
  return 2.0 * memory_clock_khz * 1e3 * (memory_bus_width_bits / 8.0) / 1e9;
}

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

DeviceInfo device_info(int index) {
  require_device(index);
  DeviceInfo info;
  info.index = index;
  cudaDeviceProp properties{};
  M40_CUDA_CHECK(cudaGetDeviceProperties(&properties, index));
  info.name = properties.name;
  info.compute_capability_major = properties.major;
  info.compute_capability_minor = properties.minor;
  info.total_memory_bytes = properties.totalGlobalMem;
  M40_CUDA_CHECK(cudaDeviceGetAttribute(&info.multiprocessor_count, cudaDevAttrMultiProcessorCount, index));
  info.memory_bus_width_bits = optional_attribute(cudaDevAttrGlobalMemoryBusWidth, index);
  info.memory_clock_khz = optional_attribute(cudaDevAttrMemoryClockRate, index);

  // Free memory is per context: ask on the device, then restore the caller's.
  int previous = 0;
  M40_CUDA_CHECK(cudaGetDevice(&previous));
  M40_CUDA_CHECK(cudaSetDevice(index));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  const cudaError_t status = cudaMemGetInfo(&free_bytes, &total_bytes);
  M40_CUDA_CHECK(cudaSetDevice(previous));
  M40_CUDA_CHECK(status);
  info.free_memory_bytes = free_bytes;
  return info;
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> devices;
  const int count = device_count();
  for (int index = 0; index < count; ++index) devices.push_back(device_info(index));
  return devices;
}

void select_device(int index) {
  require_device(index);
  M40_CUDA_CHECK(cudaSetDevice(index));
}

int once_per_device(std::atomic<int> (&known)[64], int (*ask)(int device)) {
  int device = 0;
  M40_CUDA_CHECK(cudaGetDevice(&device));
  int value = device >= 0 && device < 64 ? known[device].load() : 0;
  if (value == 0) {
    value = std::max(1, ask(device));
    if (device >= 0 && device < 64) known[device] = value;
  }
  return value;
}

int current_multiprocessor_count() {
  static std::atomic<int> known[64];
  return once_per_device(known, [](int device) {
    int count = 0;
    M40_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  });
}

}  // namespace m40::cuda
