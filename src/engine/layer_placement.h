// Where a model's layers run when one GPU cannot hold them all (llama.cpp's
// -ngl and --tensor-split, Ollama's spreading over GPUs): a chain of stages
// (backends/pipeline), the first layers on the CPU where the GPUs cannot
// hold every layer, then the GPUs in their list's order, the last of them
// holding the last layer and the output head.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backends/backend.h"

namespace m40::engine {

// The most layers, at most max_layers, whose memory `bytes(count)` (growing
// with the count) fits in `available`; 0 when not even one does.
int layers_that_fit(int max_layers, const std::function<uint64_t(int)>& bytes, uint64_t available);

// One stage: the GPU of the list it runs on (its index there; -1: the CPU)
// and its layers.
struct PlacedStage {
  int gpu = -1;
  backend::LayerRange layers;
  bool operator==(const PlacedStage&) const = default;
};

// What GPU `gpu` (an index into the list) needs for a stage of `layers`.
using GpuStageBytes = std::function<uint64_t(int gpu, backend::LayerRange layers)>;

// Where the n_layer layers run over the GPUs whose budgets `available`
// lists and the CPU:
//  - `split` empty and gpu_layers < 0: as many layers as fit, filled from
//    the last GPU of the list backwards (each takes the longest run of the
//    remaining last layers its budget holds), the rest on the CPU;
//  - else the last gpu_layers layers (all where gpu_layers < 0 or above
//    n_layer) divided over the GPUs in the proportions of `split` (default:
//    their budgets), the first ones on the CPU; these stages are not
//    checked against the budgets (each GPU's plan says whether it fits).
// Stages come in layer order; a GPU with no layers gets no stage.
std::vector<PlacedStage> place_layers(int n_layer, int gpu_layers, const std::vector<uint64_t>& available,
                                      const std::vector<double>& split, const GpuStageBytes& gpu_bytes);

// What runs where, for a message: "layers 0-9 on the CPU, layers 10-31 and
// the output head on GPU 1", naming each GPU by `devices`[its index].
std::string describe_placement(const std::vector<PlacedStage>& stages, int n_layer, const std::vector<int>& devices);

// The expected decode speed, for a message: the bytes of weights each stage
// reads per token (`bytes`, one per stage) and, from each GPU's memory
// bandwidth (`gpu_gb_per_s`, by the GPU's index; 0 where unknown), the
// time its part takes and the speed the GPUs' parts allow: "a decode token
// reads 1.20 GB on the CPU and 3.10 GB on GPU 0 (10.8 ms at 288 GB/s): at
// most 92 tokens/s, less the CPU's part at its memory bandwidth". With
// `at_once` the GPUs read their parts at the same time (a row split: the
// slowest part bounds the speed) instead of one after another.
std::string describe_decode_reads(const std::vector<PlacedStage>& stages, const std::vector<uint64_t>& bytes,
                                  const std::vector<double>& gpu_gb_per_s, const std::vector<int>& devices,
                                  bool at_once = false);

}  // namespace m40::engine
