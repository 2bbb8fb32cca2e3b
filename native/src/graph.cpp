#include "graph.h"

#include "backend-loader.h"
#include "cpu-ops.h"
#include "log.h"
#include "npy.h"

#include "ggml-alloc.h"

#include <cstring>
#include <new>
#include <string>

namespace qt {

// ---- stage_dumper ----------------------------------------------------------------------------

void stage_dumper::write(const std::string & name, const float * data, const std::vector<int64_t> & shape) const {
    npy_write(dir_ + "/" + name + ".npy", data, shape);
}

void stage_dumper::write(const std::string & name, const int32_t * data, const std::vector<int64_t> & shape) const {
    npy_write(dir_ + "/" + name + ".npy", data, shape);
}

void stage_dumper::write(const std::string & name, const ggml_tensor * t) const {
    std::vector<int64_t> shape;
    for (int d = ggml_n_dims(t) - 1; d >= 0; --d) {
        shape.push_back(t->ne[d]);
    }
    const int64_t n = ggml_nelements(t);
    if (t->type == GGML_TYPE_I32) {
        std::vector<int32_t> data(size_t(n), 0);
        ggml_backend_tensor_get(t, data.data(), 0, size_t(n) * sizeof(int32_t));
        write(name, data.data(), shape);
        return;
    }
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) {
        throw error(QT_STATUS_FAILED, format("stage '%s' is not a contiguous f32 tensor", name.c_str()));
    }
    std::vector<float> data(size_t(n), 0.0f);
    ggml_backend_tensor_get(t, data.data(), 0, size_t(n) * sizeof(float));
    write(name, data.data(), shape);
}

ggml_context_ptr new_metadata_context(size_t n_tensors, bool with_graph, const char * what) {
    ggml_init_params params = {
        /*.mem_size   =*/ ggml_tensor_overhead() * n_tensors + (with_graph ? ggml_graph_overhead_custom(n_tensors, false) : 0),
        /*.mem_buffer =*/ nullptr,
        /*.no_alloc   =*/ true,
    };
    ggml_context_ptr ctx(ggml_init(params));
    if (!ctx) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("cannot allocate the %s", what));
    }
    return ctx;
}

std::vector<float> tensor_f32(const ggml_tensor * t) {
    const int64_t n = ggml_nelements(t);
    std::vector<float> out(size_t(n), 0.0f);
    if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_get(t, out.data(), 0, size_t(n) * sizeof(float));
        return out;
    }
    const ggml_type_traits * traits = ggml_get_type_traits(t->type);
    if (!traits->to_float) {
        throw error(QT_STATUS_INVALID_PARAMS, format("tensor '%s' has unsupported type %s", t->name, ggml_type_name(t->type)));
    }
    std::vector<uint8_t> raw(ggml_nbytes(t));
    ggml_backend_tensor_get(t, raw.data(), 0, raw.size());
    traits->to_float(raw.data(), out.data(), n);
    return out;
}

// ---- compute_backend -------------------------------------------------------------------------

ggml_gallocr_t compute_backend::allocator() const {
    if (!allocr_) {
        allocr_.reset(ggml_gallocr_new(ggml_backend_get_default_buffer_type(get())));
        if (!allocr_) {
            throw error(QT_STATUS_OUT_OF_MEMORY, "cannot create the compute buffer allocator");
        }
    }
    return allocr_.get();
}

void compute_backend::trim_allocator() const noexcept {
    constexpr size_t k_keep_bytes = size_t(512) << 20;
    if (allocr_ && ggml_gallocr_get_buffer_size(allocr_.get(), 0) > k_keep_bytes) {
        allocr_.reset();
    }
}

// ---- cpu_backend -----------------------------------------------------------------------------

