// The options that say where a model runs (--cpu, --gpu, --gpus,
// --tensor-split, --split-mode, --gpu-layers, --vram), one table for run,
// bench and serve.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "engine/backend_factory.h"

namespace m40::cli {

struct DeviceFlags {
  bool cpu = false;
  int gpu = -1;
  std::vector<int> gpus;
  std::vector<double> tensor_split;
  std::string split_mode = "auto";
  int gpu_layers = -1;
  std::string vram;
};

void add_device_flags(CLI::App* cmd, DeviceFlags& flags);

// The flags in `bo` (--vram and --split-mode parsed; m40::Error for a bad one).
void apply_device_flags(const DeviceFlags& flags, engine::BackendOptions& bo);

}  // namespace m40::cli
