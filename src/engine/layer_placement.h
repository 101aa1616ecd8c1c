// Where a model's layers run when the GPU cannot hold them all (llama.cpp's
// -ngl, Ollama's num_gpu): the last gpu_layers layers and the output head
// on the GPU, the first ones on the CPU, which reads them from the file's
// mapping (backends/pipeline: a CPU stage, then a CUDA stage).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace m40::engine {

// The most of a model's last layers, at most n_layer, whose GPU memory
// `gpu_bytes(g)` (what a stage of the last g layers needs; it grows with g)
// fits in `available`; 0 when not even one layer does.
int gpu_layers_that_fit(int n_layer, const std::function<uint64_t(int)>& gpu_bytes, uint64_t available);

// What runs where, for a message: "layers 0-9 on the CPU, layers 10-31 and
// the output head on GPU 0".
std::string describe_offload(int n_layer, int gpu_layers, int gpu);

}  // namespace m40::engine
