// Eigen's SGEMM for gemm_bench, compiled with -march=native (Eigen picks its SIMD width at
// compile time), single-threaded.
#include <Eigen/Core>

/// C[m,n] = A[m,k] · op(B), op(B) = Bᵀ when `transpose_b` (B stored [n,k]); row-major.
void eigen_gemm(const float* a, const float* b, float* c, long m, long n, long k,
                bool transpose_b) {
  using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  Eigen::Map<const Matrix> A(a, m, k);
  Eigen::Map<Matrix> C(c, m, n);
  if (transpose_b)
    C.noalias() = A * Eigen::Map<const Matrix>(b, n, k).transpose();
  else
    C.noalias() = A * Eigen::Map<const Matrix>(b, k, n);
}
