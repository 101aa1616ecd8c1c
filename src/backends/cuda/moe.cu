// moe.h: routing, grouping by expert, gathering and combining. The grouped
// products themselves are matmul's (grouped_matmul).
#include "backends/cuda/moe.h"

#include <algorithm>
#include <string>
#include <type_traits>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/grid_size.h"
#include "backends/cuda/rms_scale.cuh"
#include "backends/cuda/warp_reduce.cuh"
#include "common/error.h"

namespace m40::cuda {

namespace {

constexpr int kRouteWarps = 4;  // tokens per block of the routing kernel
// The smallest normal FP16: llama.cpp clamps the chosen probabilities' sum
// below by it before dividing.
constexpr float kMinWeightSum = 6.103515625e-5f;

// The most experts a lane holds: routers of up to 128 experts take the
// 4-register variant, larger ones (up to kMaxExperts) the 32-register one.
constexpr int kFewExpertsPerLane = 4;
constexpr int kManyExpertsPerLane = kMaxExperts / kWarpSize;

// One warp routes token t: the softmax of its logits, with lane l holding
// the probabilities of experts l, l + 32, ... in registers (kPerLane of
// them, n_expert <= 32 kPerLane), then k rounds of a warp argmax (the higher
// probability, then the lower index), each winner marked -1 by its lane
// (probabilities are >= 0; lanes' slots past n_expert hold -3, below any
// round's start) so that the next round skips it. Lane 0 writes each round's
// expert to ids (and staged_ids where given: the block's shared copy).
template <int kPerLane>
__device__ void route_token(const float* __restrict__ logits, int t, int n_expert, int k, bool renormalize,
                            int32_t* __restrict__ ids, float* __restrict__ weights, int32_t* staged_ids) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const float* row = logits + static_cast<size_t>(t) * n_expert;
  float p[kPerLane];
  float max = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + j * kWarpSize;
    p[j] = e < n_expert ? __ldg(row + e) : -INFINITY;
    max = fmaxf(max, p[j]);
  }
  max = warp_max(max);
  float sum = 0.0f;  // each lane in expert order, then across the warp
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    p[j] = lane + j * kWarpSize < n_expert ? expf(p[j] - max) : 0.0f;
    sum += p[j];
  }
  const float inv = 1.0f / warp_sum(sum);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) p[j] = lane + j * kWarpSize < n_expert ? p[j] * inv : -3.0f;

  float chosen_sum = 0.0f;
  float my_prob = 0.0f;  // lane s < k keeps slot s's probability
  for (int s = 0; s < k; ++s) {
    float best = -2.0f;
    int best_e = n_expert;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (p[j] > best) best = p[j], best_e = lane + j * kWarpSize;  // ascending e: ties keep the lower index
    }
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullWarpMask, best, offset);
      const int other_e = __shfl_xor_sync(kFullWarpMask, best_e, offset);
      if (other > best || (other == best && other_e < best_e)) best = other, best_e = other_e;
    }
    chosen_sum += best;  // in slot order, as the CPU adds them
    if (lane == s) my_prob = best;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + j * kWarpSize == best_e) p[j] = -1.0f;
    }
    if (lane == 0) {
      ids[static_cast<size_t>(t) * k + s] = best_e;
      if (staged_ids != nullptr) staged_ids[t * k + s] = best_e;
      // Slots past the warp's lanes: their probability waits in memory.
      if (s >= kWarpSize) weights[static_cast<size_t>(t) * k + s] = best;
    }
  }
  __syncwarp();  // lane 0's writes of the slots past 32
  const float inv_chosen = renormalize ? 1.0f / fmaxf(chosen_sum, kMinWeightSum) : 1.0f;
  for (int s = lane; s < k; s += kWarpSize) {
    const float prob = s < kWarpSize ? my_prob : weights[static_cast<size_t>(t) * k + s];
    weights[static_cast<size_t>(t) * k + s] = prob * inv_chosen;
  }
}

