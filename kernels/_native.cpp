// Autograd nodes in C++ for the eager calls of layer_norm, rms_norm, gelu_tanh and swiglu.
//
// Through a Python autograd.Function a small op's forward and backward cost the host more than
// the GPU spends on them (docs/kernels.md, "Host overhead"): the Function's own machinery, the
// backward run in Python on autograd's device thread, the Python launches, the Python checks
// before them. Here a call is one C++ entry: it checks that the call is one a node takes, finds
// the compiled kernels and the current stream, allocates with ATen, launches the Triton kernels
// through the driver's cuLaunchKernel and records a node whose backward runs on autograd's
// device thread like torch's own nodes. Where the call is not one it takes, the entry returns
// None and the Python path runs: it raises the errors, and it is the reference.
//
// Python (_native.py) compiles each kernel for a specialization, checks that its parameters are
// the ones listed here, and registers per kernel its CUfunction, warps and shared memory under
// the key of the call (`key_of`), with the call's stream. A node takes only contiguous, 16-byte
// aligned CUDA inputs with more than one row and column (Triton would specialize a 1 away) and
// 32-bit element counts, so the parameters below are those of every such specialization.

#include <torch/extension.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <dlfcn.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace torch::autograd {
// Torch before 2.13 frees nodes with it (autograd's graph is shared_ptr there); declared here
// so that this file builds against both.
TORCH_API void deleteNode(Node* function);
}  // namespace torch::autograd

