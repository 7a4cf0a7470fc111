// Shared helpers for the CPU optimizer kernels (cpu_adam.cpp, cpu_adagrad.cpp, cpu_lion.cpp).
//
// Why raw pointers, and the CPython C API instead of <torch/extension.h> or pybind11: the Python
// wrappers (deepspeed.ops.*) check dtype, device, contiguity and sizes and pass data_ptr()s, so
// a kernel's module is one or two functions of plain numbers. The ATen headers made each JIT
// build ~40 CPU s; pybind11's (~110,000 preprocessed lines, and its templates instantiated at
// -O3) still ~11 CPU s of a ~12 s compile. <Python.h> alone is a fraction of a second, so the
// compile is the kernels themselves.
//
// Vectorization: the element loops are plain `#pragma omp simd` loops built with -O3
// -fno-math-errno and the host's SIMD flags (-mavx512f / -mavx2 -mfma -mf16c). Checked with
// `objdump -d` on the built .so (AVX-512 host, g++ 12): the hot loops compile to zmm
// vfmadd*ps / vsqrtps / vdivps, the bf16 store to zmm integer adds and shifts (vpaddd,
// vpsrld, vpermt2w) and the fp16 store to vcvtps2ph. Tails that are not a multiple of the SIMD
// width go through the compiler's scalar epilogue, so any n >= 0 is valid.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>  // first, as the C API asks

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ds_cpu {

// Which low-precision copy of the updated params to write in the same pass (0: none).
enum HalfKind : int { kNone = 0, kBF16 = 1, kFP16 = 2 };

// fp32 -> bf16 with round-to-nearest-even, bit-identical to torch's Tensor.to(torch.bfloat16)
// for every non-NaN value; NaN becomes 0xFFFF (a quiet NaN), as torch's vectorized CPU cast
// writes it. Branch-free so it vectorizes.
inline uint16_t float_to_bf16(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
    const bool is_nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    return is_nan ? uint16_t(0xFFFF) : uint16_t(rounded);
}

// fp32 -> IEEE half, round-to-nearest-even (vcvtps2ph with F16C), as torch's .to(float16).
inline uint16_t float_to_fp16(float value) {
    _Float16 half = static_cast<_Float16>(value);
    uint16_t bits;
    std::memcpy(&bits, &half, sizeof(bits));
    return bits;
}

template <int Half>
inline void store_half(uint16_t* out, int64_t i, float value) {
    if constexpr (Half == kBF16) {
        out[i] = float_to_bf16(value);
    } else if constexpr (Half == kFP16) {
        out[i] = float_to_fp16(value);
    }
}

// Elements per OpenMP work item: 16K floats = 64 KiB per stream, large enough to amortise the
// scheduling and small enough to balance the threads on tensors of a few chunks.
constexpr int64_t kChunk = 1 << 14;

// Runs body(begin, end) over [0, n) in chunks, in parallel when there is more than one chunk.
template <typename Body>
inline void parallel_chunks(int64_t n, const Body& body) {
    const int64_t chunks = (n + kChunk - 1) / kChunk;
    if (chunks <= 1) {
        if (n > 0) body(int64_t(0), n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t begin = c * kChunk;
        body(begin, std::min(n, begin + kChunk));
    }
}

template <typename T>
inline T* as_ptr(std::uintptr_t address) {
    return reinterpret_cast<T*>(address);
}

// The SIMD level this module was compiled for, so the Python side can log it.
inline const char* simd_level() {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__)
    return "avx2";
#else
    return "scalar";
#endif
}

inline void check_half_kind(int half_kind) {
    if (half_kind != kNone && half_kind != kBF16 && half_kind != kFP16) {
        throw std::invalid_argument("half_kind must be 0 (none), 1 (bf16) or 2 (fp16), got " +
                                    std::to_string(half_kind));
    }
}

// Runs an update with the GIL released (the arguments are plain numbers, parsed before); its
// argument checks throw std::invalid_argument, which becomes a Python ValueError.
template <typename Update>
inline PyObject* run_without_gil(const Update& update) {
    std::string error;
    Py_BEGIN_ALLOW_THREADS
    try {
        update();
    } catch (const std::invalid_argument& err) {
        error = err.what();
    }
    Py_END_ALLOW_THREADS
    if (!error.empty()) {
        PyErr_SetString(PyExc_ValueError, error.c_str());
        return nullptr;
    }
    Py_RETURN_NONE;
}

inline PyObject* py_simd_level(PyObject*, PyObject*) { return PyUnicode_FromString(simd_level()); }

}  // namespace ds_cpu

// A keyword-taking module function (``PyArg_ParseTupleAndKeywords``), in a PyMethodDef table.
#define DS_CPU_KEYWORDS_FN(name, fn, doc) \
    {name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(fn)), \
     METH_VARARGS | METH_KEYWORDS, doc}
#define DS_CPU_SIMD_LEVEL_FN \
    {"simd_level", ds_cpu::py_simd_level, METH_NOARGS, "SIMD level compiled for: avx512/avx2/scalar"}

// The module's init function, named after the extension (TORCH_EXTENSION_NAME, which torch's
// JIT and setup.py builds both define) as the import system looks it up: PyInit_<name>.
#define DS_CPU_CAT2(a, b) a##b
#define DS_CPU_CAT(a, b) DS_CPU_CAT2(a, b)
#define DS_CPU_STR2(x) #x
#define DS_CPU_STR(x) DS_CPU_STR2(x)
#define DS_CPU_MODULE(doc, methods)                                                   \
    PyMODINIT_FUNC DS_CPU_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {                 \
        static PyModuleDef definition = {PyModuleDef_HEAD_INIT,                      \
                                         DS_CPU_STR(TORCH_EXTENSION_NAME), doc, -1, methods};\
        return PyModule_Create(&definition);                                         \
    }
