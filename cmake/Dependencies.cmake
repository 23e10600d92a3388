# Third-party dependencies. LibTorch comes from the pinned PyPI wheel that scripts/setup.sh
# installs into .deps/; everything else from Debian packages.
#
# LibTorch is declared as a plain imported interface rather than through find_package(Torch):
# the CPU build links only torch_cpu + c10 (no CUDA runtime needed to start), and the CUDA
# variant adds torch_cuda + c10_cuda. This keeps configure fast and independent of the CUDA
# detection logic in TorchConfig.cmake.
if(NOT TITAN_TORCH_DIR)
  set(_venv_torch "${CMAKE_SOURCE_DIR}/.deps/venv/lib/python3.11/site-packages/torch")
  if(EXISTS "${_venv_torch}/include/torch")
    set(TITAN_TORCH_DIR "${_venv_torch}" CACHE PATH "" FORCE)
  else()
    message(FATAL_ERROR "TITAN_TORCH_DIR is not set and ${_venv_torch} does not exist: run scripts/setup.sh")
  endif()
endif()
get_filename_component(TITAN_SITE_PACKAGES "${TITAN_TORCH_DIR}/.." ABSOLUTE)
set(TITAN_TORCH_RPATH "${TITAN_TORCH_DIR}/lib;${TITAN_SITE_PACKAGES}/nvidia/cu13/lib")

add_library(titan_torch INTERFACE)
target_include_directories(titan_torch SYSTEM INTERFACE
  "${TITAN_TORCH_DIR}/include" "${TITAN_TORCH_DIR}/include/torch/csrc/api/include")
target_compile_definitions(titan_torch INTERFACE USE_DISTRIBUTED USE_C10D_GLOO)
target_link_libraries(titan_torch INTERFACE
  "${TITAN_TORCH_DIR}/lib/libtorch_cpu.so" "${TITAN_TORCH_DIR}/lib/libc10.so" pthread)
if(TITAN_CUDA)
  find_package(CUDAToolkit REQUIRED)
  target_compile_definitions(titan_torch INTERFACE USE_CUDA USE_C10D_NCCL TITAN_WITH_CUDA)
  target_link_libraries(titan_torch INTERFACE
    "-Wl,--no-as-needed" "${TITAN_TORCH_DIR}/lib/libtorch_cuda.so" "-Wl,--as-needed"
    "${TITAN_TORCH_DIR}/lib/libc10_cuda.so" CUDA::cudart CUDA::cublasLt CUDA::cublas)
endif()
set(CMAKE_BUILD_RPATH "${TITAN_TORCH_RPATH}")
set(CMAKE_INSTALL_RPATH "${TITAN_TORCH_RPATH}")

find_package(PkgConfig REQUIRED)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)  # gzip-compressed datasets (c4 *.json.gz)
find_package(Catch2 REQUIRED)
