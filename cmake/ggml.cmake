# ggml, built from source: the libggml-python sdist from PyPI, pinned by version and sha256,
# fetched with pip, patched (ggml-sharing-barrier.cmake), and built once per machine into a
# cache shared by every build of the project (the wheel, the C/C++ tests, the bundle):
# $VOCABLE_GGML_CACHE, else $XDG_CACHE_HOME/vocable/ggml, else ~/.cache/vocable/ggml.
#
# The CPU backend is built as loadable variants (GGML_BACKEND_DL, GGML_CPU_ALL_VARIANTS): the
# engine picks the best one the processor can run when it starts (native/src/backend-loader.cpp),
# so one build serves an AVX2-only machine and an AVX512/VNNI/BF16/AMX one alike. On x86-64 these
# are ggml's 14, from x64 (SSE2) through haswell (AVX2), skylakex (AVX512), icelake (+VNNI), zen4
# (+BF16) and sapphirerapids (+AMX); libggml depends on all of them, so all are built (about five
# minutes on two cores, once per machine).
#
# VOCABLE_VULKAN (AUTO, ON or OFF) adds ggml's Vulkan backend, a loadable module beside the CPU
# variants (libggml-vulkan.so) that the engine loads where a Vulkan loader and device exist. AUTO
# builds it when glslc, the Vulkan headers and SPIRV-Headers are installed (Debian: glslc
# libvulkan-dev spirv-headers; tools/system-packages.sh installs them); it adds about four
# minutes on two cores.
#
# VOCABLE_CUDA (ON or OFF, default OFF) adds ggml's CUDA backend the same way (libggml-cuda.so),
# with CUDA graphs on: the engine reuses static step graphs, which CUDA graphs replay without
# per-kernel launch overhead. It needs the CUDA toolkit (nvcc); CMAKE_CUDA_ARCHITECTURES picks the
# GPUs (ggml's default list otherwise). VOCABLE_METAL (ON or OFF, default OFF; Apple only) adds
# the Metal backend with its shaders embedded.
#
# Defines ggml::ggml and ggml::ggml-base (imported), VOCABLE_GGML_LIB_DIR (the libraries, the CPU
# variants and the device backends), VOCABLE_GGML_RUNTIME_FILES (what a package ships),
# VOCABLE_GGML_BACKENDS (the device backends built: vulkan, cuda, metal) and VOCABLE_GGML_LICENSE.

set(VOCABLE_GGML_SDIST_VERSION 0.20.2.post1)
set(VOCABLE_GGML_SDIST_SHA256 e47ff53506342959ffb3ce15380b82828fea10ec5f208f9ef6915895f1a7a176)
set(VOCABLE_GGML_OPTIONS
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON
    -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF)

set(VOCABLE_VULKAN AUTO CACHE STRING "build ggml's Vulkan backend: AUTO (where its build tools are), ON or OFF")
set_property(CACHE VOCABLE_VULKAN PROPERTY STRINGS AUTO ON OFF)
set(VOCABLE_GGML_BACKENDS "")
if(NOT VOCABLE_VULKAN STREQUAL "OFF")
    find_program(_vocable_glslc glslc)
    find_package(Vulkan QUIET)
    find_package(SPIRV-Headers QUIET CONFIG)
    if(_vocable_glslc AND Vulkan_FOUND AND SPIRV-Headers_FOUND)
        list(APPEND VOCABLE_GGML_BACKENDS vulkan)
        list(APPEND VOCABLE_GGML_OPTIONS -DGGML_VULKAN=ON)
    elseif(VOCABLE_VULKAN STREQUAL "ON")
        message(FATAL_ERROR "VOCABLE_VULKAN=ON needs glslc, the Vulkan headers and SPIRV-Headers "
                            "(Debian: apt-get install glslc libvulkan-dev spirv-headers)")
    else()
        message(STATUS "ggml: no Vulkan backend (glslc, the Vulkan headers or SPIRV-Headers are missing)")
    endif()
endif()

option(VOCABLE_CUDA "build ggml's CUDA backend (needs the CUDA toolkit)" OFF)
if(VOCABLE_CUDA)
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
        message(FATAL_ERROR "VOCABLE_CUDA=ON needs the CUDA toolkit's nvcc (on PATH, or CMAKE_CUDA_COMPILER)")
    endif()
    list(APPEND VOCABLE_GGML_BACKENDS cuda)
    list(APPEND VOCABLE_GGML_OPTIONS -DGGML_CUDA=ON -DGGML_CUDA_GRAPHS=ON
                                     "-DCMAKE_CUDA_COMPILER=${CMAKE_CUDA_COMPILER}")
    if(CMAKE_CUDA_ARCHITECTURES)
        list(APPEND VOCABLE_GGML_OPTIONS "-DCMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}")
    endif()
