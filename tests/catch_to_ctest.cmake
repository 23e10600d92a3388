# Run by ctest (script mode) through the include file that titan_register_catch_tests writes:
# lists the test cases of one Catch2 executable (`--list-tests-for-ctest`, tests/catch_main.cpp)
# and registers each as its own ctest entry "<executable>: <case>", labelled from its tags:
#   cuda  [cuda]   needs a CUDA device; reported Skipped without one (SKIP_RETURN_CODE 77)
#   dist  [dist]   starts several processes; PROCESSORS 2, so `ctest -j2` runs it alone
#   slow  [slow]   single-process but long (whole training runs)
#   unit  anything else
# COST orders a fresh build's first `ctest -j2` (later runs use ctest's measured times): slow
# single-process cases first, so the longest one overlaps the many short ones instead of
# leaving a slot idle while the [dist] cases wait for both.
# The list is cached next to the include file and redone when the executable or this script is
# newer.
#
# In: TEST_TARGET, TEST_EXECUTABLE, TEST_LIST_FILE, TEST_ENVIRONMENT (a ;-list of NAME=VALUE).
if(NOT EXISTS "${TEST_EXECUTABLE}")
  add_test("${TEST_TARGET}_NOT_BUILT" "${TEST_TARGET}_NOT_BUILT")
  return()
endif()

if(NOT EXISTS "${TEST_LIST_FILE}" OR "${TEST_EXECUTABLE}" IS_NEWER_THAN "${TEST_LIST_FILE}" OR
   "${CMAKE_CURRENT_LIST_FILE}" IS_NEWER_THAN "${TEST_LIST_FILE}")
  execute_process(COMMAND "${TEST_EXECUTABLE}" --list-tests-for-ctest
                  OUTPUT_VARIABLE listing ERROR_VARIABLE errors RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TEST_EXECUTABLE} --list-tests-for-ctest failed (${rc}):\n${errors}")
  endif()
  # ';' separates CMake list items: hide it while splitting lines (see below for such names).
  string(REPLACE ";" "<semicolon>" listing "${listing}")
  string(REPLACE "\n" ";" lines "${listing}")
  set(script "")
  foreach(line IN LISTS lines)
    if(line STREQUAL "")
      continue()
    endif()
    string(FIND "${line}" "\t" tab)
    string(SUBSTRING "${line}" 0 ${tab} name)
    math(EXPR tags_at "${tab} + 1")
    string(SUBSTRING "${line}" ${tags_at} -1 tags)
    string(TOLOWER "${tags}" tags)
    set(properties "SKIP_RETURN_CODE 77")
    if(tags MATCHES "\\[cuda\\]")
      set(label cuda)
    elseif(tags MATCHES "\\[dist\\]")
      set(label dist)
      string(APPEND properties " PROCESSORS 2 COST 2")
    elseif(tags MATCHES "\\[slow\\]")
      set(label slow)
      string(APPEND properties " COST 3")
    else()
      set(label unit)
      string(APPEND properties " COST 1")
    endif()
    # Catch2 reads ',', '[', ']' and '\' in a test spec as syntax: escape them. A name with ';'
    # (which a ctest command or property cannot hold) is selected by its part before the ';'
    # and Catch2's trailing wildcard, and named with ',' instead in ctest.
    set(spec "${name}")
    string(FIND "${spec}" "<semicolon>" semicolon)
    if(semicolon GREATER -1)
      string(SUBSTRING "${spec}" 0 ${semicolon} spec)
    endif()
    foreach(char "\\" "," "[" "]")
      string(REPLACE "${char}" "\\${char}" spec "${spec}")
    endforeach()
    if(semicolon GREATER -1)
      string(APPEND spec "*")
    endif()
    string(REPLACE "<semicolon>" "," name "${name}")
    string(APPEND script
           "add_test([==[${TEST_TARGET}: ${name}]==] \"${TEST_EXECUTABLE}\" [==[${spec}]==])\n"
           "set_tests_properties([==[${TEST_TARGET}: ${name}]==] PROPERTIES LABELS ${label} "
           "${properties} ENVIRONMENT \"${TEST_ENVIRONMENT}\")\n")
  endforeach()
  file(WRITE "${TEST_LIST_FILE}.tmp" "${script}")
  file(RENAME "${TEST_LIST_FILE}.tmp" "${TEST_LIST_FILE}")
endif()
include("${TEST_LIST_FILE}")
