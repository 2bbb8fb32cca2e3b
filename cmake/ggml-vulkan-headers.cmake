# cmake -DGGML_SOURCE=<ggml source dir> -P ggml-vulkan-headers.cmake
#
# Lets the pinned sdist's Vulkan backend build against the Vulkan headers of Debian 12 (1.3.239):
# the instance creation passes VK_EXT_layer_settings (headers 1.3.261 and later) to turn on the
# validation layer's best-practice checks, which only a debugging build asks for. With older
# headers the instance is created without that setting. Exact-text replacement: any mismatch
# fails the build instead of building unpatched.
set(file "${GGML_SOURCE}/src/ggml-vulkan/ggml-vulkan.cpp")
file(READ "${file}" text)
if(text MATCHES "VK_HEADER_VERSION >= 261")
    return()  # already applied
endif()

set(anchor "    VkBool32 enable_best_practice = layer_settings;\n")
set(tail "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions, &layer_setting_info);\n")
string(FIND "${text}" "${anchor}" at)
string(FIND "${text}" "${tail}" end)
if(at EQUAL -1 OR end EQUAL -1 OR end LESS at)
    message(FATAL_ERROR "ggml-vulkan-headers: anchors not found in ${file}")
endif()
string(LENGTH "${tail}" tail_length)
math(EXPR block_length "${end} + ${tail_length} - ${at}")
string(SUBSTRING "${text}" ${at} ${block_length} block)
string(REPLACE "${block}"
"#if VK_HEADER_VERSION >= 261
${block}#else
    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, extensions);
#endif
" patched "${text}")
file(WRITE "${file}" "${patched}")