template <int kPerLane>
__global__ void route_kernel(const float* __restrict__ logits, int n_tokens, int n_expert, int k, bool renormalize,
                             int32_t* __restrict__ ids, float* __restrict__ weights) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int t = static_cast<int>(blockIdx.x) * kRouteWarps + warp;
  if (t >= n_tokens) return;  // whole warps; no block barrier follows
  route_token<kPerLane>(logits, t, n_expert, k, renormalize, ids, weights, nullptr);
}

// Calls f(std::integral_constant<int, kPerLane>{}) with the register
// variant that holds n_expert probabilities.
template <class F>
void visit_experts_per_lane(int n_expert, F&& f) {
  if (n_expert <= kFewExpertsPerLane * kWarpSize) return f(std::integral_constant<int, kFewExpertsPerLane>{});
  f(std::integral_constant<int, kManyExpertsPerLane>{});
}

// The block's shared ints for the grouping: 3 n_expert + 1.
__host__ __device__ constexpr int group_shared_ints(int n_expert) { return 3 * n_expert + 1; }

// The shared memory a kernel may take without opting in to more.
constexpr size_t kDefaultSharedBytes = 48 * 1024;

// Steps of at most this many slots whose expert ids fit in shared memory
// are grouped one thread per expert (group_few_slots); larger ones one warp
// per expert (group_slots), whose passes take 32 slots at a time.
constexpr int kMaxFewSlots = 64;

// A grouping block's dynamic shared memory: the grouping's ints; then, for
// steps of more than kMaxFewSlots slots, each warp's expert counts where
// they fit (`warp_counts`: group_slots_by_ranges, else group_slots); then
// the step's n_slots expert ids where they fit (stage).
struct GroupShared {
  size_t bytes;
  bool stage;
  int warp_count_ints;  // 0: no per-warp counts
};
GroupShared grouping_shared_memory(int n_expert, int n_slots, int warps) {
  const size_t ints = group_shared_ints(n_expert) * sizeof(int);
  const size_t counts =
      n_slots > kMaxFewSlots ? static_cast<size_t>(warps) * static_cast<size_t>(n_expert) * sizeof(int) : 0;
  const size_t ids = static_cast<size_t>(n_slots) * sizeof(int32_t);
  const int count_ints = static_cast<int>(counts / sizeof(int));
  if (ints + counts + ids <= kDefaultSharedBytes) return GroupShared{ints + counts + ids, true, count_ints};
  if (counts > 0 && ints + counts <= kDefaultSharedBytes) return GroupShared{ints + counts, false, count_ints};
  if (ints + ids <= kDefaultSharedBytes) return GroupShared{ints + ids, true, 0};
  return GroupShared{ints, false, 0};
}

// Copies the slots' experts to `staged` (the block's shared memory) where
// given, and returns what the grouping then reads. `ids` may have been
// written by this block (visible after its barrier).
__device__ __forceinline__ const int32_t* stage_slot_experts(const int32_t* ids, int n_slots, int32_t* staged) {
  if (staged != nullptr) {
    for (int s = static_cast<int>(threadIdx.x); s < n_slots; s += static_cast<int>(blockDim.x)) staged[s] = ids[s];
  }
  __syncthreads();
  return staged != nullptr ? staged : ids;
}

// The first warp turns the experts' slot counts into each expert's first
// sorted row and first work item (first_item[n_expert]: the step's items):
// a chunk of experts per lane, then a shuffle scan. The block's barrier
// follows.
__device__ __forceinline__ void scan_expert_counts(const int* count, int n_expert, int item_tokens, int* first_row, int* first_item) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  if (threadIdx.x >= kWarpSize) return;
  const int chunk = (n_expert + kWarpSize - 1) / kWarpSize;
  const int begin = min(lane * chunk, n_expert), end = min(begin + chunk, n_expert);
  int rows = 0, n_of_items = 0;
  for (int e = begin; e < end; ++e) rows += count[e], n_of_items += (count[e] + item_tokens - 1) / item_tokens;
  int rows_before = rows, items_before = n_of_items;  // inclusive scans, then made exclusive
  for (int offset = 1; offset < kWarpSize; offset *= 2) {
    const int r = __shfl_up_sync(kFullWarpMask, rows_before, offset);
    const int i = __shfl_up_sync(kFullWarpMask, items_before, offset);
    if (lane >= offset) rows_before += r, items_before += i;
  }
  if (lane == kWarpSize - 1) first_item[n_expert] = items_before;
  rows_before -= rows;
  items_before -= n_of_items;
  for (int e = begin; e < end; ++e) {
    first_row[e] = rows_before;
    first_item[e] = items_before;
    rows_before += count[e];
    items_before += (count[e] + item_tokens - 1) / item_tokens;
  }
}

