// What the kernels use of torch: its stable C ABI (torch/csrc/stable), not <ATen/...>.  The ATen headers took
// ~30 s of compiling per source file (a 2-core AMD EPYC: the whole build 31 s of wall time, 48 s of CPU, at a
// server's first start); these headers are a thin C shim over the same dispatcher: the build takes a few seconds.
// The kernels stay torch-library operators (torch.ops.specviz.*, registered below each file with
// STABLE_TORCH_LIBRARY*), so torch.jit.trace records them (the lean steps' traced graphs: specviz.models.lean).
// Here: the few names the kernels use, over the stable API.
#pragma once
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/headeronly/util/Exception.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace sv {
using Tensor = torch::stable::Tensor;
using ScalarType = torch::headeronly::ScalarType;
constexpr ScalarType kUInt8 = ScalarType::Byte;
constexpr ScalarType kInt8 = ScalarType::Char;
constexpr ScalarType kInt16 = ScalarType::Short;
constexpr ScalarType kInt32 = ScalarType::Int;
constexpr ScalarType kInt64 = ScalarType::Long;
constexpr ScalarType kLong = ScalarType::Long;
constexpr ScalarType kFloat32 = ScalarType::Float;
constexpr ScalarType kFloat = ScalarType::Float;

// A new tensor's element type (what torch's TensorOptions gave these kernels: every tensor here is on the CPU).
struct Options {
  ScalarType type;
  Options dtype(ScalarType t) const { return Options{t}; }
};
inline Options options(const Tensor& t) { return Options{t.scalar_type()}; }

template <class T>
inline T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// A new contiguous CPU tensor, through the C shim's direct call (aten::empty through the boxed dispatcher cost
// ~1 us more a call, four calls a product).
inline Tensor empty(const std::vector<int64_t>& sizes, Options o) {
  std::vector<int64_t> strides(sizes.size());
  int64_t step = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = step;
    step *= sizes[i];
  }
  AtenTensorHandle out = nullptr;
  STD_TORCH_CHECK(aoti_torch_empty_strided(int64_t(sizes.size()), sizes.data(), strides.data(),
                                           int32_t(torch::stable::detail::to<int32_t>(torch::stable::detail::from(o.type))),
                                           aoti_torch_device_type_cpu(), 0, &out) == AOTI_TORCH_SUCCESS,
                  "could not allocate a tensor");
  return Tensor(out);
}
inline Tensor zeros(const std::vector<int64_t>& sizes, Options o) {
  Tensor t = empty(sizes, o);
  torch::stable::zero_(t);
  return t;
}
inline Tensor empty_like(const Tensor& t) { return torch::stable::empty_like(t); }
inline Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : torch::stable::contiguous(t); }
inline Tensor to(const Tensor& t, ScalarType type) {
  return t.scalar_type() == type ? t : torch::stable::to(t, type);
}

// at::parallel_for's OpenMP form (ATen/ParallelOpenMP.h), inlined here as it was with the ATen headers: each
// thread of the region takes one contiguous chunk; a short range, or a call inside a region, runs here alone.
template <class F>
inline void parallel_for(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (begin >= end) return;
  if (end - begin <= grain || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(begin, end);
    return;
  }
#pragma omp parallel
  {
    int64_t threads = omp_get_num_threads();
    if (grain > 0) threads = std::min<int64_t>(threads, (end - begin + grain - 1) / grain);
    const int64_t tid = omp_get_thread_num(), chunk = (end - begin + threads - 1) / threads;
    const int64_t b = begin + tid * chunk;
    if (b < end) f(b, std::min(end, b + chunk));
  }
}
}  // namespace sv

#define SV_CHECK(cond, ...) STD_TORCH_CHECK(cond, __VA_ARGS__)
