// Running ggml graphs on the CPU backend, dumping named stage outputs, and the layer
// building blocks that several components share.
#pragma once

#include "core-share.h"
#include "cpu-ops.h"
#include "ggml-backend.h"
#include "ggml-cpp.h"
#include "ggml.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace qt {

// Writes stage outputs as .npy into a directory; disabled when the directory is empty.
// A ggml tensor with ne = (C, T) is written as numpy [T, C]: ggml's innermost dimension is
// numpy's last, so no transpose is needed.
class stage_dumper {
public:
    explicit stage_dumper(std::string dir = {}) : dir_(std::move(dir)) {}
    bool enabled() const { return !dir_.empty(); }
    void write(const std::string & name, const ggml_tensor * t) const;
    void write(const std::string & name, const float * data, const std::vector<int64_t> & shape) const;
    void write(const std::string & name, const int32_t * data, const std::vector<int64_t> & shape) const;

private:
    std::string dir_;
};

// A no_alloc context for the metadata of `n_tensors` tensors, plus room for a graph of that many
// nodes when `with_graph`. Throws qt::error (QT_STATUS_OUT_OF_MEMORY) naming `what`.
ggml_context_ptr new_metadata_context(size_t n_tensors, bool with_graph, const char * what);

// A tensor's values as f32 host values, whatever its stored type (f32, f16 or quantized).
// Throws qt::error for a type ggml cannot convert.
std::vector<float> tensor_f32(const ggml_tensor * t);

// Where graphs run: the CPU (cpu_backend: the engine's thread pool and its own kernels) or a
// device of a ggml device backend (device_backend: a GPU through Vulkan, CUDA or Metal), whose
// graphs are built from ggml's standard ops only.
class compute_backend {
public:
    virtual ~compute_backend() = default;

    virtual ggml_backend_t get() const = 0;
    // Whether graphs for it may use the engine's CPU kernels (custom ops, cpu-ops.h).
    virtual bool runs_cpu_kernels() const = 0;
    // Computes a graph that is already allocated; throws QT_STATUS_CANCELLED when the cancel
    // check stopped it and QT_STATUS_FAILED naming `what` on any other failure.
    virtual void compute(ggml_cgraph * graph, const char * what) const = 0;
    // For a graph with ops this backend lacks (the engine's CPU kernels in a device's graph): a
    // scheduler that runs those on the CPU and the rest here, copying between them. Null where
    // every op runs here (the CPU). `max_nodes`: the graph's node capacity.
    virtual ggml_backend_sched_ptr new_scheduler(size_t /*max_nodes*/) const { return nullptr; }
    // One compute-buffer allocator for every graph: it grows to the largest graph seen and is
    // reused, so repeated calls do not fault in fresh pages.
    ggml_gallocr_t allocator() const;
    // Frees the compute buffer once it has grown past what typical requests need (a long
    // reference clip can take a gigabyte), so an idle engine does not hold it.
    void trim_allocator() const noexcept;

protected:
    // Derived destructors call this first: the compute buffer goes before the backend it serves.
    void release_allocator() noexcept { allocr_.reset(); }

private:
    mutable ggml_gallocr_ptr allocr_;
};

// One CPU backend with a persistent thread pool. Owned by the context and shared by all
// components so threads are created once.
//
// With `share_cores`, each graph runs on as many threads as other processes leave cores free
// (core-share.h), between 1 and `n_threads`, re-measured every quarter second; otherwise always
// on `n_threads`. Idle workers sleep instead of polling for the next graph, so a pool that
// shrank does not keep burning the cores it gave back.
class cpu_backend : public compute_backend {
public:
    explicit cpu_backend(int n_threads, bool share_cores = false);
    ~cpu_backend() override;
    cpu_backend(const cpu_backend &) = delete;
    cpu_backend & operator=(const cpu_backend &) = delete;

    ggml_backend_t get() const override { return backend_.get(); }
    bool           runs_cpu_kernels() const override { return true; }
    int            n_threads() const { return n_threads_; }

    void compute(ggml_cgraph * graph, const char * what) const override;
    // While set, graph computations poll `cancelled` between nodes and stop early
    // (graph_run::compute then throws QT_STATUS_CANCELLED). nullptr clears it.
    void set_cancel(const std::function<bool()> * cancelled) const;

private:
    // ggml's CPU backend is loaded at run time (backend-loader.h), so its own functions are
    // reached through its registry.
    using threadpool_new_t = ggml_threadpool * (*) (ggml_threadpool_params *);
    using threadpool_free_t = void (*)(ggml_threadpool *);
    using set_threadpool_t = void (*)(ggml_backend_t, ggml_threadpool *);

    ggml_backend_ptr  backend_;
    ggml_backend_set_n_threads_t      set_n_threads_ = nullptr;
    ggml_backend_set_abort_callback_t set_abort_callback_ = nullptr;
    threadpool_free_t                 threadpool_free_ = nullptr;
    ggml_threadpool * threadpool_ = nullptr;
    int               n_threads_;
    bool              share_cores_;
    mutable core_monitor cores_;
    mutable int       active_threads_;
};

// A device of a ggml device backend (devices_loaded(), backend-loader.h): its graphs are built
// from ggml's standard ops, their weights and caches live in its memory. `host` runs what the
// device cannot (new_scheduler), and must outlive it.
class device_backend : public compute_backend {
public:
    device_backend(ggml_backend_dev_t device, const cpu_backend & host);
    ~device_backend() override;
    device_backend(const device_backend &) = delete;
    device_backend & operator=(const device_backend &) = delete;