cpu_backend::cpu_backend(int n_threads, bool share_cores)
    : n_threads_(n_threads), share_cores_(share_cores), active_threads_(n_threads) {
    const cpu_backend_info & cpu = cpu_backend_loaded();
    backend_.reset(ggml_backend_dev_init(cpu.device, nullptr));
    if (!backend_) {
        throw error(QT_STATUS_FAILED, "cannot initialise ggml's CPU backend");
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(cpu.device);
    auto proc = [&](const char * name) {
        void * f = ggml_backend_reg_get_proc_address(reg, name);
        if (!f) {
            throw error(QT_STATUS_FAILED, format("ggml's CPU backend lacks %s", name));
        }
        return f;
    };
    set_n_threads_ = reinterpret_cast<ggml_backend_set_n_threads_t>(proc("ggml_backend_set_n_threads"));
    set_abort_callback_ = reinterpret_cast<ggml_backend_set_abort_callback_t>(proc("ggml_backend_set_abort_callback"));
    threadpool_free_ = reinterpret_cast<threadpool_free_t>(proc("ggml_threadpool_free"));
    auto threadpool_new = reinterpret_cast<threadpool_new_t>(proc("ggml_threadpool_new"));
    auto set_threadpool = reinterpret_cast<set_threadpool_t>(proc("ggml_backend_cpu_set_threadpool"));
    ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    // ggml's default polls for the next graph for millions of spins; a worker left out of a
    // smaller graph would keep a core busy for nothing. Waking a sleeping worker costs tens of
    // microseconds per graph, a few graphs per 80 ms frame.
    tpp.poll = 0;
    threadpool_ = threadpool_new(&tpp);
    if (!threadpool_) {
        throw error(QT_STATUS_FAILED, format("cannot start a pool of %d threads", n_threads));
    }
    set_n_threads_(backend_.get(), n_threads);
    set_threadpool(backend_.get(), threadpool_);
}

cpu_backend::~cpu_backend() {
    release_allocator();
    backend_.reset();
    if (threadpool_) {
        threadpool_free_(threadpool_);
    }
}

void cpu_backend::compute(ggml_cgraph * graph, const char * what) const {
    if (share_cores_) {
        const double free = cores_.free_cores();
        const int    n = threads_for_free_cores(free, n_threads_);
        if (n != active_threads_) {
            QT_LOG_INFO("[Perf] threads: %d -> %d (%.1f of %d cores free)", active_threads_, n, free, cores_.n_cores());
            set_n_threads_(backend_.get(), n);
            active_threads_ = n;
        }
    }
    const ggml_status status = ggml_backend_graph_compute(backend_.get(), graph);
    if (status == GGML_STATUS_ABORTED) {
        throw error(QT_STATUS_CANCELLED, "synthesis cancelled");
    }
    if (status != GGML_STATUS_SUCCESS) {
        throw error(QT_STATUS_FAILED, format("%s failed", what));
    }
}

void cpu_backend::set_cancel(const std::function<bool()> * cancelled) const {
    if (!cancelled) {
        set_abort_callback_(backend_.get(), nullptr, nullptr);
        return;
    }
    set_abort_callback_(
        backend_.get(), [](void * data) { return (*static_cast<const std::function<bool()> *>(data))(); },
        const_cast<std::function<bool()> *>(cancelled));
}

// ---- device_backend --------------------------------------------------------------------------

namespace {

// f(), with a device backend's own C++ exceptions (ggml-vulkan throws vk:: errors where its
// allocations fail) as qt::error: out of memory where they say so, so that the engine's
// fallback to the CPU sees them as it sees a returned status.
template <class F>
auto on_device(const char * what, F && f) -> decltype(f()) {
    try {
        return f();
    } catch (const error &) {
        throw;
    } catch (const std::bad_alloc &) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("%s: out of memory", what));
    } catch (const std::exception & e) {
        const std::string text = e.what();
        const bool memory = text.find("OutOfDeviceMemory") != std::string::npos ||
                            text.find("OutOfHostMemory") != std::string::npos ||
                            text.find("out of memory") != std::string::npos;
        throw error(memory ? QT_STATUS_OUT_OF_MEMORY : QT_STATUS_FAILED, format("%s: %s", what, text.c_str()));
    }
}

} // namespace

device_backend::device_backend(ggml_backend_dev_t device, const cpu_backend & host) : host_(host) {
    backend_.reset(on_device("starting the device", [&] { return ggml_backend_dev_init(device, nullptr); }));
    if (!backend_) {
        throw error(QT_STATUS_FAILED, format("cannot start the device %s (%s)", ggml_backend_dev_name(device),
                                             ggml_backend_dev_description(device)));
    }
}

device_backend::~device_backend() {
    release_allocator();
    backend_.reset();
}