namespace {

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;


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

// A compiled kernel: its CUfunction, threads per program and dynamic shared memory.
struct Kernel {
  void* function;
  unsigned threads;
  unsigned shared;
};

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


// ---- what a node takes -------------------------------------------------------------------

enum Op : uint64_t { kGelu = 0, kSwiglu = 1, kRMSNorm = 2, kLayerNorm = 3 };
constexpr size_t kKernels[] = {2, 2, 3, 3};  // compiled kernels per op
constexpr size_t kExtras[] = {1, 1, 2, 2};   // then: the block size; or programs, partial sums' columns

// The parsed arguments of a call a node can take, and the key of its kernels: the op, device,
// dtypes, bias, row length and how Triton specializes the count (rows or elements) it is given.
struct Call {
  Op op;
  at::Tensor x, w, b;  // gelu: x; swiglu: a, b as x, w; norms: x, weight, bias (or undefined)
  double eps = 0;
  uint64_t key = 0;
};

// The thread's state lets the raw kernels run: grad mode on, no dispatch mode (fake, proxy,
// user modes), no functorch transform (vmap, grad).
bool state_allows() {
  return at::GradMode::is_enabled() && !c10::impl::TorchDispatchModeTLS::any_modes_set() &&
         !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

constexpr c10::DispatchKeySet kWrapped({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot,
                                        c10::DispatchKey::FuncTorchBatched,
                                        c10::DispatchKey::FuncTorchGradWrapper, c10::DispatchKey::Functionalize,
                                        c10::DispatchKey::Conjugate, c10::DispatchKey::Negative});

// A plain torch.Tensor or nn.Parameter (no subclass, no wrapper) on CUDA, contiguous, 16-byte
// aligned, with no forward-mode gradient.
bool plain_cuda(py::handle h, at::Tensor& out) {
  if (!THPVariable_CheckExact(h.ptr())) return false;
  const at::Tensor& t = THPVariable_Unpack(h.ptr());
  if (!t.is_cuda() || t.key_set().has_any(kWrapped) || !t.is_contiguous()) return false;
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0 || t._fw_grad(0).defined()) return false;
  out = t;
  return true;
}

bool same_place(const at::Tensor& a, const at::Tensor& b) { return a.get_device() == b.get_device(); }

uint64_t key_of(Op op, const at::Tensor& x, at::ScalarType w_dtype, bool has_bias, int64_t cols, int64_t count) {
  return static_cast<uint64_t>(op) | (static_cast<uint64_t>(x.get_device()) & 0xff) << 4 |
         static_cast<uint64_t>(x.scalar_type()) << 12 | static_cast<uint64_t>(w_dtype) << 20 |
         static_cast<uint64_t>(has_bias) << 28 | static_cast<uint64_t>(count % 16 == 0) << 29 |
         static_cast<uint64_t>(cols) << 32;
}

// Elementwise: gelu_tanh(x), swiglu(a, b).
std::optional<Call> parse_elementwise(Op op, py::handle a, py::handle b) {
  Call c{op};
  if (!state_allows() || !plain_cuda(a, c.x)) return std::nullopt;
  if (op == kSwiglu) {
    if (!plain_cuda(b, c.w) || !same_place(c.x, c.w) || c.w.scalar_type() != c.x.scalar_type() ||
        !c.w.sizes().equals(c.x.sizes()))
      return std::nullopt;
  }
  int64_t n = c.x.numel();
  bool grad = c.x.requires_grad() || (c.w.defined() && c.w.requires_grad());
  if (n <= 1 || n >= (int64_t(1) << 31) || !grad) return std::nullopt;
  c.key = key_of(op, c.x, c.x.scalar_type(), false, 0, n);
  return c;
}

// Norms: rms_norm(x, weight, eps), layer_norm(x, weight, bias or None, eps).
std::optional<Call> parse_norm(Op op, py::handle x, py::handle w, py::handle b, py::handle eps) {
  Call c{op};
  if (!state_allows() || !plain_cuda(x, c.x) || !plain_cuda(w, c.w) || !PyFloat_Check(eps.ptr()))
    return std::nullopt;
  c.eps = PyFloat_AS_DOUBLE(eps.ptr());
  if (c.x.dim() < 1) return std::nullopt;
  int64_t cols = c.x.size(-1), rows = cols > 0 ? c.x.numel() / cols : 0;
  auto is_vector_of_row = [&](const at::Tensor& v) { return v.dim() == 1 && v.size(0) == cols && same_place(v, c.x); };
  if (rows <= 1 || cols <= 1 || c.x.numel() >= (int64_t(1) << 31) || !is_vector_of_row(c.w)) return std::nullopt;
  bool grad = c.x.requires_grad() || c.w.requires_grad();
  if (op == kLayerNorm && !b.is_none()) {
    if (!plain_cuda(b, c.b) || !is_vector_of_row(c.b) || c.b.scalar_type() != c.w.scalar_type()) return std::nullopt;
    grad = grad || c.b.requires_grad();
  }
  if (!grad) return std::nullopt;
  c.key = key_of(op, c.x, c.w.scalar_type(), c.b.defined(), cols, rows);
  return c;
}

// ---- the kernels and streams Python registered -------------------------------------------

struct KernelSet {
  std::vector<Kernel> kernels;
  std::vector<int64_t> extras;
};
using KernelSetPtr = std::shared_ptr<const KernelSet>;

std::unordered_map<uint64_t, KernelSetPtr> kernel_sets;

struct StreamEntry {
  int device;
  int64_t id;
  int64_t raw;
};
std::vector<StreamEntry> streams;  // few: a process uses a handful of streams

// The raw handle of the device's current stream, if Python registered it.
std::optional<int64_t> current_stream(const at::Tensor& x) {
  c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(x.device());
  for (const StreamEntry& e : streams)
    if (e.id == s.id() && e.device == s.device_index()) return e.raw;
  return std::nullopt;
}

// ---- the nodes -------------------------------------------------------------------------

// A node of the autograd graph, however this torch version holds them (shared_ptr before 2.13,
// intrusive_ptr since).
template <class T>
auto make_node() {
  if constexpr (std::is_base_of_v<c10::intrusive_ptr_target, Node>) {
    return c10::make_intrusive<T>();
  } else {
    return std::shared_ptr<T>(new T(), &torch::autograd::deleteNode);
  }
}

// What every node keeps: its kernels and the stream its forward ran on (the engine runs the
// backward on that stream too).
struct NativeNode : public Node {
  KernelSetPtr k;
  int64_t stream = 0;
};

at::Tensor empty_like_below_autograd(const at::Tensor& t) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::empty_like(t);
}

at::Tensor empty_below_autograd(at::IntArrayRef size, const at::TensorOptions& options) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return at::empty(size, options);
}

int64_t rows_of(const at::Tensor& x) { return x.numel() / x.size(-1); }

// gelu_tanh. kernels: forward(x, y, n), backward(dy, x, dx, n); extras: the block size.
struct GeluNode : public NativeNode {
  SavedVariable x_;
  std::string name() const override { return "GeluNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {at::Tensor()};
    ensure_context(grads[0]);
    at::Tensor x = x_.unpack();
    at::Tensor dy = aligned_contiguous(grads[0]);
    at::Tensor dx = empty_like_below_autograd(x);
    int64_t n = x.numel();
    Params p;
    launch(k->kernels[1], cdiv(n, k->extras[0]), stream, p.ptr(dy).ptr(x).ptr(dx).i32(n));
    return {dx};
  }
};

at::Tensor gelu_forward(const Call& c, const KernelSetPtr& k, int64_t stream) {
  ensure_context(c.x);
  at::Tensor y = empty_like_below_autograd(c.x);
  int64_t n = c.x.numel();
  Params p;
  launch(k->kernels[0], cdiv(n, k->extras[0]), stream, p.ptr(c.x).ptr(y).i32(n));
  auto node = make_node<GeluNode>();
  node->set_next_edges(torch::autograd::collect_next_edges(c.x));
  node->x_ = SavedVariable(c.x, false);
  node->k = k;
  node->stream = stream;
  torch::autograd::set_history(y, node);
  return y;
}