// Marks the grid's items past the step's last (first_item[n_expert]) empty.
__device__ __forceinline__ void mark_spare_items(const int* first_item, int n_expert, int n_items, ExpertItem* __restrict__ items) {
  for (int i = first_item[n_expert] + static_cast<int>(threadIdx.x); i < n_items; i += static_cast<int>(blockDim.x)) {
    items[i] = ExpertItem{-1, 0, 0, 0};
  }
}

// The grouping's ints in the block's shared memory (group_shared_ints):
// count[n_expert], first_row[n_expert], first_item[n_expert + 1].
struct GroupInts {
  int* count;
  int* first_row;
  int* first_item;
};
__device__ __forceinline__ GroupInts group_ints(int* shared, int n_expert) {
  return {shared, shared + n_expert, shared + 2 * n_expert};
}

// After the slots are placed (sorted_slots, visible to the block): each
// expert's rows cut into items of item_tokens, a warp per expert, and the
// grid's spare items marked empty.
__device__ __forceinline__ void cut_items(const int* count, const int* first_row, const int* first_item, int n_expert,
                                          int k, int item_tokens, int n_items, const int32_t* sorted_slots,
                                          ExpertItem* __restrict__ items) {
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  for (int e = warp; e < n_expert; e += n_warps) {
    const int n_of_expert = first_item[e + 1] - first_item[e];
    for (int j = lane; j < n_of_expert; j += kWarpSize) {
      const int index = first_item[e] + j;
      if (index < n_items) {  // always, by max_expert_items
        const int first = first_row[e] + j * item_tokens;
        items[index] = ExpertItem{e, first, min(item_tokens, first_row[e] + count[e] - first), sorted_slots[first] / k};
      }
    }
  }
  mark_spare_items(first_item, n_expert, n_items, items);
}

// The whole block orders the slots by expert (group_by_expert). Counting
// and placing go one expert per warp at a time: a ballot over 32 slots finds
// the expert's slots among them and their order, so the rows keep slot order
// without atomics. `ids` is the slots' experts, in shared memory where they
// fit (stage_slot_experts).
__device__ void group_slots(const int32_t* ids, int n_slots, int n_expert, int k, int item_tokens, int n_items,
                            int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_rows,
                            ExpertItem* __restrict__ items, int* shared) {
  const auto [count, first_row, first_item] = group_ints(shared, n_expert);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;

  for (int e = warp; e < n_expert; e += n_warps) {
    int c = 0;
    // Unrolled 4 times: fully unrolled, the loops made ptxas outline an
    // integer division and spill around its call on sm_52.
#pragma unroll 4
    for (int base = 0; base < n_slots; base += kWarpSize) {
      const int s = base + lane;
      c += __popc(__ballot_sync(kFullWarpMask, s < n_slots && ids[s] == e));
    }
    if (lane == 0) count[e] = c;
  }
  __syncthreads();
  scan_expert_counts(count, n_expert, item_tokens, first_row, first_item);
  __syncthreads();
  for (int e = warp; e < n_expert; e += n_warps) {
    int placed = first_row[e];
#pragma unroll 4
    for (int base = 0; base < n_slots; base += kWarpSize) {
      const int s = base + lane;
      const bool mine = s < n_slots && ids[s] == e;
      const unsigned ballot = __ballot_sync(kFullWarpMask, mine);
      if (mine) {
        const int row = placed + __popc(ballot & ((1u << lane) - 1u));
        sorted_slots[row] = s;
        slot_rows[s] = row;
      }
      placed += __popc(ballot);
    }
  }
  __syncthreads();  // sorted_slots written: the items name their first row's token
  cut_items(count, first_row, first_item, n_expert, k, item_tokens, n_items, sorted_slots, items);
}

