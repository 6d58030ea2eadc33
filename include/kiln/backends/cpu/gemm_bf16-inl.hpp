// Per-target GEMM that multiplies in bfloat16 and adds in FP32 (AVX512-BF16 dot products of
// pairs along the depth), on x86 AVX-512 targets; re-included per target.
#if defined(KILN_CPU_GEMM_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef KILN_CPU_GEMM_BF16_INL_H_
#undef KILN_CPU_GEMM_BF16_INL_H_
#else
#define KILN_CPU_GEMM_BF16_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <hwy/highway.h>

#include "kiln/backends/cpu/gemm-inl.hpp"
#include "kiln/backends/cpu/workspace.hpp"

#if HWY_ARCH_X86
#include <immintrin.h>
#endif

// The AVX512-BF16 instructions on top of the target's own: functions that use them run only
// where Bf16KernelsRun() said the CPU has them.
#ifndef KILN_BF16_FUNCTION
#define KILN_BF16_FUNCTION __attribute__((target("avx512bf16")))
#endif

HWY_BEFORE_NAMESPACE();
namespace kiln::cpu::HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

/// Whether this target's bfloat16 kernels run on this CPU.
inline bool Bf16KernelsRun() { return __builtin_cpu_supports("avx512bf16"); }

// The micro-tile: as the FP32 one, 8 rows x 3 vectors of 16 sums, but each step multiplies a
// pair of depths at once.
inline constexpr std::size_t kBf16MR = 8;
inline constexpr std::size_t kBf16NV = 3;
inline constexpr std::size_t kBf16NR = kBf16NV * 16;
static_assert(kBf16MR <= gemm_blocking::max_mr && kBf16NR <= gemm_blocking::max_nr);
/// Depth of a packed panel: the FP32 one, so that a sliver of B (24 KiB of pairs) stays in L1
/// beside the rows of A; twice the depth would fill 48 KiB, more than L1 holds.
inline constexpr std::size_t kBf16KC = gemm_blocking::kc;

/// Lane masks of the first `n` of 16 lanes, and of the first `n` of 32 16-bit lanes.
HWY_INLINE __mmask16 FirstLanes16(std::size_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}
HWY_INLINE __mmask32 FirstLanes32(std::size_t n) {
  return n >= 32 ? __mmask32(0xFFFFFFFFu) : __mmask32((1u << n) - 1u);
}

