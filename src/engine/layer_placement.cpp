#include "engine/layer_placement.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "common/error.h"
#include "model/model_summary.h"

namespace m40::engine {

int layers_that_fit(int max_layers, const std::function<uint64_t(int)>& bytes, uint64_t available) {
  // The plan grows with the layers: the largest count that fits, by halving.
  int fits = 0, over = max_layers + 1;
  while (over - fits > 1) {
    const int count = fits + (over - fits) / 2;
    if (bytes(count) <= available) {
      fits = count;
    } else {
      over = count;
    }
  }
  return fits;
}

namespace {

// The last `gpu_layers` of n_layer layers over the GPUs in proportion to
// `weights` (largest remainders), each GPU's share after the previous one's.
std::vector<PlacedStage> divide(int n_layer, int gpu_layers, const std::vector<double>& weights) {
  for (double w : weights) {
    if (!(w >= 0.0)) throw Error("a GPU's share of the layers cannot be negative");
  }
  const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
  if (!(total > 0.0)) throw Error("the split of the layers over the GPUs needs a positive share");
  std::vector<int> counts(weights.size());
  std::vector<std::pair<double, size_t>> remainders;
  int given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = gpu_layers * weights[i] / total;
    counts[i] = static_cast<int>(exact);
    given += counts[i];
    remainders.push_back({exact - counts[i], i});
  }
  std::stable_sort(remainders.begin(), remainders.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t r = 0; given < gpu_layers; ++r, ++given) ++counts[remainders[r % remainders.size()].second];
  std::vector<PlacedStage> stages;
  int first = n_layer - gpu_layers;
  if (first > 0) stages.push_back({-1, {0, first}});
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] == 0) continue;
    stages.push_back({static_cast<int>(i), {first, first + counts[i]}});
    first += counts[i];
  }
  return stages;
}

}  // namespace

std::vector<PlacedStage> place_layers(int n_layer, int gpu_layers, const std::vector<uint64_t>& available,
                                      const std::vector<double>& split, const GpuStageBytes& gpu_bytes) {
  if (n_layer <= 0) throw Error("a model without layers cannot be placed");
  if (!split.empty() && split.size() != available.size()) {
    throw Error("the split names " + std::to_string(split.size()) + " shares for " + std::to_string(available.size()) +
                " GPUs");
  }
  if (split.empty() && gpu_layers < 0) {
    std::vector<PlacedStage> stages;
    int end = n_layer;
    for (int gpu = static_cast<int>(available.size()) - 1; gpu >= 0 && end > 0; --gpu) {
      const int count = layers_that_fit(
          end, [&](int c) { return gpu_bytes(gpu, backend::LayerRange{end - c, end}); }, available[static_cast<size_t>(gpu)]);
      if (count == 0) continue;
      stages.insert(stages.begin(), {gpu, {end - count, end}});
      end -= count;
    }
    if (end > 0) stages.insert(stages.begin(), {-1, {0, end}});
    return stages;
  }
  const int on_gpus = gpu_layers < 0 ? n_layer : std::min(gpu_layers, n_layer);
  if (on_gpus == 0 || available.empty()) return {{-1, {0, n_layer}}};
  std::vector<double> weights = split;
  if (weights.empty()) {
    for (uint64_t a : available) weights.push_back(static_cast<double>(a));
  }
  return divide(n_layer, on_gpus, weights);
}

namespace {
std::string layers_text(backend::LayerRange r) {
  return r.size() == 1 ? "layer " + std::to_string(r.first)
                       : "layers " + std::to_string(r.first) + "-" + std::to_string(r.end - 1);
}
}  // namespace

std::string describe_placement(const std::vector<PlacedStage>& stages, int n_layer, const std::vector<int>& devices) {
  std::string out;
  for (const PlacedStage& s : stages) {
    if (!out.empty()) out += ", ";
    out += layers_text(s.layers);
    if (s.layers.end == n_layer) out += " and the output head";
    out += s.gpu < 0 ? " on the CPU" : " on GPU " + std::to_string(devices.at(static_cast<size_t>(s.gpu)));
  }
  return out;
}

std::string describe_decode_reads(const std::vector<PlacedStage>& stages, const std::vector<uint64_t>& bytes,
                                  const std::vector<double>& gpu_gb_per_s, const std::vector<int>& devices,
                                  bool at_once) {
  std::string out = "a decode token reads ";
  double gpu_seconds = 0.0;
  bool cpu_part = false, bandwidth_known = true;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (i > 0) out += i + 1 == stages.size() ? " and " : ", ";
    out += model::format_bytes(bytes.at(i));
    const int gpu = stages[i].gpu;
    if (gpu < 0) {
      out += " on the CPU";
      cpu_part = true;
      continue;
    }
    out += " on GPU " + std::to_string(devices.at(static_cast<size_t>(gpu)));
    const double gb_per_s = gpu_gb_per_s.at(static_cast<size_t>(gpu));
    if (gb_per_s <= 0.0) {
      bandwidth_known = false;
      continue;
    }
    const double seconds = static_cast<double>(bytes[i]) / (gb_per_s * 1e9);
    gpu_seconds = at_once ? std::max(gpu_seconds, seconds) : gpu_seconds + seconds;
    char part[64];
    std::snprintf(part, sizeof part, " (%.1f ms at %.0f GB/s)", seconds * 1e3, gb_per_s);
    out += part;
  }
  if (bandwidth_known && gpu_seconds > 0.0) {
    char bound[96];
    std::snprintf(bound, sizeof bound, ": at most %.0f tokens/s", 1.0 / gpu_seconds);
    out += bound;
    if (cpu_part) out += ", less the CPU's part at its memory bandwidth";
  }
  return out;
}

}  // namespace m40::engine