// The same order for a large step (a prompt): each warp takes a contiguous
// range of the slots, counts its experts (shared atomics: counts do not
// depend on order), and after the scan places its range's slots in slot
// order from its own offset within each expert's rows (the ranges' offsets
// ascend with the warps, so each expert's rows keep slot order). A slot's
// place among the warp's 32 is the number of lower lanes with its expert (32
// shuffles). About 30x fewer instructions than group_slots' ballot passes,
// which take every slot once per expert. `warp_counts`: [warps][n_expert].
__device__ void group_slots_by_ranges(const int32_t* ids, int n_slots, int n_expert, int k, int item_tokens,
                                      int n_items, int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_rows,
                                      ExpertItem* __restrict__ items, int* shared, int* warp_counts) {
  const auto [count, first_row, first_item] = group_ints(shared, n_expert);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int n_warps = static_cast<int>(blockDim.x) / kWarpSize;
  const int range = (n_slots + n_warps - 1) / n_warps;
  const int begin = min(warp * range, n_slots), end = min(begin + range, n_slots);
  int* my_counts = warp_counts + warp * n_expert;

  for (int i = static_cast<int>(threadIdx.x); i < n_warps * n_expert; i += static_cast<int>(blockDim.x)) warp_counts[i] = 0;
  __syncthreads();
  for (int s = begin + lane; s < end; s += kWarpSize) atomicAdd(&my_counts[ids[s]], 1);
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += static_cast<int>(blockDim.x)) {
    int c = 0;
    for (int w = 0; w < n_warps; ++w) c += warp_counts[w * n_expert + e];
    count[e] = c;
  }
  __syncthreads();
  scan_expert_counts(count, n_expert, item_tokens, first_row, first_item);
  __syncthreads();
  // Each warp's counts become its first row within each expert's rows.
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += static_cast<int>(blockDim.x)) {
    int row = first_row[e];
    for (int w = 0; w < n_warps; ++w) {
      const int c = warp_counts[w * n_expert + e];
      warp_counts[w * n_expert + e] = row;
      row += c;
    }
  }
  __syncthreads();
  for (int base = begin; base < end; base += kWarpSize) {
    const int s = base + lane;
    const int e = s < end ? ids[s] : -1;
    int below = 0, same = 0;  // lanes with this expert: lower ones, all
#pragma unroll 8
    for (int j = 0; j < kWarpSize; ++j) {
      const bool match = __shfl_sync(kFullWarpMask, e, j) == e;
      same += match;
      below += match && j < lane;
    }
    const int row = e >= 0 ? my_counts[e] + below : 0;
    __syncwarp();  // every lane has read its expert's next row
    if (e >= 0) {
      sorted_slots[row] = s;
      slot_rows[s] = row;
      if (below == same - 1) my_counts[e] = row + 1;  // the expert's last lane moves it on
    }
    __syncwarp();
  }
  __syncthreads();  // sorted_slots written: the items name their first row's token
  cut_items(count, first_row, first_item, n_expert, k, item_tokens, n_items, sorted_slots, items);
}