endif()
option(VOCABLE_METAL "build ggml's Metal backend (Apple only)" OFF)
if(VOCABLE_METAL)
    if(NOT APPLE)
        message(FATAL_ERROR "VOCABLE_METAL=ON builds on Apple systems only")
    endif()
    list(APPEND VOCABLE_GGML_BACKENDS metal)
    list(APPEND VOCABLE_GGML_OPTIONS -DGGML_METAL=ON -DGGML_METAL_EMBED_LIBRARY=ON)
endif()

if(DEFINED ENV{VOCABLE_GGML_CACHE})
    set(_ggml_cache "$ENV{VOCABLE_GGML_CACHE}")
elseif(DEFINED ENV{XDG_CACHE_HOME})
    set(_ggml_cache "$ENV{XDG_CACHE_HOME}/vocable/ggml")
else()
    set(_ggml_cache "$ENV{HOME}/.cache/vocable/ggml")
endif()

# The compilers ggml is built with: the project's, unless a build with another compiler (the
# clang fuzz build) keeps ggml on the default one and so shares its cached build.
set(VOCABLE_GGML_C_COMPILER "${CMAKE_C_COMPILER}" CACHE FILEPATH "C compiler for ggml")
set(VOCABLE_GGML_CXX_COMPILER "${CMAKE_CXX_COMPILER}" CACHE FILEPATH "C++ compiler for ggml")
if(VOCABLE_GGML_CXX_COMPILER STREQUAL CMAKE_CXX_COMPILER)
    set(_ggml_compiler "${CMAKE_CXX_COMPILER_ID};${CMAKE_CXX_COMPILER_VERSION}")
else()
    execute_process(COMMAND "${VOCABLE_GGML_CXX_COMPILER}" --version OUTPUT_VARIABLE _ggml_banner)
    execute_process(COMMAND "${VOCABLE_GGML_CXX_COMPILER}" -dumpfullversion OUTPUT_VARIABLE _ggml_version
                    OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(_ggml_banner MATCHES "clang")
        set(_ggml_compiler "Clang;${_ggml_version}")
    else()
        set(_ggml_compiler "GNU;${_ggml_version}")
    endif()
endif()

file(READ "${CMAKE_CURRENT_LIST_DIR}/ggml-sharing-barrier.cmake" _ggml_patch)
file(READ "${CMAKE_CURRENT_LIST_DIR}/ggml-vulkan-headers.cmake" _ggml_vulkan_patch)
string(APPEND _ggml_patch "${_ggml_vulkan_patch}")
string(SHA256 _ggml_key "${VOCABLE_GGML_SDIST_SHA256};${VOCABLE_GGML_OPTIONS};${_ggml_patch};${_ggml_compiler};${CMAKE_SYSTEM_PROCESSOR}")
string(SUBSTRING "${_ggml_key}" 0 16 _ggml_key)
set(_ggml_prefix "${_ggml_cache}/${VOCABLE_GGML_SDIST_VERSION}-${_ggml_key}")

function(_vocable_ggml_run what)
    execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "ggml: ${what} failed (${rc}):\n${out}")
    endif()
endfunction()

