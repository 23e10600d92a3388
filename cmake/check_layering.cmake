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

# Folder -> the folders its sources may include from. The most specific folder wins
# (trainer/data before trainer). apps/ and tests/ may include everything.
set(layer_folders trainer/data util model float8 parallel trainer apps)
set(allowed_util util)
set(allowed_model model util)
set(allowed_float8 float8 model util)
set(allowed_parallel parallel float8 model util)
set(allowed_trainer/data trainer model util)  # the data pipeline: no parallel/, no float8/
set(allowed_trainer trainer parallel float8 model util)
set(allowed_apps apps trainer parallel float8 model util)
# Project folders: a quoted include naming any other first component is not ours (ignored).
set(project_folders util model float8 parallel trainer apps tests cmake)

set(violations "")
set(files_checked 0)
foreach(layer IN LISTS layer_folders)
  file(GLOB_RECURSE sources RELATIVE "${TITAN_SOURCE_DIR}"
       "${TITAN_SOURCE_DIR}/${layer}/*.h" "${TITAN_SOURCE_DIR}/${layer}/*.hpp"
       "${TITAN_SOURCE_DIR}/${layer}/*.cpp" "${TITAN_SOURCE_DIR}/${layer}/*.cu"
       "${TITAN_SOURCE_DIR}/${layer}/*.cuh")
  foreach(source IN LISTS sources)
    # Each file is checked by its most specific layer only (trainer/data/x.cpp not as trainer/).
    set(owner "")
    foreach(candidate IN LISTS layer_folders)
      string(LENGTH "${candidate}/" prefix_length)
      string(SUBSTRING "${source}" 0 ${prefix_length} prefix)
      if(prefix STREQUAL "${candidate}/")
        set(owner "${candidate}")
        break()
      endif()
    endforeach()
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
      string(REGEX REPLACE "/.*$" "" folder "${header}")
      if(NOT folder IN_LIST project_folders)
        continue()
      endif()
      if(header MATCHES "^trainer/data/")
        set(folder trainer/data)
      endif()
      set(ok FALSE)
      foreach(allowed IN LISTS allowed_${layer})
        # Allowing trainer/ allows trainer/data/ too.
        if(folder STREQUAL allowed OR folder MATCHES "^${allowed}/")
          set(ok TRUE)
        endif()
      endforeach()
      if(NOT ok)
        string(REPLACE ";" "/, " allowed_text "${allowed_${layer}}")
        list(APPEND violations
             "${source} includes ${header}: ${layer}/ may include only ${allowed_text}/")
      endif()
    endforeach()
  endforeach()
endforeach()

if(files_checked EQUAL 0)
  message(FATAL_ERROR "check_layering: no sources found under ${TITAN_SOURCE_DIR}")
endif()
if(violations)
  list(LENGTH violations count)
  string(REPLACE ";" "\n  " text "${violations}")
  message(FATAL_ERROR "layering: ${count} include(s) break the folder layering "
                      "(docs/architecture.md):\n  ${text}")
endif()
message(STATUS "layering: ${files_checked} files follow the folder layering")