// The same order for a step of few slots (decode), whose experts are in
// shared memory: one thread per expert passes over the slots in slot order,
// counting them, then (after the scan) placing its own and cutting its items
// as it goes. At one token most experts have no slot and the pass is a few
// shared loads: the warp-per-expert loops above cost an H100 14 us here, a
// dependent chain of some 2,000 instructions a warp.
__device__ void group_few_slots(const int32_t* ids, int n_slots, int n_expert, int k, int item_tokens, int n_items,
                                int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_rows,
                                ExpertItem* __restrict__ items, int* shared) {
  const auto [count, first_row, first_item] = group_ints(shared, n_expert);
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += static_cast<int>(blockDim.x)) {
    int c = 0;
    for (int s = 0; s < n_slots; ++s) c += ids[s] == e;
    count[e] = c;
  }
  __syncthreads();
  scan_expert_counts(count, n_expert, item_tokens, first_row, first_item);
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += static_cast<int>(blockDim.x)) {
    const int first = first_row[e], end = first + count[e];
    int row = first;
    for (int s = 0; s < n_slots && row < end; ++s) {
      if (ids[s] != e) continue;
      sorted_slots[row] = s;
      slot_rows[s] = row;
      const int j = row - first;
      const int index = first_item[e] + j / item_tokens;
      if (j % item_tokens == 0 && index < n_items) {  // always, by max_expert_items
        items[index] = ExpertItem{e, row, min(item_tokens, end - row), s / k};
      }
      ++row;
    }
  }
  mark_spare_items(first_item, n_expert, n_items, items);
}

constexpr int kGroupThreads = 512;

__global__ void __launch_bounds__(kGroupThreads)
    group_kernel(const int32_t* __restrict__ ids, int n_slots, int n_expert, int k, int item_tokens, int n_items,
                 bool stage, int warp_count_ints, int32_t* __restrict__ sorted_slots, int32_t* __restrict__ slot_rows,
                 ExpertItem* __restrict__ items) {
  extern __shared__ int group_shared[];
  int* warp_counts = group_shared + group_shared_ints(n_expert);
  int32_t* staged = stage ? warp_counts + warp_count_ints : nullptr;
  const int32_t* slot_experts = stage_slot_experts(ids, n_slots, staged);
  if (warp_count_ints > 0) {
    group_slots_by_ranges(slot_experts, n_slots, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows, items,
                          group_shared, warp_counts);
  } else {
    group_slots(slot_experts, n_slots, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows, items, group_shared);
  }
}

// Small steps (decode): routing and grouping in one block, one launch
// instead of two on the critical path of every layer. 16 warps route a
// token each at a time (32 tokens in two rounds: with 8 warps the routing
// of 32 tokens took most of the kernel's 41 us on an H100), writing the
// chosen experts to the block's shared memory too (beside the grouping's
// ints, where they fit) for the grouping. 512 threads leave 128 registers
// a thread on sm_52.
constexpr int kFusedThreads = 512;
constexpr int kFusedWarps = kFusedThreads / kWarpSize;
static_assert(group_shared_ints(kMaxExperts) * sizeof(int) <= kDefaultSharedBytes,
              "the fused kernel's shared memory fits the default 48 KB");

template <int kPerLane>
__global__ void __launch_bounds__(kFusedThreads)
    route_and_group_kernel(const float* __restrict__ logits, int n_tokens, int n_expert, int k, bool renormalize,
                           int item_tokens, int n_items, bool stage, int warp_count_ints, int32_t* ids,
                           float* __restrict__ weights, int32_t* __restrict__ sorted_slots,
                           int32_t* __restrict__ slot_rows, ExpertItem* __restrict__ items) {
  extern __shared__ int group_shared[];
  int* warp_counts = group_shared + group_shared_ints(n_expert);
  int32_t* staged = stage ? warp_counts + warp_count_ints : nullptr;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  for (int t = warp; t < n_tokens; t += kFusedWarps) {
    route_token<kPerLane>(logits, t, n_expert, k, renormalize, ids, weights, staged);
  }
  __syncthreads();  // ids (and their shared copy) written
  const int n_slots = n_tokens * k;
  if (stage && n_slots <= kMaxFewSlots) {
    group_few_slots(staged, n_slots, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows, items, group_shared);
  } else if (warp_count_ints > 0) {
    group_slots_by_ranges(stage ? staged : ids, n_slots, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows,
                          items, group_shared, warp_counts);
  } else {
    group_slots(stage ? staged : ids, n_slots, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows, items,
                group_shared);
  }
}

