// Autograd nodes in C++ for the eager calls of layer_norm, rms_norm, gelu_tanh and swiglu.
//
// Through a Python autograd.Function a small op's forward and backward cost the host more than
// the GPU spends on them (docs/kernels.md, "Host overhead"): the Function's own machinery, the
// backward run in Python on autograd's device thread, the Python launches. These nodes do the
// same work as the Python implementations with no Python in between: they allocate with ATen
// and launch the compiled Triton kernels through the driver's cuLaunchKernel, so the backward
// runs on autograd's device thread like torch's own nodes.
//
// Python (_native.py) compiles each kernel for the call's specialization, checks that its
// parameters are the ones listed here, and hands over per kernel its CUfunction, warps and
// shared memory. It calls a node only for contiguous, 16-byte aligned CUDA inputs with more
// than one row and column (Triton would specialize a 1 away) and 32-bit element counts, so the
// parameters below are those of every such specialization.

#include <torch/extension.h>

#include <dlfcn.h>

#include <cstring>
#include <vector>

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// The driver's functions, found in the libcuda that torch has loaded.
using LaunchKernelFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, void*, void**, void**);
using CtxGetCurrentFn = int (*)(void**);
using CtxSetCurrentFn = int (*)(void*);
using DeviceGetFn = int (*)(int*, int);
using PrimaryCtxRetainFn = int (*)(void**, int);
LaunchKernelFn launch_kernel = nullptr;
CtxGetCurrentFn ctx_get_current = nullptr;
CtxSetCurrentFn ctx_set_current = nullptr;
DeviceGetFn device_get = nullptr;
PrimaryCtxRetainFn primary_ctx_retain = nullptr;

bool find_driver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen("libcuda.so.1", RTLD_NOW);
  if (lib == nullptr) return false;
  launch_kernel = reinterpret_cast<LaunchKernelFn>(dlsym(lib, "cuLaunchKernel"));
  ctx_get_current = reinterpret_cast<CtxGetCurrentFn>(dlsym(lib, "cuCtxGetCurrent"));
  ctx_set_current = reinterpret_cast<CtxSetCurrentFn>(dlsym(lib, "cuCtxSetCurrent"));
  device_get = reinterpret_cast<DeviceGetFn>(dlsym(lib, "cuDeviceGet"));
  primary_ctx_retain = reinterpret_cast<PrimaryCtxRetainFn>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
  return launch_kernel && ctx_get_current && ctx_set_current && device_get && primary_ctx_retain;
}

// The driver launches in the calling thread's current context. Autograd's device thread may
// have none: torch skips cudaSetDevice for the device already selected, and an allocation
// served from the cache makes no CUDA call. Make the device's primary context (the one torch
// and Triton use) current there.
void ensure_context(const at::Tensor& t) {
  void* ctx = nullptr;
  TORCH_CHECK(ctx_get_current(&ctx) == 0, "gputune native: cuCtxGetCurrent failed");
  if (ctx != nullptr) return;
  int device = 0;
  TORCH_CHECK(device_get(&device, t.get_device()) == 0, "gputune native: cuDeviceGet failed");
  TORCH_CHECK(primary_ctx_retain(&ctx, device) == 0, "gputune native: cuDevicePrimaryCtxRetain failed");
  TORCH_CHECK(ctx_set_current(ctx) == 0, "gputune native: cuCtxSetCurrent failed");
}

// A compiled kernel: its CUfunction, threads per program and dynamic shared memory. `kernels`
// holds three int64 per kernel, in the order each node documents.
struct Kernel {
  void* function;
  unsigned threads;
  unsigned shared;
};

Kernel kernel_at(const std::vector<int64_t>& kernels, size_t i) {
  return {reinterpret_cast<void*>(kernels.at(3 * i)), static_cast<unsigned>(32 * kernels.at(3 * i + 1)),
          static_cast<unsigned>(kernels.at(3 * i + 2))};
}

// A kernel's parameters as Triton's launcher passes them: pointers, 32-bit ints and floats in
// order, then its two scratch pointers (null: Python only hands over kernels needing none; a
// kernel compiled by a Triton that takes fewer ignores the rest).
class Params {
 public:
  Params& ptr(const at::Tensor& t) { return put(reinterpret_cast<uint64_t>(t.data_ptr())); }
  Params& i32(int64_t v) {
    int32_t x = static_cast<int32_t>(v);
    uint64_t slot = 0;
    std::memcpy(&slot, &x, sizeof x);
    return put(slot);
  }
  Params& f32(double v) {
    float x = static_cast<float>(v);
    uint64_t slot = 0;
    std::memcpy(&slot, &x, sizeof x);
    return put(slot);
  }
  void** finish() {
    put(0);
    put(0);
    return pointers_;
  }

