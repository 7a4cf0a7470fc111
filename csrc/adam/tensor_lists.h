// What every multi-tensor optimizer frontend (Adam, LAMB, Lion) checks before a launch: the
// kernels walk raw pointers, so the lists must be on one CUDA device, params and grads of one
// dtype, the state lists of the params' dtype or float32, contiguous, and as long (in tensors
// and per tensor in elements) as params. Errors name the op, the list and the index.
#pragma once

#include <torch/extension.h>

#include <vector>

namespace ds_optim {

// The element-type code the kernels take (DType in ds_cuda_compat.h).
inline int dtype_code(const char* op, const at::ScalarType t) {
    switch (t) {
        case at::kFloat: return 0;
        case at::kHalf: return 1;
        case at::kBFloat16: return 2;
        default:
            TORCH_CHECK(false, op, ": unsupported dtype ", t, " (allowed: float32, float16, bfloat16)");
    }
    return -1;
}

struct CheckedLists {
    std::vector<std::vector<void*>> ptrs;  // per list, the tensors' data pointers
    std::vector<int64_t> sizes;            // elements of each param
    at::ScalarType state_type;             // dtype of the state lists (lists 2..)

    // One array of device pointers per list, as the launchers take them.
    std::vector<void* const*> table() const {
        std::vector<void* const*> out;
        for (const auto& list : ptrs) out.push_back(list.data());
        return out;
    }
};

// `lists`: params, grads, then the optimizer states; `names`: their names for errors. params
// must not be empty.
inline CheckedLists check_tensor_lists(const char* op,
                                       const std::vector<const std::vector<at::Tensor>*>& lists,
                                       const char* const* names) {
    const size_t n = lists[0]->size();
    TORCH_CHECK(n > 0, op, ": ", names[0], " is empty");
    const at::Tensor& first = (*lists[0])[0];
    CheckedLists out;
    out.state_type = lists.size() > 2 && !lists[2]->empty() ? (*lists[2])[0].scalar_type()
                                                            : first.scalar_type();
    TORCH_CHECK(out.state_type == first.scalar_type() || out.state_type == at::kFloat, op, ": ",
                names[2], "[0] has dtype ", out.state_type, "; the optimizer state must have the "
                "params' dtype (", first.scalar_type(), ") or float32");
    out.sizes.resize(n);
    for (size_t i = 0; i < n; ++i) out.sizes[i] = (*lists[0])[i].numel();
    out.ptrs.resize(lists.size());
    for (size_t d = 0; d < lists.size(); ++d) {
        TORCH_CHECK(lists[d]->size() == n, op, ": ", names[d], " has ", lists[d]->size(),
                    " tensors, ", names[0], " has ", n);
        out.ptrs[d].resize(n);
        for (size_t i = 0; i < n; ++i) {
            const at::Tensor& t = (*lists[d])[i];
            TORCH_CHECK(t.is_cuda() && t.device() == first.device(), op, ": ", names[d], "[", i,
                        "] is on ", t.device(), ", expected ", first.device());
            const at::ScalarType expected = d < 2 ? first.scalar_type() : out.state_type;
            TORCH_CHECK(t.scalar_type() == expected, op, ": ", names[d], "[", i, "] has dtype ",
                        t.scalar_type(), ", expected ", expected);
            TORCH_CHECK(t.is_contiguous(), op, ": ", names[d], "[", i, "] is not contiguous");
            TORCH_CHECK(t.numel() == out.sizes[i], op, ": ", names[d], "[", i, "] has ",
                        t.numel(), " elements, ", names[0], "[", i, "] has ", out.sizes[i]);
            out.ptrs[d][i] = t.data_ptr();
        }
    }
    return out;
}

}  // namespace ds_optim