__global__ void gather_kernel(const float* __restrict__ x, const int32_t* __restrict__ sorted_slots, int k,
                              int n_slots, int quads, float* __restrict__ out) {
  const int64_t total = int64_t{n_slots} * quads;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / quads;
    const int64_t q = i % quads;
    const int64_t token = __ldg(sorted_slots + r) / k;
    reinterpret_cast<float4*>(out)[i] = __ldg(reinterpret_cast<const float4*>(x) + token * quads + q);
  }
}

// Token t's value j of the combination (combine_experts), its k slots'
// rows and weights given. The slots' loads are independent: unrolled, they
// are in flight together.
__device__ __forceinline__ float combined_value(const float* __restrict__ expert_out, const int32_t* rows,
                                                const float* slot_weights, int k, int n_embd,
                                                const SharedExpertOutput& shared, float shared_scale,
                                                const float* residual, int64_t t, int64_t j) {
  float sum = 0.0f;
#pragma unroll 8
  for (int s = 0; s < k; ++s) {
    const float v = expert_out[int64_t{rows[s]} * n_embd + j] * slot_weights[s];
    sum = s == 0 ? v : sum + v;
  }
  const int64_t i = t * n_embd + j;
  if (shared.out != nullptr) sum += shared.out[i] * shared_scale;
  return residual != nullptr ? residual[i] + sum : sum;
}

// sigmoid(token t's shared-expert gate logit), or 0 without a shared expert.
__device__ __forceinline__ float shared_expert_scale(const SharedExpertOutput& shared, int64_t t) {
  return shared.out != nullptr ? 1.0f / (1.0f + expf(-__ldg(shared.gate_logit + t))) : 0.0f;
}

__global__ void combine_kernel(const float* __restrict__ expert_out, const int32_t* __restrict__ slot_rows,
                               const float* __restrict__ weights, int n_tokens, int k, int n_embd,
                               SharedExpertOutput shared, float* y, const float* residual) {
  const int64_t total = int64_t{n_tokens} * n_embd;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / n_embd;
    y[i] = combined_value(expert_out, slot_rows + t * k, weights + t * k, k, n_embd, shared,
                          shared_expert_scale(shared, t), residual, t, i % n_embd);
  }
}

constexpr int kCombineNormThreads = 1024;
constexpr int kMaxCombineNormSlots = 64;  // a token's slots kept in shared memory
constexpr int kCombineNormCached = 4;     // values of the row a thread keeps in registers (n_embd up to 4096)

// One block a token (decode: one block in all, so a wide one): the
// combination, then its RMS norm (as rms_norm: mean of squares + eps, an
// IEEE sqrt and division, y * scale * weight). The token's slot rows and
// weights are read once into shared memory; each thread reads back only
// the values it wrote.
__global__ void __launch_bounds__(kCombineNormThreads)
    combine_norm_kernel(const float* __restrict__ expert_out, const int32_t* __restrict__ slot_rows,
                        const float* __restrict__ weights, int k, int n_embd, SharedExpertOutput shared, float* y,
                        const float* residual, NextNorm next, float eps) {
  __shared__ float scratch[kWarpSize];
  __shared__ int32_t rows[kMaxCombineNormSlots];
  __shared__ float slot_weights[kMaxCombineNormSlots];
  const int64_t t = blockIdx.x;
  for (int s = static_cast<int>(threadIdx.x); s < k; s += kCombineNormThreads) {
    rows[s] = __ldg(slot_rows + t * k + s);
    slot_weights[s] = __ldg(weights + t * k + s);
  }
  __syncthreads();
  const float shared_scale = shared_expert_scale(shared, t);
  float* yr = y + t * n_embd;
  float* out = next.out + t * n_embd;
  float sum = 0.0f;
  if (n_embd <= kCombineNormThreads * kCombineNormCached) {
    // The row and the norm weight stay in registers between the passes
    // (the weight loaded with the row): the same sums in the same order as
    // the loop below, without its second round trip to memory.
    float v[kCombineNormCached], w[kCombineNormCached];
#pragma unroll
    for (int c = 0; c < kCombineNormCached; ++c) {
      const int j = static_cast<int>(threadIdx.x) + c * kCombineNormThreads;
      if (j < n_embd) {
        w[c] = __ldg(next.weight + j);
        v[c] = combined_value(expert_out, rows, slot_weights, k, n_embd, shared, shared_scale, residual, t, j);
        yr[j] = v[c];
        sum += v[c] * v[c];
      }
    }
    sum = block_sum(sum, scratch);
    const float scale = rms_scale(sum, n_embd, eps);
#pragma unroll
    for (int c = 0; c < kCombineNormCached; ++c) {
      const int j = static_cast<int>(threadIdx.x) + c * kCombineNormThreads;
      if (j < n_embd) out[j] = v[c] * scale * w[c];
    }
    return;
  }
  for (int j = static_cast<int>(threadIdx.x); j < n_embd; j += kCombineNormThreads) {
    const float v = combined_value(expert_out, rows, slot_weights, k, n_embd, shared, shared_scale, residual, t, j);
    yr[j] = v;
    sum += v * v;
  }
  sum = block_sum(sum, scratch);
  const float scale = rms_scale(sum, n_embd, eps);
  for (int j = static_cast<int>(threadIdx.x); j < n_embd; j += kCombineNormThreads) {
    out[j] = yr[j] * scale * __ldg(next.weight + j);
  }
}

}  // namespace