 private:
  Params& put(uint64_t v) {
    TORCH_CHECK(count_ < kMax, "gputune native: too many kernel parameters");
    slots_[count_] = v;
    pointers_[count_] = &slots_[count_];
    ++count_;
    return *this;
  }
  static constexpr int kMax = 16;
  uint64_t slots_[kMax] = {};
  void* pointers_[kMax] = {};
  int count_ = 0;
};

void launch(const Kernel& k, int64_t grid, int64_t stream, Params& params) {
  if (grid <= 0) return;
  int rc = launch_kernel(k.function, static_cast<unsigned>(grid), 1, 1, k.threads, 1, 1, k.shared,
                         reinterpret_cast<void*>(stream), params.finish(), nullptr);
  TORCH_CHECK(rc == 0, "gputune native: cuLaunchKernel failed with CUDA error ", rc);
}

int64_t cdiv(int64_t n, int64_t d) { return (n + d - 1) / d; }

// An incoming gradient: contiguous (a y.sum() gradient arrives expanded, stride 0) and 16-byte
// aligned, as the kernels were compiled for aligned pointers.
at::Tensor aligned_contiguous(const at::Tensor& g) {
  at::Tensor c = g.contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

int64_t rows_of(const at::Tensor& x) { return x.numel() / x.size(-1); }

// The saved kernels, stream and sizes of a node.
void save_launch_state(AutogradContext* ctx, const std::vector<int64_t>& kernels, int64_t stream) {
  ctx->saved_data["kernels"] = kernels;
  ctx->saved_data["stream"] = stream;
}

// gelu_tanh. kernels: forward(x, y, n), backward(dy, x, dx, n); then the block size.
struct GeluNode : public torch::autograd::Function<GeluNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> kernels,
                            int64_t stream) {
    ensure_context(x);
    at::Tensor y = at::empty_like(x);
    int64_t n = x.numel();
    Params p;
    launch(kernel_at(kernels, 0), cdiv(n, kernels.at(6)), stream, p.ptr(x).ptr(y).i32(n));
    ctx->save_for_backward({x});
    save_launch_state(ctx, kernels, stream);
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    ensure_context(grads[0]);
    at::Tensor x = ctx->get_saved_variables()[0];
    std::vector<int64_t> kernels = ctx->saved_data["kernels"].toIntVector();
    int64_t stream = ctx->saved_data["stream"].toInt();
    at::Tensor dy = aligned_contiguous(grads[0]);
    at::Tensor dx = at::empty_like(x);
    int64_t n = x.numel();
    Params p;
    launch(kernel_at(kernels, 1), cdiv(n, kernels.at(6)), stream, p.ptr(dy).ptr(x).ptr(dx).i32(n));
    return {dx, at::Tensor(), at::Tensor()};
  }
};

// swiglu. kernels: forward(a, b, y, n), backward(dy, a, b, da, db, n); then the block size.
struct SwigluNode : public torch::autograd::Function<SwigluNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            std::vector<int64_t> kernels, int64_t stream) {
    ensure_context(a);
    at::Tensor y = at::empty_like(a);
    int64_t n = a.numel();
    Params p;
    launch(kernel_at(kernels, 0), cdiv(n, kernels.at(6)), stream, p.ptr(a).ptr(b).ptr(y).i32(n));
    ctx->save_for_backward({a, b});
    save_launch_state(ctx, kernels, stream);
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    ensure_context(grads[0]);
    auto saved = ctx->get_saved_variables();
    const at::Tensor &a = saved[0], &b = saved[1];
    std::vector<int64_t> kernels = ctx->saved_data["kernels"].toIntVector();
    int64_t stream = ctx->saved_data["stream"].toInt();
    at::Tensor dy = aligned_contiguous(grads[0]);
    at::Tensor da = at::empty_like(a);
    at::Tensor db = at::empty_like(b);
    int64_t n = a.numel();
    Params p;
    launch(kernel_at(kernels, 1), cdiv(n, kernels.at(6)), stream,
           p.ptr(dy).ptr(a).ptr(b).ptr(da).ptr(db).i32(n));
    return {da, db, at::Tensor(), at::Tensor()};
  }
};

