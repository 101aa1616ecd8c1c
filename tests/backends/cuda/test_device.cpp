// Device listing and selection, with or without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "backends/cuda/device.h"
#include "common/error.h"

namespace m40::cuda {
namespace {

TEST(Devices, CountingNeverThrows) {
  EXPECT_GE(device_count(), 0);
}

TEST(Devices, SelectingAMissingDeviceIsAClearError) {
  try {
    select_device(device_count());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("there is no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_THROW(select_device(-1), Error);
  EXPECT_THROW(device_info(device_count()), Error);
}

TEST(Devices, EachDeviceDescribesItself) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::vector<DeviceInfo> devices = list_devices();
  ASSERT_EQ(static_cast<int>(devices.size()), device_count());
  for (const DeviceInfo& d : devices) {
    SCOPED_TRACE(d.name);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_capability_major * 10 + d.compute_capability_minor, 52);
    EXPECT_GT(d.total_memory_bytes, 0u);
    EXPECT_GT(d.free_memory_bytes, 0u);
    EXPECT_LE(d.free_memory_bytes, d.total_memory_bytes);
    EXPECT_GT(d.multiprocessor_count, 0);
    EXPECT_GE(d.peak_memory_bandwidth_gb_per_s(), 0.0);
    std::printf("  device %d: %s, compute %s, %d SMs, %.1f / %.1f GiB free, %d-bit bus, %.0f GB/s peak\n",
                d.index, d.name.c_str(), d.compute_capability().c_str(), d.multiprocessor_count,
                static_cast<double>(d.free_memory_bytes) / (1 << 30),
                static_cast<double>(d.total_memory_bytes) / (1 << 30), d.memory_bus_width_bits,
                d.peak_memory_bandwidth_gb_per_s());
  }
  EXPECT_NO_THROW(select_device(0));
}

TEST(Devices, PeakBandwidthOfATeslaM40) {
  DeviceInfo m40;
  m40.memory_clock_khz = 3004000;
  m40.memory_bus_width_bits = 384;
  EXPECT_NEAR(m40.peak_memory_bandwidth_gb_per_s(), 288.4, 0.1);
}

}  // namespace
}  // namespace m40::cuda