function(_vocable_build_ggml prefix)
    set(sdist_dir "${_ggml_cache}/sdist")
    set(sdist "${sdist_dir}/libggml_python-${VOCABLE_GGML_SDIST_VERSION}.tar.gz")
    if(EXISTS "${sdist}")
        file(SHA256 "${sdist}" sha)
    endif()
    if(NOT sha STREQUAL VOCABLE_GGML_SDIST_SHA256)
        message(STATUS "ggml: downloading the libggml-python ${VOCABLE_GGML_SDIST_VERSION} sdist")
        file(REMOVE "${sdist}")
        _vocable_ggml_run("pip download" "${Python_EXECUTABLE}" -m pip download --quiet --no-deps
                          --no-binary libggml-python "libggml-python==${VOCABLE_GGML_SDIST_VERSION}" -d "${sdist_dir}")
        file(SHA256 "${sdist}" sha)
        if(NOT sha STREQUAL VOCABLE_GGML_SDIST_SHA256)
            file(REMOVE "${sdist}")
            message(FATAL_ERROR "ggml: the sdist's sha256 is ${sha}, expected ${VOCABLE_GGML_SDIST_SHA256}")
        endif()
    endif()

    set(work "${prefix}.work")
    file(REMOVE_RECURSE "${work}")
    file(ARCHIVE_EXTRACT INPUT "${sdist}" DESTINATION "${work}")
    set(src "${work}/libggml_python-${VOCABLE_GGML_SDIST_VERSION}/ggml")
    _vocable_ggml_run("patch" "${CMAKE_COMMAND}" -DGGML_SOURCE=${src} -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/ggml-sharing-barrier.cmake")
    if("vulkan" IN_LIST VOCABLE_GGML_BACKENDS)
        _vocable_ggml_run("patch" "${CMAKE_COMMAND}" -DGGML_SOURCE=${src}
                          -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/ggml-vulkan-headers.cmake")
    endif()

    cmake_host_system_information(RESULT jobs QUERY NUMBER_OF_LOGICAL_CORES)
    string(TIMESTAMP t0 "%s")
    message(STATUS "ggml: building it once into ${prefix} (about five minutes on two cores)")
    set(generator -G "${CMAKE_GENERATOR}")
    if(CMAKE_MAKE_PROGRAM)
        list(APPEND generator "-DCMAKE_MAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}")
    endif()
    _vocable_ggml_run("configure" "${CMAKE_COMMAND}" -S "${src}" -B "${work}/build" ${generator}
                      "-DCMAKE_C_COMPILER=${VOCABLE_GGML_C_COMPILER}" "-DCMAKE_CXX_COMPILER=${VOCABLE_GGML_CXX_COMPILER}"
                      ${VOCABLE_GGML_OPTIONS})
    _vocable_ggml_run("build" "${CMAKE_COMMAND}" --build "${work}/build" --parallel ${jobs})
    string(TIMESTAMP t1 "%s")
    math(EXPR secs "${t1} - ${t0}")
    message(STATUS "ggml: built in ${secs} s")

    set(stage "${prefix}.stage")
    file(REMOVE_RECURSE "${stage}")
    file(GLOB libs "${work}/build/bin/libggml*.so*" "${work}/build/src/libggml*.so*")
    file(COPY ${libs} DESTINATION "${stage}/lib")
    file(COPY "${src}/include/" DESTINATION "${stage}/include")
    file(COPY "${src}/LICENSE" DESTINATION "${stage}")
    file(REMOVE_RECURSE "${prefix}" "${work}")
    file(RENAME "${stage}" "${prefix}")
endfunction()

if(NOT EXISTS "${_ggml_prefix}/lib/libggml.so.0")
    file(MAKE_DIRECTORY "${_ggml_cache}")
    file(LOCK "${_ggml_cache}/${_ggml_key}.lock" GUARD FILE TIMEOUT 3600)
    if(NOT EXISTS "${_ggml_prefix}/lib/libggml.so.0")
        _vocable_build_ggml("${_ggml_prefix}")
    endif()
    file(LOCK "${_ggml_cache}/${_ggml_key}.lock" RELEASE)
endif()
message(STATUS "ggml: ${_ggml_prefix}")

set(VOCABLE_GGML_LIB_DIR "${_ggml_prefix}/lib")
set(VOCABLE_GGML_LICENSE "${_ggml_prefix}/LICENSE")
foreach(name ggml-base ggml)
    file(REAL_PATH "${VOCABLE_GGML_LIB_DIR}/lib${name}.so.0" real)
    add_library(ggml::${name} SHARED IMPORTED)
    set_target_properties(ggml::${name} PROPERTIES IMPORTED_LOCATION "${real}" IMPORTED_SONAME "lib${name}.so.0"
                          INTERFACE_INCLUDE_DIRECTORIES "${_ggml_prefix}/include")
endforeach()
set_target_properties(ggml::ggml PROPERTIES INTERFACE_LINK_LIBRARIES ggml::ggml-base)
# The runtime: the two libraries under their sonames, every CPU variant and the device backends.
set(VOCABLE_GGML_RUNTIME_FILES "")
foreach(name ggml-base ggml)
    file(REAL_PATH "${VOCABLE_GGML_LIB_DIR}/lib${name}.so.0" real)
    list(APPEND VOCABLE_GGML_RUNTIME_FILES "${real}|lib${name}.so.0")
endforeach()
file(GLOB _ggml_variants "${VOCABLE_GGML_LIB_DIR}/libggml-cpu-*.so" "${VOCABLE_GGML_LIB_DIR}/libggml-vulkan.so"
                         "${VOCABLE_GGML_LIB_DIR}/libggml-cuda.so" "${VOCABLE_GGML_LIB_DIR}/libggml-metal.so")
foreach(file IN LISTS _ggml_variants)
    get_filename_component(name "${file}" NAME)
    list(APPEND VOCABLE_GGML_RUNTIME_FILES "${file}|${name}")
endforeach()