// swiglu. kernels: forward(a, b, y, n), backward(dy, a, b, da, db, n); extras: the block size.
struct SwigluNode : public NativeNode {
  SavedVariable a_, b_;
  std::string name() const override { return "SwigluNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    a_.reset_data();
    b_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    ensure_context(grads[0]);
    at::Tensor a = a_.unpack(), b = b_.unpack();
    at::Tensor dy = aligned_contiguous(grads[0]);
    at::Tensor da = empty_like_below_autograd(a), db = empty_like_below_autograd(b);
    int64_t n = a.numel();
    Params p;
    launch(k->kernels[1], cdiv(n, k->extras[0]), stream, p.ptr(dy).ptr(a).ptr(b).ptr(da).ptr(db).i32(n));
    return {da, db};
  }
};

at::Tensor swiglu_forward(const Call& c, const KernelSetPtr& k, int64_t stream) {
  ensure_context(c.x);
  const at::Tensor &a = c.x, &b = c.w;
  at::Tensor y = empty_like_below_autograd(a);
  int64_t n = a.numel();
  Params p;
  launch(k->kernels[0], cdiv(n, k->extras[0]), stream, p.ptr(a).ptr(b).ptr(y).i32(n));
  auto node = make_node<SwigluNode>();
  node->set_next_edges(torch::autograd::collect_next_edges(a, b));
  node->a_ = SavedVariable(a, false);
  node->b_ = SavedVariable(b, false);
  node->k = k;
  node->stream = stream;
  torch::autograd::set_history(y, node);
  return y;
}

// Both norms. kernels: forward (rms_norm: x, w, y, rstd, n_cols, eps; layer_norm: x, w, b, y,
// stats, n_rows, n_cols, eps), backward(dy, x, w, stats, dx, part, n_rows, n_cols, n_programs),
// partial sums(part, dw, db, n_parts, n_cols); extras: the backward's programs and the partial
// sums' columns per program. The statistics are LayerNorm's mean and 1/std, RMSNorm's 1/std.
// Without a bias the weight stands in for its pointers (the kernels, compiled without a bias,
// never read it).
struct NormNode : public NativeNode {
  SavedVariable x_, w_, stats_;
  bool has_bias = false, is_layer_norm = false;
  std::string name() const override { return is_layer_norm ? "LayerNormNode" : "RMSNormNode"; }
  void release_variables() override {
    std::lock_guard<std::mutex> lock(mutex_);
    x_.reset_data();
    w_.reset_data();
    stats_.reset_data();
  }
  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t outputs = has_bias ? 3 : 2;
    if (!grads[0].defined()) return variable_list(outputs);
    ensure_context(grads[0]);
    at::Tensor x = x_.unpack(), w = w_.unpack(), stats = stats_.unpack();
    int64_t rows = rows_of(x), cols = x.size(-1), programs = k->extras[0];
    at::Tensor dy = aligned_contiguous(grads[0]);
    at::Tensor dx = empty_like_below_autograd(x);
    at::Tensor dw = empty_below_autograd({cols}, w.options());
    at::Tensor db = has_bias ? empty_below_autograd({cols}, w.options()) : at::Tensor();
    // Every program stores its row of partial sums (zeros when it had no rows): no zero fill.
    at::Tensor part = empty_below_autograd({has_bias ? 2 : 1, programs, cols}, x.options().dtype(at::kFloat));
    Params p, q;
    launch(k->kernels[1], programs, stream,
           p.ptr(dy).ptr(x).ptr(w).ptr(stats).ptr(dx).ptr(part).i32(rows).i32(cols).i32(programs));
    launch(k->kernels[2], cdiv(cols, k->extras[1]), stream,
           q.ptr(part).ptr(dw).ptr(has_bias ? db : dw).i32(programs).i32(cols));
    if (has_bias) return {dx, dw, db};
    return {dx, dw};
  }
};

