# cmake/check_layering.cmake — fails when a source includes a project header from a folder its
# own folder may not depend on (the layering of docs/architecture.md).
#
#   cmake -DTITAN_SOURCE_DIR=<repository root> -P cmake/check_layering.cmake
#
# Registered as the ctest test `layering` (label unit). Every target sees every header through
# the global include path, so the compiler cannot enforce the layering; this scan does. It reads
# each #include "folder/..." of every .h/.hpp/.cpp/.cu/.cuh under the checked folders. A quoted
# include without a folder ("x.h") is an error too: it would bypass the check.

cmake_minimum_required(VERSION 3.25)  # script mode: sets the policies (IN_LIST) as the project

if(NOT TITAN_SOURCE_DIR)
  message(FATAL_ERROR "check_layering: pass -DTITAN_SOURCE_DIR=<repository root>")
endif()

# Folder -> the folders its sources may include from, lowest room first (docs/architecture.md
# draws them). The most specific folder owns a file (trainer/config/x.h belongs to
# trainer/config, not trainer), for the includer and the included alike. apps/ and tests/ may
# include everything.
set(layer_folders util launcher data model float8
                  parallel/comm parallel/tensor_parallel parallel/context_parallel parallel/expert_parallel
                  parallel/pipeline parallel
                  trainer/optim trainer/config trainer/observe trainer/checkpoint trainer planner apps)
# parallel's rooms, lowest first: comm/ (process groups, flight recorder, mesh); the dimensions
# tensor_parallel/, context_parallel/ and expert_parallel/ on comm/; pipeline/ (schedules as data, the stage
# split, the plan, the pipeline schedule) on context_parallel/ (each micro-batch's sequence
# split); the plan at parallel/'s top on all of them. parallel/ never sees the launcher: the
# trainer hands the rendezvous to comm/ as plain values.
set(parallel_base float8 model util)
set(allowed_util util)
set(allowed_launcher launcher util)  # titan-run: plain C++, no LibTorch (checked below)
set(allowed_data data util)  # the data pipeline: no model, no parallelism, no trainer
set(allowed_model model util)
set(allowed_float8 float8 model util)
set(allowed_parallel/comm parallel/comm ${parallel_base})
set(allowed_parallel/tensor_parallel parallel/tensor_parallel parallel/comm ${parallel_base})
set(allowed_parallel/context_parallel parallel/context_parallel parallel/comm ${parallel_base})
set(allowed_parallel/expert_parallel parallel/expert_parallel parallel/comm ${parallel_base})
set(allowed_parallel/pipeline parallel/pipeline parallel/context_parallel parallel/comm ${parallel_base})
set(parallel_rooms parallel parallel/comm parallel/tensor_parallel parallel/context_parallel parallel/expert_parallel
                   parallel/pipeline)
set(allowed_parallel ${parallel_rooms} ${parallel_base})
set(allowed_trainer/optim trainer/optim util)
set(allowed_trainer/config trainer/config trainer/optim ${parallel_rooms} float8 model util)
set(allowed_trainer/observe trainer/observe trainer/config data ${parallel_rooms} float8 model util)
set(allowed_trainer/checkpoint trainer/checkpoint trainer/observe trainer/config trainer/optim data
                               ${parallel_rooms} float8 model util)
set(allowed_trainer trainer trainer/checkpoint trainer/observe trainer/config trainer/optim data
                    launcher ${parallel_rooms} float8 model util)
# The layout planner reads the config's checks, the memory estimate and the pipeline orders.
set(allowed_planner planner trainer/observe trainer/config trainer/optim data ${parallel_rooms} float8 model util)
set(allowed_apps apps planner trainer trainer/checkpoint trainer/observe trainer/config trainer/optim data
                 launcher ${parallel_rooms} float8 model util)
# Project folders: a quoted include naming any other first component is not ours (ignored).
set(project_folders util launcher data model float8 parallel trainer planner apps tests cmake fuzz)
# The trainer core: the only files allowed at the top level of trainer/ (the rest live in its
# rooms). A new file there must be added here on purpose.
set(trainer_core CMakeLists.txt build.cpp converters.cpp converters.h determinism.cpp determinism.h
                 fault_injection.cpp fault_injection.h nonfinite_step.cpp signals.cpp signals.h
                 train.cpp train.h validate.cpp validate.h)

# The layer that owns a path: the longest layer folder it lies in ("" for none).
function(owning_layer path out)
  set(owner "")
  set(owner_length 0)
  foreach(candidate IN LISTS layer_folders)
    string(LENGTH "${candidate}/" prefix_length)
    string(SUBSTRING "${path}" 0 ${prefix_length} prefix)
    if(prefix STREQUAL "${candidate}/" AND prefix_length GREATER owner_length)
      set(owner "${candidate}")
      set(owner_length ${prefix_length})
    endif()
  endforeach()
  set(${out} "${owner}" PARENT_SCOPE)