// The backward of both norms, whose kernels take the same parameters: the saved x, weight and
// statistics (LayerNorm's mean and 1/std, RMSNorm's 1/std), then dx and dweight (and dbias) from
// the persistent grid's partial sums. Returns dx, dw and db (undefined without a bias).
tensor_list norm_backward(AutogradContext* ctx, const at::Tensor& grad, bool has_bias) {
  auto saved = ctx->get_saved_variables();
  const at::Tensor &x = saved[0], &w = saved[1], &stats = saved[2];
  std::vector<int64_t> kernels = ctx->saved_data["kernels"].toIntVector();
  int64_t stream = ctx->saved_data["stream"].toInt();
  int64_t rows = rows_of(x), cols = x.size(-1), programs = kernels.at(9);
  at::Tensor dy = aligned_contiguous(grad);
  at::Tensor dx = at::empty_like(x);
  at::Tensor dw = at::empty({cols}, w.options());
  at::Tensor db = has_bias ? at::empty({cols}, w.options()) : at::Tensor();
  // Every program stores its row of partial sums (zeros when it had no rows): no zero fill.
  at::Tensor part = at::empty({has_bias ? 2 : 1, programs, cols}, x.options().dtype(at::kFloat));
  Params p, q;
  launch(kernel_at(kernels, 1), programs, stream,
         p.ptr(dy).ptr(x).ptr(w).ptr(stats).ptr(dx).ptr(part).i32(rows).i32(cols).i32(programs));
  launch(kernel_at(kernels, 2), cdiv(cols, kernels.at(10)), stream,
         q.ptr(part).ptr(dw).ptr(has_bias ? db : dw).i32(programs).i32(cols));
  return {dx, dw, db};
}

// rms_norm. kernels: forward(x, w, y, rstd, n_cols, eps), backward(dy, x, w, rstd, dx, part,
// n_rows, n_cols, n_programs), partial sums(part, dw, dw, n_parts, n_cols); then the backward's
// programs and the partial sums' columns per program.
struct RMSNormNode : public torch::autograd::Function<RMSNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps,
                            std::vector<int64_t> kernels, int64_t stream) {
    ensure_context(x);
    int64_t rows = rows_of(x), cols = x.size(-1);
    at::Tensor y = at::empty_like(x);
    at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    Params p;
    launch(kernel_at(kernels, 0), rows, stream, p.ptr(x).ptr(w).ptr(y).ptr(rstd).i32(cols).f32(eps));
    ctx->save_for_backward({x, w, rstd});
    save_launch_state(ctx, kernels, stream);
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    ensure_context(grads[0]);
    tensor_list g = norm_backward(ctx, grads[0], false);  // dx, dw
    return {g[0], g[1], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// layer_norm. kernels: forward(x, w, b, y, stats, n_rows, n_cols, eps), backward(dy, x, w,
// stats, dx, part, n_rows, n_cols, n_programs), partial sums(part, dw, db, n_parts, n_cols);
// then the backward's programs and the partial sums' columns per program. Without a bias the
// weight stands in for its pointers (the kernels, compiled with HAS_BIAS false, never read it).
struct LayerNormNode : public torch::autograd::Function<LayerNormNode> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w,
                            const c10::optional<at::Tensor>& b, double eps, std::vector<int64_t> kernels,
                            int64_t stream) {
    ensure_context(x);
    int64_t rows = rows_of(x), cols = x.size(-1);
    bool has_bias = b.has_value() && b->defined();
    at::Tensor y = at::empty_like(x);
    at::Tensor stats = at::empty({2, rows}, x.options().dtype(at::kFloat));  // mean, 1/std
    Params p;
    launch(kernel_at(kernels, 0), rows, stream,
           p.ptr(x).ptr(w).ptr(has_bias ? *b : w).ptr(y).ptr(stats).i32(rows).i32(cols).f32(eps));
    ctx->save_for_backward({x, w, stats});
    ctx->saved_data["has_bias"] = has_bias;
    save_launch_state(ctx, kernels, stream);
    return y;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    ensure_context(grads[0]);
    tensor_list g = norm_backward(ctx, grads[0], ctx->saved_data["has_bias"].toBool());  // dx, dw, db
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor gelu_tanh(const at::Tensor& x, std::vector<int64_t> kernels, int64_t stream) {
  return GeluNode::apply(x, std::move(kernels), stream);
}

at::Tensor swiglu(const at::Tensor& a, const at::Tensor& b, std::vector<int64_t> kernels, int64_t stream) {
  return SwigluNode::apply(a, b, std::move(kernels), stream);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps, std::vector<int64_t> kernels,
                    int64_t stream) {
  return RMSNormNode::apply(x, w, eps, std::move(kernels), stream);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& b,
                      double eps, std::vector<int64_t> kernels, int64_t stream) {
  return LayerNormNode::apply(x, w, b, eps, std::move(kernels), stream);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("find_driver", &find_driver, "Find cuLaunchKernel in libcuda; False where there is none.");
  m.def("gelu_tanh", &gelu_tanh);
  m.def("swiglu", &swiglu);
  m.def("rms_norm", &rms_norm);
  m.def("layer_norm", &layer_norm);
}
