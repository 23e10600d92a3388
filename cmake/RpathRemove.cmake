# cmake -DF=<ELF file> -P cmake/RpathRemove.cmake: drops the file's RPATH/RUNPATH
# (scripts/gpu_bundle.sh: bundled executables find LibTorch through LD_LIBRARY_PATH only).
if(NOT F)
  message(FATAL_ERROR "RpathRemove.cmake: pass -DF=<file>")
endif()
file(RPATH_REMOVE FILE "${F}")