at::Tensor norm_forward(const Call& c, const KernelSetPtr& k, int64_t stream) {
  ensure_context(c.x);
  bool layer_norm = c.op == kLayerNorm, has_bias = c.b.defined();
  int64_t rows = rows_of(c.x), cols = c.x.size(-1);
  at::Tensor y = empty_like_below_autograd(c.x);
  at::Tensor stats = empty_below_autograd({layer_norm ? 2 : 1, rows}, c.x.options().dtype(at::kFloat));
  Params p;
  if (layer_norm) {
    p.ptr(c.x).ptr(c.w).ptr(has_bias ? c.b : c.w).ptr(y).ptr(stats).i32(rows).i32(cols).f32(c.eps);
  } else {
    p.ptr(c.x).ptr(c.w).ptr(y).ptr(stats).i32(cols).f32(c.eps);
  }
  launch(k->kernels[0], rows, stream, p);
  auto node = make_node<NormNode>();
  node->set_next_edges(has_bias ? torch::autograd::collect_next_edges(c.x, c.w, c.b)
                                : torch::autograd::collect_next_edges(c.x, c.w));
  node->x_ = SavedVariable(c.x, false);
  node->w_ = SavedVariable(c.w, false);
  node->stats_ = SavedVariable(stats, false);
  node->has_bias = has_bias;
  node->is_layer_norm = layer_norm;
  node->k = k;
  node->stream = stream;
  torch::autograd::set_history(y, node);
  return y;
}

// ---- the entries -----------------------------------------------------------------------

// Runs the call on its node, or returns None where the call is not one a node takes or its
// kernels or stream are not registered yet.
py::object run(const std::optional<Call>& c) {
  if (!c) return py::none();
  auto found = kernel_sets.find(c->key);
  if (found == kernel_sets.end()) return py::none();
  std::optional<int64_t> stream = current_stream(c->x);
  if (!stream) return py::none();
  at::Tensor y;
  switch (c->op) {
    case kGelu: y = gelu_forward(*c, found->second, *stream); break;
    case kSwiglu: y = swiglu_forward(*c, found->second, *stream); break;
    default: y = norm_forward(*c, found->second, *stream); break;
  }
  return py::cast(y);
}

py::object gelu_tanh(py::handle x) { return run(parse_elementwise(kGelu, x, py::none())); }

py::object swiglu(py::handle a, py::handle b) { return run(parse_elementwise(kSwiglu, a, b)); }

py::object rms_norm(py::handle x, py::handle w, py::handle eps) {
  return run(parse_norm(kRMSNorm, x, w, py::none(), eps));
}

py::object layer_norm(py::handle x, py::handle w, py::handle b, py::handle eps) {
  return run(parse_norm(kLayerNorm, x, w, b, eps));
}

// A call given as the op's name and its arguments, as the entry takes them.
std::optional<Call> parse_named(const std::string& name, py::tuple args) {
  if (name == "gelu_tanh") return parse_elementwise(kGelu, args[0], py::none());
  if (name == "swiglu") return parse_elementwise(kSwiglu, args[0], args[1]);
  if (name == "rms_norm") return parse_norm(kRMSNorm, args[0], args[1], py::none(), args[2]);
  if (name == "layer_norm") return parse_norm(kLayerNorm, args[0], args[1], args[2], args[3]);
  TORCH_CHECK(false, "gputune native: no op ", name);
  return std::nullopt;
}

// Whether a node can take the call, its kernels aside: Python compiles them only then.
bool takes(const std::string& name, py::tuple args) { return parse_named(name, args).has_value(); }

// Registers the kernels of the specialization of a call and the device's current stream (its
// id and raw handle). False where the call is not one a node takes.
bool register_call(const std::string& name, py::tuple args, const std::vector<int64_t>& kernels,
                   int64_t stream_id, int64_t raw_stream) {
  std::optional<Call> c = parse_named(name, args);
  if (!c) return false;
  size_t n_kernels = kKernels[c->op], n_extras = kExtras[c->op];
  TORCH_CHECK(kernels.size() == 3 * n_kernels + n_extras, "gputune native: ", name, " takes ",
              3 * n_kernels + n_extras, " ints, got ", kernels.size());
  auto set = std::make_shared<KernelSet>();
  for (size_t i = 0; i < n_kernels; ++i)
    set->kernels.push_back({reinterpret_cast<void*>(kernels[3 * i]), static_cast<unsigned>(32 * kernels[3 * i + 1]),
                            static_cast<unsigned>(kernels[3 * i + 2])});
  set->extras.assign(kernels.end() - n_extras, kernels.end());
  kernel_sets[c->key] = std::move(set);
  int device = c->x.get_device();
  bool known = false;
  for (const StreamEntry& e : streams) known = known || (e.device == device && e.id == stream_id);
  if (!known) streams.push_back({device, stream_id, raw_stream});
  return true;
}

void clear() {
  kernel_sets.clear();
  streams.clear();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("find_driver", &find_driver, "Find cuLaunchKernel in libcuda; False where there is none.");
  m.def("gelu_tanh", &gelu_tanh);
  m.def("swiglu", &swiglu);
  m.def("rms_norm", &rms_norm);
  m.def("layer_norm", &layer_norm);
  m.def("takes", &takes);
  m.def("register", &register_call);
  m.def("clear", &clear);
}
