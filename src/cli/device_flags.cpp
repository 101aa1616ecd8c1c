#include "cli/device_flags.h"

#include "common/memory_size.h"

namespace m40::cli {

void add_device_flags(CLI::App* cmd, DeviceFlags& flags) {
  cmd->add_flag("--cpu", flags.cpu, "Use the CPU backend even when a GPU is present");
  cmd->add_option("--gpu", flags.gpu, "GPU index (default: $M40_LLM_DEVICE, else 0)");
  cmd->add_option("--gpus", flags.gpus,
                  "GPUs a model that does not fit one may be split over, in order, e.g. 0,1 (default: every GPU, "
                  "--gpu's first)")
      ->delimiter(',');
  cmd->add_option("--tensor-split", flags.tensor_split,
                  "Split the model over the GPUs of --gpus in these proportions, e.g. 3,1")
      ->delimiter(',');
  cmd->add_option("--split-mode", flags.split_mode,
                  "How a model is split over GPUs: layer (each GPU runs some of the layers, one after another; "
                  "the only mode that also offloads to the CPU), row (every layer's matrices divided over all of "
                  "--gpus, which read their shares at once; used whether or not the model fits one GPU) or auto "
                  "(a model split over the GPUs is divided by rows where it can be and fits them, else by layers)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "layer", "row"}));
  cmd->add_option("--gpu-layers,--ngl", flags.gpu_layers,
                  "Layers on the GPU: the last N and the output head there, the rest on the CPU (default: all when "
                  "the model fits, else as many as fit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--vram", flags.vram, "Cap the GPU memory a model may use on each GPU, e.g. 24G to plan as on a Tesla M40");
}

void apply_device_flags(const DeviceFlags& flags, engine::BackendOptions& bo) {
  bo.force_cpu = flags.cpu;
  bo.gpu = flags.gpu;
  bo.gpus = flags.gpus;
  bo.tensor_split = flags.tensor_split;
  bo.split_mode = engine::split_mode_from_name(flags.split_mode);
  bo.gpu_layers = flags.gpu_layers;
  if (!flags.vram.empty()) bo.vram_budget = parse_memory_size(flags.vram);
}

}  // namespace m40::cli
