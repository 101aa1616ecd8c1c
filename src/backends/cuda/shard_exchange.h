// The all-reduce of a row split's shards (model/row_split.h). After each
// branch's output product every shard holds a partial sum of the branch;
// each shard pulls the others' partials to its own GPU (a peer copy where
// the GPUs can reach each other, else staged through host memory, as
// cudaMemcpyPeerAsync does) and adds them in shard order, so that every
// shard gets the same sum, bit for bit, and the shards' residual streams
// stay identical.
//
// Each shard enqueues its step on its own host thread. An exchange is a
// host rendezvous: a shard records "my partial is written" on its stream,
// waits until every shard has done the same, then makes its stream wait
// for the others' events before copying. No host thread waits for a GPU.
// Partials alternate between two buffers: a shard writes buffer b again
// two exchanges later, after its stream has waited for every other shard's
// next event, which each recorded after its copy of buffer b.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "backends/shard_group.h"

namespace m40::cuda {

class ShardExchange : public backend::ShardGroup {
 public:
  // Shard i runs on devices[i]; a partial holds at most max_values floats.
  // Enables peer access between the devices that allow it.
  ShardExchange(std::vector<int> devices, int64_t max_values);
  ~ShardExchange() override;
  ShardExchange(const ShardExchange&) = delete;
  ShardExchange& operator=(const ShardExchange&) = delete;

  int count() const override { return static_cast<int>(shards_.size()); }
  int64_t max_values() const { return max_values_; }
  // Device floats a shard gives the exchange (attach): two partials and one
  // landing buffer per shard.
  int64_t buffer_floats() const { return (2 + count()) * max_values_; }
  // Shard `shard`'s buffers, on its device (buffer_floats() floats).
  void attach(int shard, float* buffers);

  // Where `shard` writes its partial for its next exchange.
  float* partial(int shard) const;
  // Called on shard `shard`'s thread with its device current, after
  // `stream` has been given the product that writes partial(shard): leaves
  // the sum of all shards' partials (n_values floats) in `out` on that
  // stream. Throws m40::Error if another shard abandoned the step.
  void all_reduce(int shard, float* out, int64_t n_values, cudaStream_t stream);

  // Whether a decode step may be captured as one graph over every shard's
  // GPU: each pair of the GPUs reaches the other by peer access (or is the
  // same GPU), so the exchanges' copies are plain device copies.
  bool graphs_possible() const { return peer_copies_; }
  // A decode step's graph: every shard calls begin_capture, enqueues its
  // layers, then end_capture. Shard 0's stream captures, the others' streams
  // join its capture; end_capture returns the graph to shard 0 (null to the
  // others).
  void begin_capture(int shard, cudaStream_t stream);
  cudaGraph_t end_capture(int shard, cudaStream_t stream);
  // Every shard calls this to run a captured step, after enqueuing its
  // inputs' upload on its stream; shard 0 launches `graph` (the others pass
  // null) once every shard's inputs are ordered before it.
  void launch(int shard, cudaStream_t stream, cudaGraphExec_t graph);

  // Before a step: every shard at its first exchange, nothing abandoned.
  // (Every shard's previous step has ended: their streams are idle.)
  void begin_step() override;
  void abandon() override { rendezvous_.abandon(); }
  // Lets go of a capture the failed shard was adding to.
  void release(int shard) override;

 private:
  struct Shard {
    int device = 0;
    float* partials[2] = {nullptr, nullptr};
    float* landing = nullptr;  // count x max_values: shard j's partial at j x max_values
    cudaEvent_t ready[2] = {nullptr, nullptr};
    cudaEvent_t handoff = nullptr;  // a shard's part of a captured step, or its inputs for a launch
    // Held while this shard's thread adds to a capture (see capture_mutex_).
    std::unique_lock<std::mutex> capturing;
    int64_t exchanges = 0;
  };
  // Blocks until every shard has arrived here as often as the caller
  // (letting go of the capture while it waits).
  void rendezvous(int shard);

  // Copies a partial from shard `from` to `to`'s landing on `to`'s stream.
  void copy_partial(const Shard& to, float* landing, const Shard& from, const float* partial, size_t bytes,
                    cudaStream_t stream) const;

  std::vector<Shard> shards_;
  int64_t max_values_;
  bool peer_copies_ = true;
  cudaEvent_t fork_ = nullptr;  // on shard 0's GPU: the start of a capture
  backend::Rendezvous rendezvous_;
  // The shards' threads add to one capture one at a time: between two
  // rendezvous each holds this while it enqueues.
  std::mutex capture_mutex_;
};

}  // namespace m40::cuda