    ggml_backend_t get() const override { return backend_.get(); }
    bool           runs_cpu_kernels() const override { return false; }
    void           compute(ggml_cgraph * graph, const char * what) const override;
    ggml_backend_sched_ptr new_scheduler(size_t max_nodes) const override;

private:
    ggml_backend_ptr    backend_;
    const cpu_backend & host_;
};

// Allocates a graph through `sched` (a compute_backend's new_scheduler) once, for computing it
// again and again (compute_scheduled); throws QT_STATUS_OUT_OF_MEMORY naming `what`.
void alloc_scheduled(ggml_backend_sched_t sched, ggml_cgraph * graph, const char * what);
void compute_scheduled(ggml_backend_sched_t sched, ggml_cgraph * graph, const char * what);

// Builds one graph, allocates it, fills its inputs, computes it and dumps its stages (on a
// device, from standard ops only):
//
//     graph_run run(backend, dumper, 4096);
//     ggml_tensor * x = run.input_f32("mel", mel.data(), {n_mels, n_frames});
//     ggml_tensor * y = build(run.ctx(), x, ...);   // calls run.stage(t, "name") on the way
//     run.compute(y);
//     run.read(y, out);
class graph_run {
public:
    graph_run(const compute_backend & backend, const stage_dumper & dumper, size_t max_nodes);
    ~graph_run();  // outputs are read before this; it may free the compute buffer

    ggml_context * ctx() const { return ctx_.get(); }

    // Graph inputs, copied in after allocation. `ne` is in ggml order (innermost first).
    ggml_tensor * input_f32(const char * name, const float * data, std::vector<int64_t> ne) {
        return input(name, GGML_TYPE_F32, data, std::move(ne));
    }
    ggml_tensor * input_i32(const char * name, const int32_t * data, std::vector<int64_t> ne) {
        return input(name, GGML_TYPE_I32, data, std::move(ne));
    }
    // Any type: `data` holds ggml_nbytes of the tensor (f16 or quantised rows, say).
    ggml_tensor * input(const char * name, ggml_type type, const void * data, std::vector<int64_t> ne);

    // Names a stage output and keeps it for the dump when dumping is enabled.
    ggml_tensor * stage(ggml_tensor * t, const std::string & name);

    // Computes `t` too (a second output of the graph) and keeps it readable afterwards.
    ggml_tensor * output(ggml_tensor * t);

    // Computes everything `result` depends on (and the dumped stages). Throws qt::error.
    void compute(ggml_tensor * result);

    std::vector<float>   read_f32(const ggml_tensor * t) const;
    std::vector<int32_t> read_i32(const ggml_tensor * t) const;

private:
    struct pending_input {
        ggml_tensor *        tensor;
        std::vector<uint8_t> bytes;
    };

    const compute_backend &    backend_;
    standard_ops_scope         standard_ops_;  // for a device: the graph has no CPU kernels
    const stage_dumper &       dumper_;
    size_t                     max_nodes_;
    ggml_context_ptr           ctx_;
    std::vector<pending_input> inputs_;
    std::vector<ggml_tensor *> outputs_;
    std::vector<std::pair<std::string, ggml_tensor *>> stages_;
};

// ---- building blocks -------------------------------------------------------------------------
// Every activation is channels-innermost, ne = (C, T) (numpy [T, C]), for convolutions and
// transformers alike, so no stage transposes. Convolution weights are stored by the converter
// as ne = (C_in, K, C_out) (torch [C_out, K, C_in]): reshaped to (K * C_in, C_out) they are the
// matrix of a convolution over sliding windows, and tap k is the row-strided matrix
// w[:, k, :]. f32 products go through cpu-ops.h's fused GEMM.

// Pads the time axis (ne[1]) of x = (C, T) by `left` and `right` frames; the result is
// contiguous even when x is a strided view (a channel slice, say).
ggml_tensor * pad_time(ggml_context * ctx, ggml_tensor * x, int left, int right, pad_mode mode);

// Unpadded 1-D convolution: one matrix product over sliding windows of x (dilation 1, no copy),
// or over its gathered taps (dilated: an im2col copy, which one deep GEMM repays many times
// over K shallow ones); no f16 rounding of the input as in ggml_conv_1d. x = (C_in, T), w = (C_in, K, C_out) -> (C_out, (T - dilation (K - 1) - 1)
// / stride + 1). Adds b (C_out) and `residual` (C_out, T_out) when given; the residual's memory
// becomes the output's, so it must have no other later use.
ggml_tensor * conv1d(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, int stride,
                     int dilation, ggml_tensor * residual = nullptr);

// Sliding windows of `k` consecutive frames of x = (C, T), hop `stride`, as a strided view
// (k * C, (T - k) / stride + 1) that overlaps itself instead of copying (im2col without the
// buffer): column t is frames t * stride .. t * stride + k - 1, channels innermost. x must be
// contiguous. Only ops that honour strides may read it (ggml_mul_mat as src1, ggml_cont).
ggml_tensor * sliding_windows(ggml_context * ctx, ggml_tensor * x, int64_t k, int64_t stride);

// LayerNorm over ne[0] with affine weight and bias (the wheel's ggml has no fused op).
ggml_tensor * layer_norm(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w, ggml_tensor * b, float eps);

} // namespace qt
