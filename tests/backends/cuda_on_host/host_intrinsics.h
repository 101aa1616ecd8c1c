// Host stand-ins for what matmul_decode.cuh uses from CUDA, so that the GPU
// decoders can be compiled by the host compiler and compared with
// quant::dequantize_value in every build (CI has no GPU). Each intrinsic does
// what the PTX ISA says of it; __ldg is a plain load that also records loads
// outside the block under test (LoadWatch).
#pragma once

#include <math.h>  // fmaf at global scope, as CUDA has it

#include <cstdint>
#include <cstring>

#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct uint2 {
  unsigned x, y;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct float2 {
  float x, y;
};
struct float4 {
  float x, y, z, w;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

struct HostThreadIndex {
  unsigned x = 0, y = 0, z = 0;
};
inline HostThreadIndex threadIdx;  // fill_table() runs once per "thread"

// The bytes a decoder may read: its block, and the start of the 4-byte word
// the block begins in (load_16_align2 reads p[-2..-1] of a 2-byte-aligned
// block, inside the same aligned word).
struct LoadWatch {
  const uint8_t* first = nullptr;
  const uint8_t* end = nullptr;
  long outside = 0;     // loads that touched a byte outside [first, end)
  long misaligned = 0;  // loads not aligned to their size
};
inline LoadWatch load_watch;

template <class T>
inline T __ldg(const T* p) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(p);
  if (reinterpret_cast<uintptr_t>(bytes) % sizeof(T) != 0) ++load_watch.misaligned;
  if (bytes < load_watch.first || bytes + sizeof(T) > load_watch.end) ++load_watch.outside;
  T value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

inline float __uint_as_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// prmt.b32 (default mode): result byte n is byte s[4n + 2 .. 4n] of the
// eight bytes of (x, y).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t bytes = static_cast<uint64_t>(x) | static_cast<uint64_t>(y) << 32;
  uint32_t result = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t select = (s >> (4 * n)) & 7u;
    result |= static_cast<uint32_t>((bytes >> (8 * select)) & 0xFFu) << (8 * n);
  }
  return result;
}

// The low 32 bits of (hi:lo) >> (shift & 31), as CUDA documents it.
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t shift) {
  const uint64_t joined = static_cast<uint64_t>(hi) << 32 | lo;
  return static_cast<uint32_t>(joined >> (shift & 31u));
}
