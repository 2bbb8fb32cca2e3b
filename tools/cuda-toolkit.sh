#!/usr/bin/env bash
# A CUDA toolkit for building ggml's CUDA backend (-DVOCABLE_CUDA=ON) on a machine without one,
# assembled from NVIDIA's wheels on PyPI, pinned by version and sha256: nvcc with its NVVM
# and front-end headers, the runtime, cuBLAS and CCCL. ggml links the driver library (libcuda),
# which only a GPU's driver installs: a stub with its soname stands in for the link, as the
# toolkit's own lib/stubs does, and the real one is loaded where the engine runs.
#
#     bash tools/cuda-toolkit.sh [DIR]      (default ~/.cache/vocable/cuda-13.5)
#
# then build with the lines it prints. About 1.1 GB on disk.
set -euo pipefail

dir="${1:-$HOME/.cache/vocable/cuda-13.5}"
python="${PYTHON:-python3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat > "$work/requirements.txt" <<'EOF'
nvidia-cuda-nvcc==13.5.37 --hash=sha256:f5c4f7ead5d964fb4af42bbf1e6d3ec3c1e6e9d83b53749f691d387e7fcaa3a7
nvidia-nvvm==13.5.37 --hash=sha256:c41bfa362e407405163f103c2229f0765f8cc2ed7d148b754dc77f228bf7e070
nvidia-cuda-crt==13.5.37 --hash=sha256:e898b7f73d3035fa89915a3f7bf3b54a73e90249746111aed295822c4729bb29
nvidia-cuda-runtime==13.5.37 --hash=sha256:df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d
nvidia-cublas==13.1.1.3 --hash=sha256:37936a16db8fe4ac1f065c2139360608a543a09275cb1a1af612e08cfa065436
nvidia-cuda-cccl==13.0.85 --hash=sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649
EOF
"$python" -m pip install --quiet --no-deps --require-hashes --only-binary :all: --target "$work/wheels" \
    -r "$work/requirements.txt"

rm -rf "$dir"
mkdir -p "$dir"
cp -a "$work/wheels/nvidia/cu13/." "$dir/"
# the unversioned names a link looks for, and lib64, where CMake's FindCUDAToolkit looks too
for lib in cudart cublas cublasLt; do
    target="$(cd "$dir/lib" && ls "lib$lib.so."* | head -n 1)"
    ln -sf "$target" "$dir/lib/lib$lib.so"
done
ln -sfn lib "$dir/lib64"
mkdir -p "$dir/lib/stubs"
echo 'void vocable_cuda_driver_stub(void) {}' > "$work/stub.c"
cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/lib/stubs/libcuda.so" "$work/stub.c"

"$dir/bin/nvcc" --version | tail -n 1
cat <<EOF
CUDA toolkit in $dir. Build with, for example (90: H100; see CMAKE_CUDA_ARCHITECTURES):
    export PATH=$dir/bin:\$PATH CUDAToolkit_ROOT=$dir
    cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DVOCABLE_CUDA=ON \\
          -DCMAKE_CUDA_COMPILER=$dir/bin/nvcc -DCMAKE_CUDA_ARCHITECTURES=90
EOF