void device_backend::compute(ggml_cgraph * graph, const char * what) const {
    // A backend aborts the process on an op it lacks: refuse the graph with a message instead.
    for (int i = 0; i < ggml_graph_n_nodes(graph); ++i) {
        const ggml_tensor * node = ggml_graph_node(graph, i);
        if (!ggml_backend_supports_op(backend_.get(), node)) {
            throw error(QT_STATUS_FAILED, format("%s: %s cannot compute %s (%s of %s)", what,
                                                 ggml_backend_name(backend_.get()), ggml_op_desc(node), node->name,
                                                 ggml_type_name(node->type)));
        }
    }
    const ggml_status status = on_device(what, [&] { return ggml_backend_graph_compute(backend_.get(), graph); });
    if (status != GGML_STATUS_SUCCESS) {
        throw error(status == GGML_STATUS_ALLOC_FAILED ? QT_STATUS_OUT_OF_MEMORY : QT_STATUS_FAILED,
                    format("%s failed on %s (%s)", what, ggml_backend_name(backend_.get()),
                           ggml_status_to_string(status)));
    }
}

ggml_backend_sched_ptr device_backend::new_scheduler(size_t max_nodes) const {
    ggml_backend_t backends[] = { backend_.get(), host_.get() };  // ggml wants the CPU last
    // its tables hold every tensor of the graph (leaves too) and the copies between the backends
    const size_t size = 4 * max_nodes + 1024;
    ggml_backend_sched_ptr sched(ggml_backend_sched_new(backends, nullptr, 2, size, false, false));
    if (!sched) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "cannot create a graph scheduler");
    }
    return sched;
}

void alloc_scheduled(ggml_backend_sched_t sched, ggml_cgraph * graph, const char * what) {
    if (!on_device(what, [&] { return ggml_backend_sched_alloc_graph(sched, graph); })) {
        throw error(QT_STATUS_OUT_OF_MEMORY, format("not enough memory for the %s", what));
    }
}

void compute_scheduled(ggml_backend_sched_t sched, ggml_cgraph * graph, const char * what) {
    const ggml_status status = on_device(what, [&] { return ggml_backend_sched_graph_compute(sched, graph); });
    if (status != GGML_STATUS_SUCCESS) {
        throw error(status == GGML_STATUS_ABORTED ? QT_STATUS_CANCELLED : QT_STATUS_FAILED,
                    format("%s failed (%s)", what, ggml_status_to_string(status)));
    }
}

// ---- graph_run -------------------------------------------------------------------------------

graph_run::graph_run(const compute_backend & backend, const stage_dumper & dumper, size_t max_nodes)
    : backend_(backend), standard_ops_(!backend.runs_cpu_kernels()), dumper_(dumper), max_nodes_(max_nodes) {
    ctx_ = new_metadata_context(max_nodes, true, "graph context");
}

ggml_tensor * graph_run::input(const char * name, ggml_type type, const void * data, std::vector<int64_t> ne) {
    ne.resize(4, 1);
    ggml_tensor * t = ggml_new_tensor_4d(ctx_.get(), type, ne[0], ne[1], ne[2], ne[3]);
    ggml_set_name(t, name);
    ggml_set_input(t);
    const auto * bytes = static_cast<const uint8_t *>(data);
    inputs_.push_back({ t, std::vector<uint8_t>(bytes, bytes + ggml_nbytes(t)) });
    return t;
}

ggml_tensor * graph_run::stage(ggml_tensor * t, const std::string & name) {
    ggml_set_name(t, name.c_str());
    if (dumper_.enabled()) {
        if (!ggml_is_contiguous(t)) {
            t = ggml_cont(ctx_.get(), t);
            ggml_set_name(t, name.c_str());
        }
        ggml_set_output(t);
        stages_.emplace_back(name, t);
    }
    return t;
}

ggml_tensor * graph_run::output(ggml_tensor * t) {
    ggml_set_output(t);
    outputs_.push_back(t);
    return t;
}

void graph_run::compute(ggml_tensor * result) {
    ggml_set_output(result);
    ggml_cgraph * graph = ggml_new_graph_custom(ctx_.get(), max_nodes_, false);
    for (auto & s : stages_) {
        ggml_build_forward_expand(graph, s.second);
    }
    for (ggml_tensor * t : outputs_) {
        ggml_build_forward_expand(graph, t);
    }
    ggml_build_forward_expand(graph, result);

    // The allocator is shared by every graph, and ggml_gallocr_alloc_graph reuses its previous
    // plan whenever the node and leaf counts match without comparing the tensors: plan anew.
    ggml_gallocr_t allocr = backend_.allocator();
    if (!ggml_gallocr_reserve(allocr, graph) || !ggml_gallocr_alloc_graph(allocr, graph)) {
        throw error(QT_STATUS_OUT_OF_MEMORY, "not enough memory for the compute graph");
    }
    for (auto & in : inputs_) {
        ggml_backend_tensor_set(in.tensor, in.bytes.data(), 0, in.bytes.size());
    }
    backend_.compute(graph, "graph computation");
    for (auto & s : stages_) {
        dumper_.write(s.first, s.second);
    }
}

