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
# Note [OpenMP in titan's kernels]: at::parallel_for is a header template whose threads are an
# OpenMP parallel region (the wheel is built with AT_PARALLEL_OPENMP); a file compiled without
# -fopenmp gets the serial fallback, so titan's own kernels ran on one thread whatever
# training.num_threads said. The files that call it are compiled with -fopenmp
# (titan_openmp_sources()) and link the wheel's own libgomp, the runtime libtorch_cpu already
# loads (one soname, libgomp.so.1: one thread pool, at::set_num_threads applies to both).
if(EXISTS "${TITAN_TORCH_DIR}/lib/libgomp.so.1")
  target_link_libraries(titan_torch INTERFACE "${TITAN_TORCH_DIR}/lib/libgomp.so.1")
  set(TITAN_OPENMP_FLAG "-fopenmp")
else()
  message(WARNING "${TITAN_TORCH_DIR}/lib/libgomp.so.1 not found: titan's CPU kernels run on one thread")
  set(TITAN_OPENMP_FLAG "-DTITAN_WITHOUT_OPENMP")  # a harmless flag in the same place
endif()
if(TITAN_CUDA)
  find_package(CUDAToolkit REQUIRED)
  target_compile_definitions(titan_torch INTERFACE USE_CUDA USE_C10D_NCCL TITAN_WITH_CUDA)
  target_link_libraries(titan_torch INTERFACE
    "-Wl,--no-as-needed" "${TITAN_TORCH_DIR}/lib/libtorch_cuda.so" "-Wl,--as-needed"
    "${TITAN_TORCH_DIR}/lib/libc10_cuda.so" CUDA::cudart CUDA::cublasLt CUDA::cublas)
endif()
# Parquet datasets: the pyarrow wheel ships Arrow's and Parquet's C++ headers and shared
# libraries (only versioned names, libarrow.so.<N>00), the way the torch wheel ships LibTorch;
# scripts/setup.sh pins it. Off for the GPU bundle's build (the libraries are ~62 MB).
set(_pyarrow_dir "${TITAN_SITE_PACKAGES}/pyarrow")
file(GLOB _arrow_lib "${_pyarrow_dir}/libarrow.so.[0-9]*")
file(GLOB _parquet_lib "${_pyarrow_dir}/libparquet.so.[0-9]*")
if(EXISTS "${_pyarrow_dir}/include/parquet/arrow/reader.h" AND _arrow_lib AND _parquet_lib)
  set(_parquet_default ON)
else()
  set(_parquet_default OFF)
endif()
option(TITAN_PARQUET "Read Parquet datasets through the pyarrow wheel's C++ libraries" ${_parquet_default})
if(TITAN_PARQUET)
  if(NOT _parquet_default)
    message(FATAL_ERROR "TITAN_PARQUET=ON but ${_pyarrow_dir} has no Arrow/Parquet headers and "
                        "libraries: run scripts/setup.sh (it installs the pinned pyarrow)")
  endif()
  set(TITAN_PARQUET_INCLUDE "${_pyarrow_dir}/include")
  set(TITAN_PARQUET_LIBS ${_parquet_lib} ${_arrow_lib})
  list(APPEND TITAN_TORCH_RPATH "${_pyarrow_dir}")
endif()
message(STATUS "titan: Parquet datasets ${TITAN_PARQUET}")
set(CMAKE_BUILD_RPATH "${TITAN_TORCH_RPATH}")
set(CMAKE_INSTALL_RPATH "${TITAN_TORCH_RPATH}")

find_package(PkgConfig REQUIRED)
pkg_check_modules(TOMLPP REQUIRED IMPORTED_TARGET tomlplusplus)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
find_package(spdlog REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(ZLIB REQUIRED)  # gzip-compressed datasets (c4 *.json.gz)
if(TITAN_BUILD_TESTS)
  find_package(Catch2 REQUIRED)
endif()
