// Synthetic llama-architecture models: real GGUF files of any shape with
// seeded random weights stored as valid blocks of the chosen type. They let
// benchmarks run on 7B shapes without downloading anything.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gguf/file.h"

namespace m40::model {

struct SyntheticShape {
  std::string name;  // "llama2-7b", "llama3-8b", "tiny" or "custom"
  uint32_t n_layer = 2;
  uint32_t n_embd = 256;
  uint32_t n_ff = 768;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t context_length = 512;
  float rope_freq_base = 10000.0f;
  float rms_eps = 1e-5f;
};

// The named shapes; nothing for an unknown name.
std::optional<SyntheticShape> synthetic_shape(const std::string& name);
std::vector<std::string> synthetic_shape_names();

// The weight recipes, named as llama-quantize's file types: one type for every
// matrix but the output head ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0",
// "q5_1", "q5_k", "q6_k", "q3_k_s"), or llama.cpp's mixes that give some
// matrices more bits ("q2_k", "q3_k_m", "q3_k_l", "q4_k" (Q4_K_S), "q4_k_m",
// "iq4_nl", "iq4_xs").
std::vector<std::string> synthetic_weight_recipes();

struct SyntheticOptions {
  SyntheticShape shape;
  std::string recipe = "q4_k_m";
  uint64_t seed = 1234;
  unsigned threads = 0;  // 0: every core
  // The tokenizer.* metadata is copied from this file; the vocabulary size
  // is that tokenizer's.
  const gguf::File* tokenizer_source = nullptr;
};

struct SyntheticReport {
  uint64_t parameter_count = 0;
  uint64_t file_bytes = 0;
  std::vector<std::string> notes;  // e.g. tensors that fell back to another type
};

// Writes the model to `path` (atomically). Throws m40::Error on a bad shape,
// an unknown recipe, a missing tokenizer or an I/O failure.
SyntheticReport write_synthetic_llama(const SyntheticOptions& options, const std::string& path);

}  // namespace m40::model
