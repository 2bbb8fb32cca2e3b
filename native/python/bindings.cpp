// pybind11 module vocable._engine: a thin layer over the C API. Arrays cross as numpy,
// the GIL is released while the engine computes, engine log lines go to a Python callable.
#include "qwen3-tts.h"

#include "ggml.h"

#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>

namespace py = pybind11;

namespace {

// Engine text can quote a file's own bytes (a model's metadata, a path), which need not be
// UTF-8: decoded with replacement characters rather than failing in a UnicodeDecodeError.
py::str utf8_text(const char * text, size_t n) {
    PyObject * o = PyUnicode_DecodeUTF8(text, Py_ssize_t(n), "replace");
    if (!o) {
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::str>(o);
}

py::str utf8_text(const char * text) { return utf8_text(text, strlen(text)); }

// Raised for every engine failure; `status` is the qt_status code.
PyObject * g_engine_error = nullptr;

[[noreturn]] void raise_status(int status, const std::string & message) {
    py::object err =
        py::reinterpret_borrow<py::object>(g_engine_error)(utf8_text(message.data(), message.size()), status);
    PyErr_SetObject(g_engine_error, err.ptr());
    throw py::error_already_set();
}

struct log_target {
    py::function callback;
};

void forward_log(qt_log_level level, const char * text, void * user_data) {
    py::gil_scoped_acquire gil;
    try {
        static_cast<log_target *>(user_data)->callback(int(level), utf8_text(text));
    } catch (py::error_already_set & e) {
        e.discard_as_unraisable("vocable engine log callback");
    }
}

// A cancel request for one synthesis, set from any thread; the engine polls it once per frame
// without the GIL.
struct cancel_flag {
    std::atomic<bool> value{ false };
};

void read_sampling(const py::dict & d, qt_sampling & s) {
    for (auto item : d) {
        const std::string key = py::str(item.first);
        if (key == "temperature") {
            s.temperature = item.second.cast<float>();
        } else if (key == "top_k") {
            s.top_k = item.second.cast<int32_t>();
        } else if (key == "top_p") {
            s.top_p = item.second.cast<float>();
        } else if (key == "repetition_penalty") {
            s.repetition_penalty = item.second.cast<float>();
        } else {
            throw py::value_error("unknown sampling parameter '" + key + "'");
        }
    }
}

using f32_array = py::array_t<float, py::array::c_style | py::array::forcecast>;
using i32_array = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// A request's voice, clone mode, language and sampling (text, seed and cap left to the caller);
// `voice` and the arrays must outlive the params.
qt_tts_params voice_params(qt_voice_ref & voice, const f32_array & speaker_embedding,
                           const std::optional<i32_array> & ref_codes, const std::optional<i32_array> & ref_text_ids,
                           const std::string & language, const py::dict & talker_sampling,
                           const py::dict & predictor_sampling) {
    voice.speaker_embedding = const_cast<float *>(speaker_embedding.data());
    voice.n_embd = int32_t(speaker_embedding.shape(0));
    qt_tts_params p = qt_tts_default_params();
    p.voice = &voice;
    if (ref_codes && ref_text_ids) {
        if (ref_codes->ndim() != 2 || ref_text_ids->ndim() != 1) {
            throw py::value_error("ref_codes must be [frames, codebooks] and ref_text_ids 1-D");
        }
        voice.codes = const_cast<int32_t *>(ref_codes->data());
        voice.n_frames = int32_t(ref_codes->shape(0));
        voice.n_codebooks = int32_t(ref_codes->shape(1));
        p.ref_text_ids = ref_text_ids->data();
        p.n_ref_text_ids = int32_t(ref_text_ids->shape(0));
        p.mode = QT_CLONE_IN_CONTEXT;
    }
    p.language = language.c_str();
    read_sampling(talker_sampling, p.talker_sampling);
    read_sampling(predictor_sampling, p.predictor_sampling);
    return p;
}

class engine_context {
public:
    engine_context(const std::string & model_path, int n_threads, const std::optional<std::string> & dump_dir,
                   std::optional<py::function> log_callback, float codec_chunk_sec, bool share_cores,
                   const std::string & device) {
        qt_init_params ip = qt_init_default_params();
        ip.device = device.c_str();
        ip.model_path = model_path.c_str();
        ip.n_threads = n_threads;
        ip.dump_dir = dump_dir ? dump_dir->c_str() : nullptr;
        ip.codec_chunk_sec = codec_chunk_sec;
        ip.share_cores = share_cores ? 1 : 0;
        if (log_callback) {
            log_ = std::make_unique<log_target>(log_target{ *log_callback });
            ip.log_callback = forward_log;
            ip.log_callback_user_data = log_.get();
        }
        {
            py::gil_scoped_release release;
            ctx_ = qt_init(&ip);
        }
        if (!ctx_) {
            raise_status(QT_STATUS_INVALID_PARAMS, qt_last_error());
        }
    }
    ~engine_context() { close(); }

    py::tuple device() const {
        if (!ctx_) {
            raise_status(QT_STATUS_INVALID_PARAMS, "the engine is closed");
        }
        return py::make_tuple(utf8_text(qt_device_in_use(ctx_)), utf8_text(qt_device_fallback(ctx_)));
    }

    void close() {
        if (ctx_) {
            py::gil_scoped_release release;
            qt_free(ctx_);
            ctx_ = nullptr;
        }
    }

    py::dict model_info() const {
        qt_model_info info;
        qt_get_model_info(checked(), &info);
        py::dict d;
        d["sample_rate"] = info.sample_rate;
        d["samples_per_frame"] = info.samples_per_frame;
        d["n_codebooks"] = info.n_codebooks;
        d["codebook_size"] = info.codebook_size;
        d["n_speaker_embd"] = info.n_speaker_embd;
        d["talker_hidden"] = info.talker_hidden;
        d["talker_layers"] = info.talker_layers;
        d["predictor_hidden"] = info.predictor_hidden;
        d["predictor_layers"] = info.predictor_layers;
        d["weight_type"] = ggml_type_name(ggml_type(info.weight_type));
        d["codec_chunk_frames"] = info.codec_chunk_frames;
        d["variant"] = utf8_text(info.variant, strnlen(info.variant, sizeof(info.variant)));
        return d;
    }

    // Returns (speaker_embedding float32 [D], codes int32 [T, n_codebooks]).
    py::tuple extract_voice_ref(py::array_t<float, py::array::c_style | py::array::forcecast> pcm) {
        if (pcm.ndim() != 1) {
            throw py::value_error("pcm must be a 1-D array of mono samples");
        }
        qt_context * ctx = checked();
        qt_voice_ref ref;
        int status;
        {
            py::gil_scoped_release release;
            status = qt_extract_voice_ref(ctx, pcm.data(), int32_t(pcm.shape(0)), &ref);
        }
        if (status != QT_STATUS_OK) {
            raise_status(status, qt_last_error());
        }
        py::array_t<float> embedding(ref.n_embd);
        std::memcpy(embedding.mutable_data(), ref.speaker_embedding, sizeof(float) * size_t(ref.n_embd));
        py::array_t<int32_t> codes({ ref.n_frames, ref.n_codebooks });
        std::memcpy(codes.mutable_data(), ref.codes, sizeof(int32_t) * size_t(ref.n_frames) * size_t(ref.n_codebooks));
        qt_voice_ref_free(&ref);
        return py::make_tuple(embedding, codes);
    }

    // Returns (codes int32 [frames, n_codebooks], pcm float32 [samples], reached_eos).
    // Cancellable from another thread with cancel() or through `flag`; raises EngineError with
    // status STATUS_CANCELLED then.
    py::tuple synthesize(py::array_t<int32_t, py::array::c_style | py::array::forcecast> text_ids,
                         py::array_t<float, py::array::c_style | py::array::forcecast> speaker_embedding,
                         std::optional<py::array_t<int32_t, py::array::c_style | py::array::forcecast>> ref_codes,
                         std::optional<py::array_t<int32_t, py::array::c_style | py::array::forcecast>> ref_text_ids,
                         const std::string & language, py::dict talker_sampling, py::dict predictor_sampling,
                         uint64_t seed, int32_t max_frames, std::optional<py::function> on_chunk,
                         std::shared_ptr<cancel_flag> flag) {
        qt_context * ctx = checked();
        if (text_ids.ndim() != 1 || speaker_embedding.ndim() != 1) {
            throw py::value_error("text_ids and speaker_embedding must be 1-D");
        }
        qt_voice_ref voice{};
        qt_tts_params p = voice_params(voice, speaker_embedding, ref_codes, ref_text_ids, language, talker_sampling,
                                       predictor_sampling);
        p.text_ids = text_ids.data();
        p.n_text_ids = int32_t(text_ids.shape(0));
        p.seed = seed;
        p.max_frames = max_frames;
        // Polled once per frame, without the GIL: the context's cancel() and the request's flag.
        struct cancel_sources {
            std::atomic<bool> * context;
            cancel_flag *       request;
        } cancel{ &cancel_requested_, flag.get() };
        cancel_requested_ = false;
        p.cancel_callback = [](void * user) {
            const auto * c = static_cast<cancel_sources *>(user);
            return c->context->load() || (c->request && c->request->value.load());
        };
        p.cancel_callback_user_data = &cancel;
        // on_chunk(first_frame, codes, pcm) runs with the GIL taken for the call; returning
        // False cancels. An exception in it cancels too and is raised afterwards.
        struct chunk_target {
            py::function                         fn;
            std::optional<py::error_already_set> error;
        } target;
        if (on_chunk) {
            target.fn = *on_chunk;
            p.chunk_callback = [](const qt_chunk * chunk, void * user) {
                auto * t = static_cast<chunk_target *>(user);
                py::gil_scoped_acquire gil;
                try {
                    py::array_t<int32_t> codes({ chunk->n_frames, chunk->n_codebooks }, chunk->codes);
                    py::array_t<float> pcm(chunk->n_samples, chunk->pcm);
                    py::object keep = t->fn(chunk->first_frame, codes, pcm);
                    return keep.is_none() || keep.cast<bool>();
                } catch (py::error_already_set & e) {
                    t->error = std::move(e);
                    return false;
                } catch (const std::exception & e) {  // e.g. a return value that is not a bool
                    PyErr_SetString(PyExc_TypeError, e.what());
                    t->error = py::error_already_set();
                    return false;
                }
            };
            p.chunk_callback_user_data = &target;
        }
        qt_tts_result res;
        int status;
        {
            py::gil_scoped_release release;
            status = qt_synthesize(ctx, &p, &res);
        }
        if (target.error) {
            if (status == QT_STATUS_OK) {
                qt_tts_result_free(&res);
            }
            target.error->restore();
            throw py::error_already_set();
        }
        if (status != QT_STATUS_OK) {
            raise_status(status, qt_last_error());
        }
        py::array_t<int32_t> codes({ res.n_frames, res.n_codebooks });
        std::memcpy(codes.mutable_data(), res.codes, sizeof(int32_t) * size_t(res.n_frames) * size_t(res.n_codebooks));
        py::array_t<float> pcm(py::ssize_t(res.n_samples));
        if (res.n_samples > 0) {
            std::memcpy(pcm.mutable_data(), res.pcm, sizeof(float) * size_t(res.n_samples));
        }
        const bool eos = res.reached_eos;
        qt_tts_result_free(&res);
        return py::make_tuple(codes, pcm, eos);
    }

    // Several texts in one voice, up to max_batch generating side by side (qt_synthesize_batch).
    // `requests`: (text_ids, seed, max_frames) each. Returns [(codes, pcm, reached_eos)]
    // in order, each equal to what synthesize() gives that request. on_chunk(index, first_frame,
    // codes, pcm, last) runs with the GIL taken (`last`: request `index` ends with this chunk,
    // which may hold no frames); returning False ends request `index` there (stopped);
    // an exception in it cancels the call and is raised afterwards. Cancellable as synthesize().
    py::list synthesize_batch(py::list requests,
                              py::array_t<float, py::array::c_style | py::array::forcecast> speaker_embedding,
                              std::optional<py::array_t<int32_t, py::array::c_style | py::array::forcecast>> ref_codes,
                              std::optional<py::array_t<int32_t, py::array::c_style | py::array::forcecast>> ref_text_ids,
                              const std::string & language, py::dict talker_sampling, py::dict predictor_sampling,
                              int32_t max_batch, std::optional<py::function> on_chunk, std::shared_ptr<cancel_flag> flag) {
        qt_context * ctx = checked();
        if (speaker_embedding.ndim() != 1) {
            throw py::value_error("speaker_embedding must be 1-D");
        }
        const size_t n = requests.size();
        if (n == 0) {
            return py::list();
        }
        qt_voice_ref voice{};
        const qt_tts_params common = voice_params(voice, speaker_embedding, ref_codes, ref_text_ids, language,
                                                  talker_sampling, predictor_sampling);

        struct shared_state {
            std::atomic<bool> *                  context;
            cancel_flag *                        request;
            py::function                         fn;
            std::optional<py::error_already_set> error;
            std::atomic<bool>                    failed{ false };
        } shared{ &cancel_requested_, flag.get(), {}, {}, {} };
        struct per_request {
            shared_state * shared;
            int32_t        index;
        };
        cancel_requested_ = false;
        std::vector<py::array_t<int32_t, py::array::c_style | py::array::forcecast>> ids;
        std::vector<per_request> targets(n);
        std::vector<qt_tts_params> params(n, common);
        if (on_chunk) {
            shared.fn = *on_chunk;
        }
        for (size_t i = 0; i < n; ++i) {
            py::tuple r = requests[i].cast<py::tuple>();
            if (r.size() != 3) {
                throw py::value_error("each request is (text_ids, seed, max_frames)");
            }
            ids.push_back(r[0].cast<py::array_t<int32_t, py::array::c_style | py::array::forcecast>>());
            if (ids.back().ndim() != 1) {
                throw py::value_error("text_ids must be 1-D");
            }
            qt_tts_params & p = params[i];
            p.text_ids = ids.back().data();
            p.n_text_ids = int32_t(ids.back().shape(0));
            p.seed = r[1].cast<uint64_t>();
            p.max_frames = r[2].cast<int32_t>();
            targets[i] = { &shared, int32_t(i) };
            p.cancel_callback = [](void * user) {
                const auto * c = static_cast<const per_request *>(user)->shared;
                return c->failed.load() || c->context->load() || (c->request && c->request->value.load());
            };
            p.cancel_callback_user_data = &targets[i];
            if (on_chunk) {
                p.chunk_callback = [](const qt_chunk * chunk, void * user) {
                    auto * t = static_cast<per_request *>(user);
                    py::gil_scoped_acquire gil;
                    try {
                        py::array_t<int32_t> codes({ chunk->n_frames, chunk->n_codebooks }, chunk->codes);
                        py::array_t<float> pcm(chunk->n_samples, chunk->pcm);
                        py::object keep = t->shared->fn(t->index, chunk->first_frame, codes, pcm, chunk->last);
                        return keep.is_none() || keep.cast<bool>();
                    } catch (py::error_already_set & e) {
                        t->shared->error = std::move(e);
                    } catch (const std::exception & e) {
                        PyErr_SetString(PyExc_TypeError, e.what());
                        t->shared->error = py::error_already_set();
                    }
                    t->shared->failed = true;  // cancels the whole call
                    return false;
                };
                p.chunk_callback_user_data = &targets[i];
            }
        }
        std::vector<qt_tts_result> res(n);
        int status;
        {
            py::gil_scoped_release release;
            status = qt_synthesize_batch(ctx, params.data(), int32_t(n), max_batch, res.data());
        }
        if (shared.error) {
            if (status == QT_STATUS_OK) {
                for (qt_tts_result & r : res) {
                    qt_tts_result_free(&r);
                }
            }
            shared.error->restore();
            throw py::error_already_set();
        }
        if (status != QT_STATUS_OK) {
            raise_status(status, qt_last_error());
        }
        py::list out;
        for (qt_tts_result & r : res) {
            py::array_t<int32_t> codes({ r.n_frames, r.n_codebooks });
            std::memcpy(codes.mutable_data(), r.codes, sizeof(int32_t) * size_t(r.n_frames) * size_t(r.n_codebooks));
            py::array_t<float> pcm(py::ssize_t(r.n_samples));
            if (r.n_samples > 0) {
                std::memcpy(pcm.mutable_data(), r.pcm, sizeof(float) * size_t(r.n_samples));
            }
            out.append(py::make_tuple(codes, pcm, bool(r.reached_eos)));
            qt_tts_result_free(&r);
        }
        return out;
    }

    // Audio of codec codes int32 [frames, n_codebooks] (float32 [frames * samples_per_frame]).
    py::array_t<float> decode(py::array_t<int32_t, py::array::c_style | py::array::forcecast> codes,
                              int32_t chunk_frames) {
        qt_context * ctx = checked();
        if (codes.ndim() != 2) {
            throw py::value_error("codes must be a 2-D array [frames, codebooks]");
        }
        qt_audio audio;
        int status;
        {
            py::gil_scoped_release release;
            status = qt_decode(ctx, codes.data(), int32_t(codes.shape(0)), int32_t(codes.shape(1)), chunk_frames,
                               &audio);
        }
        if (status != QT_STATUS_OK) {
            raise_status(status, qt_last_error());
        }
        py::array_t<float> pcm(py::ssize_t(audio.n_samples));
        std::memcpy(pcm.mutable_data(), audio.pcm, sizeof(float) * size_t(audio.n_samples));
        qt_audio_free(&audio);
        return pcm;
    }

    void cancel() { cancel_requested_ = true; }

    void forget_prompts() { qt_forget_prompts(checked()); }

private:
    qt_context * checked() const {
        if (!ctx_) {
            throw py::value_error("the engine context is closed");
        }
        return ctx_;
    }

    qt_context *                ctx_ = nullptr;
    std::unique_ptr<log_target> log_;
    std::atomic<bool>           cancel_requested_{ false };
};

// Quantizes rows of a float32 matrix [n_rows, n_per_row] to `type` with ggml's own
// quantizer (gguf-py has none for the K-quants). Returns the raw bytes [n_rows, row_size].
py::array_t<uint8_t> quantize(py::array_t<float, py::array::c_style | py::array::forcecast> data, int type) {
    if (data.ndim() != 2) {
        throw py::value_error("quantize expects a 2-D array [rows, columns]");
    }
    const auto t = ggml_type(type);
    if (type < 0 || type >= GGML_TYPE_COUNT || ggml_blck_size(t) <= 0) {
        throw py::value_error("unknown ggml type " + std::to_string(type));
    }
    const int64_t n_rows = data.shape(0);
    const int64_t n_per_row = data.shape(1);
    if (n_per_row % ggml_blck_size(t) != 0) {
        throw py::value_error(std::string("row length ") + std::to_string(n_per_row) + " is not a multiple of " +
                              ggml_type_name(t) + "'s block size " + std::to_string(ggml_blck_size(t)));
    }
    const size_t row_size = ggml_row_size(t, n_per_row);
    py::array_t<uint8_t> out({ size_t(n_rows), row_size });
    const float * src = data.data();
    uint8_t * dst = out.mutable_data();
    {
        py::gil_scoped_release release;
        ggml_quantize_init(t);
        ggml_quantize_chunk(t, src, dst, 0, n_rows, n_per_row, nullptr);
    }
    return out;
}

} // namespace

PYBIND11_MODULE(_engine, m) {
    m.doc() = "Vocable's native Qwen3-TTS engine (C API qt_*)";

    g_engine_error = PyErr_NewExceptionWithDoc(
        "vocable._engine.EngineError",
        "An engine call failed. args = (message, status) with status a negative qt_status code.",
        PyExc_RuntimeError, nullptr);
    m.attr("EngineError") = py::handle(g_engine_error);

    m.attr("__version__") = VOCABLE_VERSION;
    m.attr("ABI_VERSION") = QT_ABI_VERSION;
    m.attr("MAX_BATCH") = QT_MAX_BATCH;
    m.attr("ABI_MIN_VERSION") = QT_ABI_MIN_VERSION;
    m.attr("STATUS_INVALID_PARAMS") = int(QT_STATUS_INVALID_PARAMS);
    m.attr("STATUS_INVALID_MODE") = int(QT_STATUS_INVALID_MODE);
    m.attr("STATUS_FAILED") = int(QT_STATUS_FAILED);
    m.attr("STATUS_OUT_OF_MEMORY") = int(QT_STATUS_OUT_OF_MEMORY);
    m.attr("STATUS_CANCELLED") = int(QT_STATUS_CANCELLED);
    m.attr("DEFAULT_CODEC_CHUNK_SEC") = QT_DEFAULT_CODEC_CHUNK_SEC;

    m.def("version", &qt_version, "The engine's version (qt_version()).");
    m.def("abi_version", &qt_abi_version);
    m.def("abi_min_version", &qt_abi_min_version);
    m.def("ggml_version", &ggml_version, "The version of the ggml library in use.");
    m.def("system_info", [] { return utf8_text(qt_system_info()); },
          "The CPU backend in use: ggml's variant for this processor, the instruction sets it uses, the "
          "engine's kernels and every variant found (qt_system_info()).");
    m.def("devices", [] {
              const int32_t n = qt_device_count();
              if (n < 0) {
                  raise_status(QT_STATUS_FAILED, qt_last_error());
              }
              py::list out;
              for (int32_t i = 0; i < n; ++i) {
                  qt_device_info d{};
                  const qt_status status = qt_get_device(i, &d);
                  if (status != QT_STATUS_OK) {
                      raise_status(status, qt_last_error());
                  }
                  py::dict item;
                  item["id"] = utf8_text(d.id);
                  item["description"] = utf8_text(d.description);
                  item["kind"] = utf8_text(d.kind);
                  item["memory_total"] = d.memory_total;
                  item["memory_free"] = d.memory_free;
                  out.append(item);
              }
              return out;
          },
          "The devices found, the CPU first: dicts of id ('cpu', 'vulkan:0'), description, kind ('cpu', 'gpu', "
          "'igpu', 'accel'), memory_total and memory_free in bytes (qt_device_count(), qt_get_device()).");
    m.def("device_notes", [] { return utf8_text(qt_device_notes()); },
          "Why a device backend shipped with the engine gave no device, one line each (qt_device_notes()).");
    m.def("voice_ref_min_samples", &qt_voice_ref_min_samples);
    m.def("voice_ref_max_samples", &qt_voice_ref_max_samples);
    m.def("quantize", &quantize, py::arg("data"), py::arg("type"));

    py::class_<cancel_flag, std::shared_ptr<cancel_flag>>(m, "CancelFlag",
                                                          "A cancel request for one synthesize() call.")
        .def(py::init<>())
        .def("set", [](cancel_flag & f) { f.value = true; })
        .def("is_set", [](const cancel_flag & f) { return f.value.load(); });

    py::class_<engine_context>(m, "Context")
        .def(py::init<const std::string &, int, const std::optional<std::string> &, std::optional<py::function>,
                      float, bool, const std::string &>(),
             py::arg("model_path"), py::arg("n_threads") = 0, py::arg("dump_dir") = py::none(),
             py::arg("log_callback") = py::none(), py::arg("codec_chunk_sec") = 0.0f, py::arg("share_cores") = true,
             py::arg("device") = "cpu")
        .def("device", &engine_context::device,
             "(where the talker and the code predictor run: 'cpu' or a device id, why the device asked for is "
             "not in use or '') (qt_device_in_use(), qt_device_fallback()).")
        .def("close", &engine_context::close)
        .def("model_info", &engine_context::model_info)
        .def("extract_voice_ref", &engine_context::extract_voice_ref, py::arg("pcm"))
        .def("synthesize", &engine_context::synthesize, py::arg("text_ids"), py::arg("speaker_embedding"),
             py::arg("ref_codes") = py::none(), py::arg("ref_text_ids") = py::none(), py::arg("language") = "auto",
             py::arg("talker_sampling") = py::dict(), py::arg("predictor_sampling") = py::dict(), py::arg("seed") = 0,
             py::arg("max_frames") = 0, py::arg("on_chunk") = py::none(), py::arg("cancel_flag") = py::none())
        .def("synthesize_batch", &engine_context::synthesize_batch, py::arg("requests"), py::arg("speaker_embedding"),
             py::arg("ref_codes") = py::none(), py::arg("ref_text_ids") = py::none(), py::arg("language") = "auto",
             py::arg("talker_sampling") = py::dict(), py::arg("predictor_sampling") = py::dict(),
             py::arg("max_batch") = 4, py::arg("on_chunk") = py::none(), py::arg("cancel_flag") = py::none())
        .def("decode", &engine_context::decode, py::arg("codes"), py::arg("chunk_frames") = 0)
        .def("cancel", &engine_context::cancel, "Asks a running synthesize() or synthesize_batch() on another thread "
                                                "to stop.")
        .def("forget_prompts", &engine_context::forget_prompts, "Drops the cached talker prefills.");
    m.def("default_max_frames", &qt_default_max_frames, py::arg("n_text_ids"));
}
