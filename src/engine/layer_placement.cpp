#include "engine/layer_placement.h"

namespace m40::engine {

int gpu_layers_that_fit(int n_layer, const std::function<uint64_t(int)>& gpu_bytes, uint64_t available) {
  // The plan grows with the layers: the largest count that fits, by halving.
  int fits = 0, over = n_layer + 1;
  while (over - fits > 1) {
    const int g = fits + (over - fits) / 2;
    if (gpu_bytes(g) <= available) {
      fits = g;
    } else {
      over = g;
    }
  }
  return fits;
}

namespace {
std::string layers_text(int first, int last) {
  return first == last ? "layer " + std::to_string(first) : "layers " + std::to_string(first) + "-" + std::to_string(last);
}
}  // namespace

std::string describe_offload(int n_layer, int gpu_layers, int gpu) {
  const std::string on_gpu = " on GPU " + std::to_string(gpu);
  if (gpu_layers <= 0) return "every layer on the CPU";
  if (gpu_layers >= n_layer) return "every layer" + on_gpu;
  const int first_gpu = n_layer - gpu_layers;
  return layers_text(0, first_gpu - 1) + " on the CPU, " + layers_text(first_gpu, n_layer - 1) + " and the output head" +
         on_gpu;
}

}  // namespace m40::engine