graph_run::~graph_run() { backend_.trim_allocator(); }

std::vector<float> graph_run::read_f32(const ggml_tensor * t) const {
    std::vector<float> out(size_t(ggml_nelements(t)));
    ggml_backend_tensor_get(t, out.data(), 0, out.size() * sizeof(float));
    return out;
}

std::vector<int32_t> graph_run::read_i32(const ggml_tensor * t) const {
    std::vector<int32_t> out(size_t(ggml_nelements(t)));
    ggml_backend_tensor_get(t, out.data(), 0, out.size() * sizeof(int32_t));
    return out;
}

// ---- building blocks -------------------------------------------------------------------------

ggml_tensor * pad_time(ggml_context * ctx, ggml_tensor * x, int left, int right, pad_mode mode) {
    if (left == 0 && right == 0) {
        return x;
    }
    return pad_frames(ctx, x, left, right, mode);
}

ggml_tensor * conv1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                     int dilation, ggml_tensor * residual) {
    const int64_t c_in = w->ne[0];
    const int64_t K = w->ne[1];
    const int64_t c_out = w->ne[2];
    GGML_ASSERT(x->ne[0] == c_in);
    const int64_t span = dilation * (K - 1) + 1;
    GGML_ASSERT(x->ne[1] >= span);
    const int64_t t_out = (x->ne[1] - span) / stride + 1;

    if (K == 1) {
        ggml_tensor * xs = stride == 1 ? x : ggml_view_2d(ctx, x, c_in, t_out, size_t(stride) * x->nb[1], 0);
        return dense(ctx, ggml_reshape_2d(ctx, w, c_in, c_out), xs, b, residual, true);
    }
    if (dilation == 1) {
        if (!ggml_is_contiguous(x)) {
            x = ggml_cont(ctx, x);
        }
        return dense(ctx, ggml_reshape_2d(ctx, w, c_in * K, c_out), sliding_windows(ctx, x, K, stride), b, residual,
                     true);
    }
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    // Dilated: gather the K taps of every output frame into one (K * C_in, T_out) matrix (a copy
    // K times the input), so the product is one GEMM with a deep K instead of K shallow ones.
    ggml_tensor * taps = ggml_view_2d(ctx, x, x->ne[0], x->ne[1], x->nb[1], 0);
    taps->ne[1] = K;
    taps->ne[2] = t_out;
    taps->nb[1] = size_t(dilation) * x->nb[1];
    taps->nb[2] = size_t(stride) * x->nb[1];
    taps->nb[3] = taps->nb[2] * size_t(t_out);
    ggml_tensor * cols = ggml_reshape_2d(ctx, ggml_cont(ctx, taps), c_in * K, t_out);
    return dense(ctx, ggml_reshape_2d(ctx, w, c_in * K, c_out), cols, b, residual, true);
}

ggml_tensor * sliding_windows(ggml_context * ctx, ggml_tensor * x, int64_t k, int64_t stride) {
    GGML_ASSERT(ggml_is_contiguous(x) && x->ne[2] == 1 && x->ne[3] == 1);
    GGML_ASSERT(k >= 1 && stride >= 1 && x->ne[1] >= k);
    const int64_t n = (x->ne[1] - k) / stride + 1;
    // ggml_view_* checks a view's size as if it were contiguous, which an overlapping view is
    // not, so take a plain view of x and give it the overlapping strides afterwards; its true
    // extent, k * C + (n - 1) * stride * C elements, stays inside x.
    ggml_tensor * v = ggml_view_2d(ctx, x, x->ne[0], x->ne[1], x->nb[1], 0);
    v->ne[0] = k * x->ne[0];
    v->ne[1] = n;
    v->nb[1] = size_t(stride) * x->nb[1];
    v->nb[2] = v->nb[1] * size_t(n);
    v->nb[3] = v->nb[2];
    return v;
}

ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, float eps) {
    ggml_tensor * y = ggml_norm(ctx, x, eps);
    y = ggml_mul(ctx, y, w);
    return b ? ggml_add(ctx, y, b) : y;
}

} // namespace qt
