#include "backends/cuda/shard_exchange.h"

#include <utility>

#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/layer_kernels.h"
#include "common/error.h"

namespace m40::cuda {

ShardExchange::ShardExchange(std::vector<int> devices, int64_t max_values)
    : max_values_(max_values), rendezvous_(static_cast<int>(devices.size())) {
  if (devices.empty() || max_values <= 0) throw Error("a shard exchange needs devices and a buffer size");
  shards_.resize(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    Shard& s = shards_[i];
    s.device = devices[i];
    select_device(s.device);
    for (auto& e : s.ready) M40_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    M40_CUDA_CHECK(cudaEventCreateWithFlags(&s.handoff, cudaEventDisableTiming));
    if (i == 0) M40_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    for (const int peer : devices) {
      if (peer == s.device) continue;
      int can = 0;
      M40_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, s.device, peer));
      if (can == 0) {  // cudaMemcpyPeerAsync stages through the host
        peer_copies_ = false;
        continue;
      }
      const cudaError_t status = cudaDeviceEnablePeerAccess(peer, 0);
      if (status == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // clears the error that call left behind
      } else {
        M40_CUDA_CHECK(status);
      }
    }
  }
}

ShardExchange::~ShardExchange() {
  for (Shard& s : shards_) {
    if (s.ready[0] == nullptr) continue;
    cudaSetDevice(s.device);
    for (auto e : s.ready) cudaEventDestroy(e);
    if (s.handoff != nullptr) cudaEventDestroy(s.handoff);
    if (&s == &shards_.front() && fork_ != nullptr) cudaEventDestroy(fork_);
  }
}

void ShardExchange::attach(int shard, float* buffers) {
  Shard& s = shards_.at(static_cast<size_t>(shard));
  s.partials[0] = buffers;
  s.partials[1] = buffers + max_values_;
  s.landing = buffers + 2 * max_values_;
}

float* ShardExchange::partial(int shard) const {
  const Shard& s = shards_[static_cast<size_t>(shard)];
  return s.partials[s.exchanges & 1];
}

void ShardExchange::rendezvous(int shard) {
  std::unique_lock<std::mutex>& capturing = shards_[static_cast<size_t>(shard)].capturing;
  const bool was_capturing = capturing.owns_lock();
  if (was_capturing) capturing.unlock();
  rendezvous_.arrive_and_wait();
  if (was_capturing) capturing.lock();
}

void ShardExchange::all_reduce(int shard, float* out, int64_t n_values, cudaStream_t stream) {
  if (n_values > max_values_) throw Error("a row split's partial exceeds the exchange's buffers");
  Shard& me = shards_[static_cast<size_t>(shard)];
  const int buffer = static_cast<int>(me.exchanges & 1);
  M40_CUDA_CHECK(cudaEventRecord(me.ready[buffer], stream));
  rendezvous(shard);
  const size_t bytes = static_cast<size_t>(n_values) * sizeof(float);
  // out = partial 0 + partial 1 + ..., in that order on every shard.
  for (int j = 0; j < count(); ++j) {
    const Shard& peer = shards_[static_cast<size_t>(j)];
    const float* part = me.partials[buffer];
    if (j != shard) {
      float* landing = j == 0 ? out : me.landing + j * max_values_;
      M40_CUDA_CHECK(cudaStreamWaitEvent(stream, peer.ready[buffer], 0));
      copy_partial(me, landing, peer, peer.partials[buffer], bytes, stream);
      part = landing;
    }
    if (j == 0) {
      if (part != out) M40_CUDA_CHECK(cudaMemcpyAsync(out, part, bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      add_in_place(out, part, n_values, stream);
    }
  }
  ++me.exchanges;
}

void ShardExchange::copy_partial(const Shard& to, float* landing, const Shard& from, const float* partial, size_t bytes,
                                 cudaStream_t stream) const {
  if (to.device == from.device) {
    M40_CUDA_CHECK(cudaMemcpyAsync(landing, partial, bytes, cudaMemcpyDeviceToDevice, stream));
  } else if (peer_copies_) {  // a plain copy between the GPUs (unified addresses), which a graph can hold
    M40_CUDA_CHECK(cudaMemcpyAsync(landing, partial, bytes, cudaMemcpyDefault, stream));
  } else {
    M40_CUDA_CHECK(cudaMemcpyPeerAsync(landing, to.device, partial, from.device, bytes, stream));
  }
}

void ShardExchange::begin_capture(int shard, cudaStream_t stream) {
  Shard& me = shards_[static_cast<size_t>(shard)];
  if (shard == 0) {
    me.capturing = std::unique_lock(capture_mutex_);
    // Relaxed: the other shards' threads add to this capture too.
    M40_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    M40_CUDA_CHECK(cudaEventRecord(fork_, stream));
  }
  rendezvous(shard);
  if (shard != 0) {
    me.capturing = std::unique_lock(capture_mutex_);
    M40_CUDA_CHECK(cudaStreamWaitEvent(stream, fork_, 0));  // joins shard 0's capture
  }
}

cudaGraph_t ShardExchange::end_capture(int shard, cudaStream_t stream) {
  Shard& me = shards_[static_cast<size_t>(shard)];
  if (shard != 0) M40_CUDA_CHECK(cudaEventRecord(me.handoff, stream));
  rendezvous(shard);
  cudaGraph_t graph = nullptr;
  if (shard == 0) {  // every other stream rejoins the capture before it ends
    for (size_t j = 1; j < shards_.size(); ++j) M40_CUDA_CHECK(cudaStreamWaitEvent(stream, shards_[j].handoff, 0));
    M40_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  }
  me.capturing.unlock();
  rendezvous(shard);  // no shard enqueues more on its stream until the capture has ended
  return graph;
}

void ShardExchange::launch(int shard, cudaStream_t stream, cudaGraphExec_t graph) {
  if (shard != 0) M40_CUDA_CHECK(cudaEventRecord(shards_[static_cast<size_t>(shard)].handoff, stream));
  rendezvous(shard);
  if (shard == 0) {
    for (size_t j = 1; j < shards_.size(); ++j) M40_CUDA_CHECK(cudaStreamWaitEvent(stream, shards_[j].handoff, 0));
    M40_CUDA_CHECK(cudaGraphLaunch(graph, stream));
  }
}

void ShardExchange::begin_step() {
  rendezvous_.reset();
  for (Shard& s : shards_) s.exchanges = 0;
}

void ShardExchange::release(int shard) {
  std::unique_lock<std::mutex>& capturing = shards_[static_cast<size_t>(shard)].capturing;
  if (capturing.owns_lock()) capturing.unlock();
}

}  // namespace m40::cuda
