/// @file graphrun/eigen.h
/// Eigen views of Tensor storage, for kernel authors. The only public header
/// that includes Eigen. Views alias the tensor's buffer; they do not own it.
///
/// @code
///   flat<float>(*y) = flat<float>(x).cwiseMax(0.0f);       // Eigen::Array ops
///   matrix<float>(*c).noalias() = matrix<float>(a) * matrix<float>(b);
/// @endcode
///
/// Thread safety: as the underlying Tensor.
#pragma once

#include <graphrun/tensor.h>

#include <Eigen/Core>
#include <unsupported/Eigen/CXX11/Tensor>

namespace graphrun {

/// Tensor storage is 64-byte aligned.
inline constexpr int kEigenAlignment = Eigen::Aligned64;

/// All elements as a 1-D Eigen array (flat()).
template <typename T>
using FlatMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, kEigenAlignment>;
/// The read-only FlatMap.
template <typename T>
using ConstFlatMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>, kEigenAlignment>;
/// A dynamic-size, row-major Eigen matrix (Tensor storage is row-major).
template <typename T>
using RowMajorMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A rank-2 tensor as a row-major Eigen matrix (matrix()).
template <typename T>
using MatrixMap = Eigen::Map<RowMajorMatrix<T>, kEigenAlignment>;
/// The read-only MatrixMap.
template <typename T>
using ConstMatrixMap = Eigen::Map<const RowMajorMatrix<T>, kEigenAlignment>;
/// A tensor of rank `Rank` as an Eigen::TensorMap (tensor()).
template <typename T, int Rank>
using TensorView =
    Eigen::TensorMap<Eigen::Tensor<T, Rank, Eigen::RowMajor, Eigen::DenseIndex>, Eigen::Aligned>;
/// The read-only TensorView.
template <typename T, int Rank>
using ConstTensorView =
    Eigen::TensorMap<Eigen::Tensor<const T, Rank, Eigen::RowMajor, Eigen::DenseIndex>,
                     Eigen::Aligned>;

///@{
/// All elements as a 1-D array.
template <typename T>
FlatMap<T> flat(Tensor& t) {
  return FlatMap<T>(t.flat<T>().data(), t.num_elements());
}
template <typename T>
ConstFlatMap<T> flat(const Tensor& t) {
  return ConstFlatMap<T>(t.flat<T>().data(), t.num_elements());
}
///@}

///@{
/// A rank-2 tensor as a row-major matrix. Aborts for other ranks.
template <typename T>
MatrixMap<T> matrix(Tensor& t) {
  GRAPHRUN_CHECK_MSG(t.shape().rank() == 2, "matrix<T>() on " + t.shape().to_string());
  return MatrixMap<T>(t.flat<T>().data(), t.shape().dim(0), t.shape().dim(1));
}
template <typename T>
ConstMatrixMap<T> matrix(const Tensor& t) {
  GRAPHRUN_CHECK_MSG(t.shape().rank() == 2, "matrix<T>() on " + t.shape().to_string());
  return ConstMatrixMap<T>(t.flat<T>().data(), t.shape().dim(0), t.shape().dim(1));
}
///@}

///@{
/// A tensor of rank `Rank` as an Eigen::TensorMap (broadcasts, reductions).
/// Aborts when the rank differs.
template <typename T, int Rank>
TensorView<T, Rank> tensor(Tensor& t) {
  GRAPHRUN_CHECK_MSG(t.shape().rank() == Rank, "tensor<T, Rank>() on " + t.shape().to_string());
  Eigen::array<Eigen::DenseIndex, Rank> dims;
  for (int i = 0; i < Rank; ++i) dims[i] = t.shape().dim(i);
  return TensorView<T, Rank>(t.flat<T>().data(), dims);
}
template <typename T, int Rank>
ConstTensorView<T, Rank> tensor(const Tensor& t) {
  GRAPHRUN_CHECK_MSG(t.shape().rank() == Rank, "tensor<T, Rank>() on " + t.shape().to_string());
  Eigen::array<Eigen::DenseIndex, Rank> dims;
  for (int i = 0; i < Rank; ++i) dims[i] = t.shape().dim(i);
  return ConstTensorView<T, Rank>(t.flat<T>().data(), dims);
}
///@}

}  // namespace graphrun