namespace {

// The routing's arguments (and the grouping's item size, when given).
void check_experts(const char* op, int n_expert, int k, int item_tokens = 1) {
  if (n_expert < 1 || n_expert > kMaxExperts || k < 1 || k > n_expert || item_tokens < 1) {
    throw Error(std::string(op) + ": " + std::to_string(n_expert) + " experts (1 to " + std::to_string(kMaxExperts) +
                "), " + std::to_string(k) + " chosen (1 to the expert count), " + std::to_string(item_tokens) +
                " tokens per item");
  }
}

}  // namespace

void route_experts(const float* logits, int n_tokens, int n_expert, int k, bool renormalize, int32_t* ids,
                   float* weights, cudaStream_t stream) {
  check_experts("route_experts", n_expert, k);
  if (n_tokens <= 0) return;
  const int blocks = (n_tokens + kRouteWarps - 1) / kRouteWarps;
  visit_experts_per_lane(n_expert, [&](auto per_lane) {
    route_kernel<per_lane()><<<blocks, kRouteWarps * kWarpSize, 0, stream>>>(logits, n_tokens, n_expert, k,
                                                                              renormalize, ids, weights);
  });
  M40_CUDA_CHECK_LAUNCH();
}

int expert_item_tokens(int n_tokens, int k, int n_expert, int tile_share) {
  const int64_t even_share = (int64_t{n_tokens} * k + n_expert - 1) / n_expert;
  if (even_share > tile_share) {
    for (const int tile : {16, 32}) {
      if (even_share <= tile) return tile;
    }
    return kMaxExpertGemmTokens;
  }
  int tokens = 1;
  while (tokens < even_share && tokens < kMaxExpertMatvecTokens) tokens *= 2;
  return tokens;
}

int expert_tile_share(gguf::TensorType type, int multiprocessors) {
  if (multiprocessors < kManyMultiprocessors) return 4 * kMaxExpertMatvecTokens;
  return tiles_load_slowly(type) ? 2 * kMaxExpertMatvecTokens : kMaxExpertMatvecTokens;
}

int max_expert_items(int n_tokens, int k, int n_expert, int item_tokens) {
  // Σ ceil(c_e / m) over the chosen experts <= Σ (c_e + m - 1) / m =
  // (slots + chosen (m - 1)) / m, at most min(n_expert, slots) chosen.
  const int64_t slots = int64_t{n_tokens} * k;
  const int64_t chosen = std::min<int64_t>(n_expert, slots);
  return static_cast<int>((slots + chosen * (item_tokens - 1)) / item_tokens);
}

void group_by_expert(const int32_t* ids, int n_slots, int n_expert, int k, int item_tokens, int n_items,
                     int32_t* sorted_slots, int32_t* slot_rows, ExpertItem* items, cudaStream_t stream) {
  check_experts("group_by_expert", n_expert, k, item_tokens);
  if (n_slots <= 0 || n_items <= 0) return;
  const GroupShared shared = grouping_shared_memory(n_expert, n_slots, kGroupThreads / kWarpSize);
  group_kernel<<<1, kGroupThreads, shared.bytes, stream>>>(ids, n_slots, n_expert, k, item_tokens, n_items,
                                                           shared.stage, shared.warp_count_ints, sorted_slots,
                                                           slot_rows, items);
  M40_CUDA_CHECK_LAUNCH();
}

void route_and_group(const float* logits, int n_tokens, int n_expert, int k, bool renormalize, int item_tokens,
                     int n_items, int32_t* ids, float* weights, int32_t* sorted_slots, int32_t* slot_rows,
                     ExpertItem* items, cudaStream_t stream) {
  check_experts("route_and_group", n_expert, k, item_tokens);
  if (n_tokens <= 0 || n_items <= 0) return;
  if (n_tokens > kMaxFusedRouteTokens) {
    route_experts(logits, n_tokens, n_expert, k, renormalize, ids, weights, stream);
    return group_by_expert(ids, n_tokens * k, n_expert, k, item_tokens, n_items, sorted_slots, slot_rows, items, stream);
  }
  const GroupShared shared = grouping_shared_memory(n_expert, n_tokens * k, kFusedWarps);
  visit_experts_per_lane(n_expert, [&](auto per_lane) {
    route_and_group_kernel<per_lane()><<<1, kFusedThreads, shared.bytes, stream>>>(
        logits, n_tokens, n_expert, k, renormalize, item_tokens, n_items, shared.stage, shared.warp_count_ints, ids,
        weights, sorted_slots, slot_rows, items);
  });
  M40_CUDA_CHECK_LAUNCH();
}

void gather_expert_rows(const float* x, const int32_t* sorted_slots, int k, int n_slots, int n_embd, float* out,
                        cudaStream_t stream) {
  if (n_embd % 4 != 0) throw Error("gather_expert_rows: rows of a multiple of 4 values");
  if (n_slots <= 0) return;
  const int threads = 256;
  gather_kernel<<<grid_blocks(int64_t{n_slots} * (n_embd / 4), threads), threads, 0, stream>>>(x, sorted_slots, k, n_slots,
                                                                                           n_embd / 4, out);
  M40_CUDA_CHECK_LAUNCH();
}

void combine_experts(const float* expert_out, const int32_t* slot_rows, const float* weights, int n_tokens, int k,
                     int n_embd, SharedExpertOutput shared, float* y, const float* residual, cudaStream_t stream,
                     const NextNorm& next, float eps) {
  if ((shared.out == nullptr) != (shared.gate_logit == nullptr)) {
    throw Error("combine_experts: a shared expert's output needs its gate logits");
  }
  if ((next.weight == nullptr) != (next.out == nullptr)) throw Error("combine_experts: a next norm needs its output");
  if (n_tokens <= 0) return;
  if (next.weight != nullptr && k <= kMaxCombineNormSlots) {
    combine_norm_kernel<<<n_tokens, kCombineNormThreads, 0, stream>>>(expert_out, slot_rows, weights, k, n_embd, shared,
                                                                     y, residual, next, eps);
    M40_CUDA_CHECK_LAUNCH();
    return;
  }
  if (next.weight != nullptr) {  // more slots than the fused kernel keeps: the norm on its own
    combine_experts(expert_out, slot_rows, weights, n_tokens, k, n_embd, shared, y, residual, stream);
    return rms_norm(y, next.weight, next.out, n_tokens, n_embd, eps, stream);
  }
  const int threads = 256;
  combine_kernel<<<grid_blocks(int64_t{n_tokens} * n_embd, threads), threads, 0, stream>>>(expert_out, slot_rows, weights,
                                                                                         n_tokens, k, n_embd, shared, y, residual);
  M40_CUDA_CHECK_LAUNCH();
}

}  // namespace m40::cuda