/// 32 floats, lo the first 16, as 32 bfloat16 in order, rounded to nearest even.
KILN_BF16_FUNCTION HWY_INLINE __m512i ToBf16(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

/// Two rows of 16 floats as 16 pairs (first[j], second[j]) of bfloat16, one per 32-bit lane:
/// the operand layout of a dot product of pairs.
KILN_BF16_FUNCTION HWY_INLINE __m512i InterleaveToBf16(__m512 first, __m512 second) {
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(interleave, ToBf16(first, second));
}

/// rows[i] lane j becomes rows[j] lane i, for 16 x 16 32-bit lanes: unpacks of 32 and 64 bits
/// within 128-bit blocks, then two shuffles of the blocks. (The zero-masked forms with every
/// lane set are the plain instructions; GCC 12's unmasked ones trip -Wmaybe-uninitialized.)
HWY_INLINE void Transpose16x16(__m512i (&rows)[16]) {
  constexpr __mmask16 all = 0xFFFF;
  constexpr __mmask8 all64 = 0xFF;
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(all, rows[i], rows[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(all, rows[i], rows[i + 1]);
  }
  // u[4g + e], block q: lane 4q + e of rows 4g .. 4g + 3.
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_maskz_unpacklo_epi64(all64, t[g], t[g + 2]);
    u[g + 1] = _mm512_maskz_unpackhi_epi64(all64, t[g], t[g + 2]);
    u[g + 2] = _mm512_maskz_unpacklo_epi64(all64, t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_maskz_unpackhi_epi64(all64, t[g + 1], t[g + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i even_low = _mm512_maskz_shuffle_i32x4(all, u[e], u[4 + e], 0x88);
    const __m512i odd_low = _mm512_maskz_shuffle_i32x4(all, u[e], u[4 + e], 0xDD);
    const __m512i even_high = _mm512_maskz_shuffle_i32x4(all, u[8 + e], u[12 + e], 0x88);
    const __m512i odd_high = _mm512_maskz_shuffle_i32x4(all, u[8 + e], u[12 + e], 0xDD);
    rows[e] = _mm512_maskz_shuffle_i32x4(all, even_low, even_high, 0x88);
    rows[8 + e] = _mm512_maskz_shuffle_i32x4(all, even_low, even_high, 0xDD);
    rows[4 + e] = _mm512_maskz_shuffle_i32x4(all, odd_low, odd_high, 0x88);
    rows[12 + e] = _mm512_maskz_shuffle_i32x4(all, odd_low, odd_high, 0xDD);
  }
}

/// The first `n` (<= 32) of 32 floats from src + i * stride, zeros after them.
HWY_INLINE void Gather32(const float* src, std::size_t stride, std::size_t n, float* dst) {
  for (std::size_t i = 0; i < 32; ++i) dst[i] = i < n ? src[i * stride] : 0.0f;
}

/// Rows [i0, i0 + mc) x depth [k0, k0 + kc) of op(A) as bfloat16 rows of `ld` (even, >= kc)
/// values each, zero past kc: a row's consecutive pairs are the 32-bit broadcasts of the
/// micro-kernel.
KILN_BF16_FUNCTION inline void PackRowsBf16(const MatRef& a, std::size_t i0, std::size_t mc,
                                            std::size_t k0, std::size_t kc, std::size_t ld,
                                            std::uint16_t* HWY_RESTRICT dst) {
  if (a.rs == 1 && a.cs != 1) {
    // Columns of op(A) are contiguous (a transposed A): two depths of 16 rows at a time.
    for (std::size_t i = 0; i < mc; i += 16) {
      const std::size_t rows = std::min<std::size_t>(16, mc - i);
      const __mmask16 mask = FirstLanes16(rows);
      for (std::size_t k = 0; k < ld; k += 2) {
        const float* col = a.p + i0 + i + (k0 + k) * a.cs;
        const __m512 first = k < kc ? _mm512_maskz_loadu_ps(mask, col) : _mm512_setzero_ps();
        const __m512 second =
            k + 1 < kc ? _mm512_maskz_loadu_ps(mask, col + a.cs) : _mm512_setzero_ps();
        alignas(64) std::uint32_t pairs[16];
        _mm512_store_si512(pairs, InterleaveToBf16(first, second));
        auto* out = reinterpret_cast<std::uint32_t*>(dst + i * ld + k);
        for (std::size_t r = 0; r < rows; ++r) out[r * ld / 2] = pairs[r];
      }
    }
    return;
  }
  alignas(64) float gathered[32];
  for (std::size_t r = 0; r < mc; ++r) {
    const float* src = a.p + (i0 + r) * a.rs + k0 * a.cs;
    std::uint16_t* out = dst + r * ld;
    for (std::size_t k = 0; k < ld; k += 32) {
      const std::size_t n = kc > k ? std::min<std::size_t>(32, kc - k) : 0;
      __m512i v;
      if (a.cs == 1) {
        v = ToBf16(_mm512_maskz_loadu_ps(FirstLanes16(n), src + k),
                   _mm512_maskz_loadu_ps(FirstLanes16(n > 16 ? n - 16 : 0), src + k + 16));
      } else {
        Gather32(src + k * a.cs, a.cs, n, gathered);
        v = ToBf16(_mm512_load_ps(gathered), _mm512_load_ps(gathered + 16));
      }
      _mm512_mask_storeu_epi16(out + k, FirstLanes32(std::min<std::size_t>(32, ld - k)), v);
    }
  }
}

/// Depth [k0, k0 + kc) x columns [j0, j0 + nc) of op(B) as NR-column slivers of pairs: sliver
/// s holds, for each pair of depths p, NR 32-bit lanes (b[2p][j], b[2p+1][j]) at
/// dst + (s * pairs + p) * NR; zero past kc and past column nc.
KILN_BF16_FUNCTION inline void PackPairsOfB(const MatRef& b, std::size_t k0, std::size_t kc,
                                            std::size_t j0, std::size_t nc,
                                            std::uint32_t* HWY_RESTRICT dst) {
  const std::size_t pairs = (kc + 1) / 2;
  alignas(64) float first[16], second[16];
  for (std::size_t s = 0; s < nc; s += kBf16NR, dst += pairs * kBf16NR) {
    const std::size_t cols = std::min(kBf16NR, nc - s);
    if (b.rs == 1 && b.cs != 1) {
      // Columns of op(B) contiguous in depth (a transposed B): 32 depths of a column are 16
      // pairs in order; 16 columns of them, transposed, are 16 rows of the sliver.
      for (std::size_t k = 0; k < 2 * pairs; k += 32) {
        const std::size_t n = std::min<std::size_t>(32, kc - k);
        const std::size_t p0 = k / 2, count = std::min<std::size_t>(16, pairs - p0);
        for (std::size_t j = 0; j < kBf16NR; j += 16) {
          __m512i rows[16];
          for (std::size_t q = 0; q < 16; ++q) {
            const std::size_t taken = j + q < cols ? n : 0;
            const float* src = b.p + k0 + k + (j0 + s + j + q) * b.cs;
            rows[q] =
                ToBf16(_mm512_maskz_loadu_ps(FirstLanes16(taken), src),
                       _mm512_maskz_loadu_ps(FirstLanes16(taken > 16 ? taken - 16 : 0), src + 16));
          }
          Transpose16x16(rows);
          for (std::size_t q = 0; q < count; ++q)
            _mm512_storeu_si512(dst + (p0 + q) * kBf16NR + j, rows[q]);
        }
      }
      continue;
    }
    for (std::size_t p = 0; p < pairs; ++p) {
      const std::size_t k = 2 * p;
      for (std::size_t j = 0; j < kBf16NR; j += 16) {
        const std::size_t n = cols > j ? std::min<std::size_t>(16, cols - j) : 0;
        const std::size_t n_second = k + 1 < kc ? n : 0;
        const float* row = b.p + (k0 + k) * b.rs + (j0 + s + j) * b.cs;
        __m512 f, g;
        if (b.cs == 1) {
          f = _mm512_maskz_loadu_ps(FirstLanes16(n), row);
          g = _mm512_maskz_loadu_ps(FirstLanes16(n_second), row + b.rs);
        } else {
          for (std::size_t q = 0; q < 16; ++q) {
            first[q] = q < n ? row[q * b.cs] : 0.0f;
            second[q] = q < n_second ? row[b.rs + q * b.cs] : 0.0f;
          }
          f = _mm512_load_ps(first);
          g = _mm512_load_ps(second);
        }
        _mm512_storeu_si512(dst + p * kBf16NR + j, InterleaveToBf16(f, g));
      }
    }
  }
}

/// c[0:m, 0:n] (+)= A · B over `pairs` pairs of depths: A as bfloat16 rows of `lda` pairs
/// (rows past m repeat the last one), B one packed sliver. Edge tiles go through a stack
/// buffer so that the padding columns never reach memory outside C.
template <std::size_t MR, std::size_t NV>
KILN_BF16_FUNCTION HWY_INLINE void
MicroKernelBf16(std::size_t pairs, const std::uint32_t* HWY_RESTRICT a, std::size_t lda,
                const std::uint32_t* HWY_RESTRICT b, float* HWY_RESTRICT c, std::size_t ldc,
                std::size_t m, std::size_t n, bool accumulate) {
  constexpr std::size_t nr = NV * 16;
  const std::uint32_t* rows[MR];
  HWY_UNROLL(8)
  for (std::size_t r = 0; r < MR; ++r) rows[r] = a + std::min(r, m - 1) * lda;
  __m512 acc[MR][NV];
  HWY_UNROLL(16)
  for (std::size_t r = 0; r < MR; ++r) {
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  }
  for (std::size_t p = 0; p < pairs; ++p, b += nr) {
    __m512bh bv[NV];
    HWY_UNROLL(4)
    for (std::size_t v = 0; v < NV; ++v)
      bv[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b + v * 16));
    HWY_UNROLL(8)
    for (std::size_t r = 0; r < MR; ++r) {
      const auto av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(rows[r][p])));
      HWY_UNROLL(4)
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  if (m == MR && n == nr) {
    HWY_UNROLL(8)
    for (std::size_t r = 0; r < MR; ++r) {
      HWY_UNROLL(4)
      for (std::size_t v = 0; v < NV; ++v) {
        float* at = c + r * ldc + v * 16;
        _mm512_storeu_ps(at,
                         accumulate ? _mm512_add_ps(acc[r][v], _mm512_loadu_ps(at)) : acc[r][v]);
      }
    }
    return;
  }
  alignas(64) float tile[MR * nr];
  for (std::size_t r = 0; r < MR; ++r) {
    for (std::size_t v = 0; v < NV; ++v) _mm512_store_ps(tile + r * nr + v * 16, acc[r][v]);
  }
  for (std::size_t r = 0; r < m; ++r) {
    float* row = c + r * ldc;
    const float* t = tile + r * nr;
    for (std::size_t j = 0; j < n; ++j) row[j] = accumulate ? row[j] + t[j] : t[j];
  }
}

/// Single-threaded C[0:m, 0:n] = op(A) · op(B) (+ C when `accumulate`) with the operands
/// rounded to bfloat16 and the products summed in FP32. Scratch, 64-byte aligned: pack_a,
/// gemm_packed_a_floats(m, k) floats, and pack_b, gemm_packed_b_floats(n, k) floats (bfloat16
/// over the same depth fills half of each). Never allocates.
KILN_BF16_FUNCTION inline void GemmBf16(std::size_t m, std::size_t n, std::size_t k,
                                        const MatRef& a, const MatRef& b, float* HWY_RESTRICT c,
                                        std::size_t ldc, bool accumulate,
                                        float* HWY_RESTRICT pack_a, float* HWY_RESTRICT pack_b) {
  if (EmptyGemm(m, n, k, c, ldc, accumulate)) return;
  auto* a_rows = reinterpret_cast<std::uint16_t*>(pack_a);
  auto* b_slivers = reinterpret_cast<std::uint32_t*>(pack_b);
  const std::size_t mc_block = std::max(kBf16MR, gemm_blocking::mc / kBf16MR * kBf16MR);
  const std::size_t nc_block = std::max(kBf16NR, gemm_blocking::nc / kBf16NR * kBf16NR);
  for (std::size_t pc = 0; pc < k; pc += kBf16KC) {
    const std::size_t kc = std::min(kBf16KC, k - pc), pairs = (kc + 1) / 2;
    const bool acc = accumulate || pc > 0;
    for (std::size_t ic = 0; ic < m; ic += mc_block) {
      const std::size_t mc = std::min(mc_block, m - ic);
      PackRowsBf16(a, ic, mc, pc, kc, 2 * pairs, a_rows);
      const auto* a_pairs = reinterpret_cast<const std::uint32_t*>(a_rows);
      for (std::size_t jc = 0; jc < n; jc += nc_block) {
        const std::size_t nc = std::min(nc_block, n - jc);
        PackPairsOfB(b, pc, kc, jc, nc, b_slivers);
        for (std::size_t ir = 0; ir < mc; ir += kBf16MR) {
          float* c_row = c + (ic + ir) * ldc + jc;
          const std::size_t rows = std::min(kBf16MR, mc - ir);
          for (std::size_t jr = 0; jr < nc; jr += kBf16NR) {
            MicroKernelBf16<kBf16MR, kBf16NV>(
                pairs, a_pairs + ir * pairs, pairs, b_slivers + (jr / kBf16NR) * pairs * kBf16NR,
                c_row + jr, ldc, rows, std::min(kBf16NR, nc - jr), acc);
          }
        }
      }
    }
  }
}

/// Op::MatMul multiplying in bfloat16: MatMulKernel's tiles and epilogue over GemmBf16.
inline void MatMulBf16Kernel(const KernelArgs& args) {
  const MatMulDims dims = matmul_dims(args);
  const MatMulLayout layout = matmul_bf16_layout(dims);
  MatMulTiles(args, layout,
              [&](std::size_t m, std::size_t n, std::size_t k, const MatRef& a, const MatRef& b,
                  float* c, std::size_t ldc, float* scratch) {
                GemmBf16(m, n, k, a, b, c, ldc, false, scratch + layout.pack_a,
                         scratch + layout.pack_b);
              });
}

/// Puts this target's bfloat16 kernels into the table where the CPU runs them.
inline void RegisterBf16GemmKernels(KernelTable& table) {
  if (!Bf16KernelsRun()) return;
  table.bf16_products = true;
  table.add(Op::MatMul,
            {"matmul.bf16", &MatMulBf16Kernel, nullptr, &matmul_bf16_workspace, Precision::bf16});
}

#else

inline void RegisterBf16GemmKernels(KernelTable&) {}

#endif

} // namespace kiln::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif
