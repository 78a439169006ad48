// What the kernels use of torch, without <torch/extension.h>: that header pulls in pybind11 and the whole C++
// frontend, and compiling it took ~220 s of a busy 2-core AMD EPYC's time per source file (~30 s for these
// headers), at a server's first start.  The kernels are torch-library operators (not a Python module), so the
// Tensor class, the few factory functions they call, at::parallel_for and TORCH_LIBRARY are all they need.
#pragma once
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/TensorOperators.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <tuple>

namespace torch {
using namespace at;  // torch::Tensor, torch::empty, torch::kFloat, ... as <torch/types.h> brings them
// <torch/types.h>'s own names of the dtypes
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
}