endfunction()

set(violations "")
set(files_checked 0)
foreach(layer IN LISTS layer_folders)
  file(GLOB_RECURSE sources RELATIVE "${TITAN_SOURCE_DIR}"
       "${TITAN_SOURCE_DIR}/${layer}/*.h" "${TITAN_SOURCE_DIR}/${layer}/*.hpp"
       "${TITAN_SOURCE_DIR}/${layer}/*.cpp" "${TITAN_SOURCE_DIR}/${layer}/*.cu"
       "${TITAN_SOURCE_DIR}/${layer}/*.cuh")
  foreach(source IN LISTS sources)
    # Each file is checked by its most specific layer only (trainer/config/x.cpp not as trainer/).
    owning_layer("${source}" owner)
    if(NOT owner STREQUAL layer)
      continue()
    endif()
    math(EXPR files_checked "${files_checked} + 1")
    file(STRINGS "${TITAN_SOURCE_DIR}/${source}" include_lines
         REGEX "^[ \t]*#[ \t]*include[ \t]*\"[^\"]+\"")
    foreach(line IN LISTS include_lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([^\"]+)\".*$" "\\1" header "${line}")
      if(NOT header MATCHES "/")
        list(APPEND violations
             "${source} includes \"${header}\": name project headers by their folder path")
        continue()
      endif()
      string(REGEX REPLACE "/.*$" "" first_component "${header}")
      if(NOT first_component IN_LIST project_folders)
        continue()
      endif()
      owning_layer("${header}" folder)
      if(folder STREQUAL "")
        set(folder "${first_component}")
      endif()
      set(ok FALSE)
      if(folder IN_LIST allowed_${layer})
        set(ok TRUE)
      endif()
      if(NOT ok)
        string(REPLACE ";" "/, " allowed_text "${allowed_${layer}}")
        list(APPEND violations
             "${source} includes ${header}: ${layer}/ may include only ${allowed_text}/")
      endif()
    endforeach()
  endforeach()
endforeach()

# Nothing at the top of trainer/ but the trainer core.
file(GLOB trainer_top RELATIVE "${TITAN_SOURCE_DIR}/trainer" "${TITAN_SOURCE_DIR}/trainer/*")
foreach(entry IN LISTS trainer_top)
  if(NOT IS_DIRECTORY "${TITAN_SOURCE_DIR}/trainer/${entry}" AND NOT entry IN_LIST trainer_core)
    list(APPEND violations "trainer/${entry} lies at the top of trainer/, which holds only the trainer core: move it into the room it belongs to (config/, optim/, observe/, checkpoint/) or list it in trainer_core")
  endif()
endforeach()

# The launcher room includes no LibTorch (nor c10, torch, ATen) header: titan-run must start
# without LibTorch.
file(GLOB launcher_sources RELATIVE "${TITAN_SOURCE_DIR}" "${TITAN_SOURCE_DIR}/launcher/*.h"
     "${TITAN_SOURCE_DIR}/launcher/*.cpp")
foreach(source IN LISTS launcher_sources)
  file(STRINGS "${TITAN_SOURCE_DIR}/${source}" torch_lines REGEX "^[ \t]*#[ \t]*include[ \t]*<(ATen|c10|torch|caffe2)/")
  if(torch_lines)
    list(APPEND violations "${source} includes a LibTorch header (${torch_lines}): launcher/ is plain C++ (titan-run starts without LibTorch)")
  endif()
endforeach()

# parallel/'s top level holds the plan and what it applies across dimensions; each dimension or
# layer has its own room. At most 10 source files there: a new one goes into a room.
file(GLOB parallel_top RELATIVE "${TITAN_SOURCE_DIR}/parallel" "${TITAN_SOURCE_DIR}/parallel/*.h"
     "${TITAN_SOURCE_DIR}/parallel/*.cpp")
list(LENGTH parallel_top parallel_top_count)
if(parallel_top_count GREATER 10)
  list(APPEND violations "parallel/ holds ${parallel_top_count} source files at its top (at most 10): ${parallel_top}; move a dimension's files into its room (comm/, tensor_parallel/, context_parallel/, pipeline/)")
endif()

if(files_checked EQUAL 0)
  message(FATAL_ERROR "check_layering: no sources found under ${TITAN_SOURCE_DIR}")
endif()
if(violations)
  list(LENGTH violations count)
  string(REPLACE ";" "\n  " text "${violations}")
  message(FATAL_ERROR "layering: ${count} file(s) break the folder layering "
                      "(docs/architecture.md):\n  ${text}")
endif()
message(STATUS "layering: ${files_checked} files follow the folder layering")
